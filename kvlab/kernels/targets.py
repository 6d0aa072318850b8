"""Notebooks 05b and 07: every kvlab Triton kernel, compiled ahead of time for each GPU generation.

``python -m kvlab.kernels.targets JSON`` compiles each requested configuration (``kernel``,
``dtype``, ``capability`` and the kernel's sizes) for its target without a GPU and prints the shared
memory one program needs, as JSON; the test suite runs it for sm_75, sm_80 and sm_90 and checks each
figure against the limits of :mod:`kvlab.kernels.shared_memory`. Run it with ``TRITON_INTERPRET=0``.
"""

from __future__ import annotations

import json
import sys

import torch

from kvlab.kernels import configs, paged_attention, paged_prefill, ssm_scan, store
from kvlab.kernels.shared_memory import DTYPES, KernelConfig, compiled_shared_memory


def config(name: str, dtype: torch.dtype, **sizes) -> KernelConfig:
    """One kernel at one size, as its wrapper launches it."""
    block_size = sizes.get("block_size", 16)
    if name == "attend_split":
        kernel = paged_attention.attend_split_kernel
        return configs.attend_split_config(
            kernel, dtype, sizes["group"], sizes["head_dim"], block_size
        )
    if name == "merge_splits":
        kernel = paged_attention.merge_splits_kernel
        return configs.merge_splits_config(kernel, dtype, sizes["head_dim"], sizes["num_splits"])
    if name == "store_kv":
        return configs.store_kv_config(store.store_kv_kernel, dtype, sizes["head_dim"], block_size)
    if name == "ssm_update":
        return ssm_scan.ssm_update_config(dtype, sizes["state"])
    if name == "paged_prefill":
        kernel = paged_prefill.paged_prefill_kernel
        return configs.paged_prefill_config(
            kernel, dtype, sizes["group"], sizes["head_dim"], block_size
        )
    raise ValueError(f"unknown kernel {name!r}")


def _main(argv) -> int:
    """Shared memory of each requested configuration, as JSON on stdout."""
    results = []
    for request in json.loads(argv[0]):
        dtype = getattr(torch, request.pop("dtype"))
        name, capability = request.pop("kernel"), request.pop("capability")
        shared = compiled_shared_memory(config(name, dtype, **request), capability)
        results.append(
            dict(request, kernel=name, dtype=DTYPES[dtype], capability=capability, shared=shared)
        )
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
