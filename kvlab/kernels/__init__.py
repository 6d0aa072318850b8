"""Triton kernels for section 9.5 (PagedAttention), each beside a plain-PyTorch reference.

On a machine without CUDA the Triton interpreter is switched on before triton is
imported, so notebooks and tests run the same kernels on the CPU (slowly, and
without bf16 arithmetic).
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from .paged_attention import (  # noqa: E402  (the interpreter switch must come first)
    SUPPORTED_HEAD_DIMS,
    choose_num_splits,
    merge_partials,
    paged_decode_attention,
    paged_decode_attention_ref,
)
from .store_kv import store_kv, store_kv_ref  # noqa: E402

__all__ = [
    "SUPPORTED_HEAD_DIMS",
    "choose_num_splits",
    "merge_partials",
    "paged_decode_attention",
    "paged_decode_attention_ref",
    "store_kv",
    "store_kv_ref",
]
