"""Triton kernels for section 9.5 (PagedAttention), each beside a plain-PyTorch reference.

On a machine without CUDA the Triton interpreter is switched on before triton is
imported, so notebooks and tests run the same kernels on the CPU (slowly, and
without bf16 arithmetic).
"""

import os
import sys

import torch


def _switch_on_interpreter() -> None:
    """Without CUDA, run Triton under its interpreter. Triton reads the switch when it is imported
    (its own ``@triton.jit`` helpers become interpretable then), so if something imported it
    earlier (``kvlab.env()`` asks for its version, transformers probes for it), drop those modules
    and let the import below load them again with the switch on."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return
    os.environ.setdefault("TRITON_INTERPRET", "1")
    if os.environ["TRITON_INTERPRET"] == "1":
        stale = [m for m in sys.modules if m == "triton" or m.startswith("triton.")]
        for name in stale:
            if not name.startswith("triton._C"):  # the compiled extension cannot be loaded twice
                del sys.modules[name]


if not torch.cuda.is_available():
    _switch_on_interpreter()

from kvlab.kernels.paged_attention import SUPPORTED_HEAD_DIMS, choose_num_splits, merge_partials, paged_decode_attention, paged_decode_attention_ref, paged_decode_launcher
from kvlab.kernels.store_kv import store_kv, store_kv_ref  # noqa: E402

__all__ = [
    "SUPPORTED_HEAD_DIMS",
    "choose_num_splits",
    "merge_partials",
    "paged_decode_attention",
    "paged_decode_attention_ref",
    "paged_decode_launcher",
    "store_kv",
    "store_kv_ref",
]

from kvlab.kernels.ssm_scan import selective_state_update, selective_state_update_ref  # noqa: E402  (section 9.6)

__all__ += ["selective_state_update", "selective_state_update_ref"]

from kvlab.kernels.paged_prefill import paged_prefill_attention, paged_prefill_attention_ref, paged_prefill_launcher, paged_prefill_work, plan_query_tiles  # noqa: E402  (notebooks 06, 11)

__all__ += ["paged_prefill_attention", "paged_prefill_attention_ref", "paged_prefill_launcher", "paged_prefill_work",
            "plan_query_tiles"]
