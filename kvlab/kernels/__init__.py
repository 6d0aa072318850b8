"""Notebooks 05, 05b, 06, 07 and 11: kvlab's Triton kernels, each beside a plain-PyTorch reference.

Each kernel has two entries: the mechanism, a plain name (:func:`paged_decode`, :func:`paged_extend`
for the prefill, :func:`paged_store`, the PyTorch :func:`paged_decode_gather`), launches without a
check or a host sync, as ``kvlab.serving.attention`` calls it in every layer; the checked entry
(:func:`paged_decode_attention`, :func:`paged_prefill_attention`, :func:`store_kv`, the PyTorch
twins) validates every argument at the door (``kvlab.kernels._validation``) and calls it. Without
CUDA, importing this package first switches Triton's interpreter on (:func:`use_interpreter`).
"""

from __future__ import annotations

# First: importing it switches Triton's interpreter on where there is no CUDA (kernels.interpreter).
from kvlab.kernels.interpreter import use_interpreter

# isort: split
from kvlab.kernels._validation import check_decode, check_prefill
from kvlab.kernels.paged_attention import (
    SUPPORTED_HEAD_DIMS,
    choose_num_splits,
    merge_splits,
    multiprocessor_count,
    paged_decode,
    paged_decode_attention,
    paged_decode_partials,
)
from kvlab.kernels.paged_attention_torch import (
    merge_partials,
    paged_decode_attention_gather,
    paged_decode_attention_ref,
    paged_decode_gather,
    paged_prefill_attention_ref,
    store_kv_ref,
)
from kvlab.kernels.paged_prefill import (
    paged_extend,
    paged_prefill_attention,
    plan_query_tiles,
    plan_step,
)
from kvlab.kernels.ssm_scan import selective_state_update, selective_state_update_ref
from kvlab.kernels.store import paged_store, store_kv
