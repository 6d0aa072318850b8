"""Every notebook: worked solutions of the exercises, one module per notebook (see ``folded``).

Notebooks call ``exercises.<name>(...)``; each name lives in its notebook's module here.
"""

from kvlab.show.readings.exercises.cache_reuse import cache_reuse_doubling, cache_reuse_warm
from kvlab.show.readings.exercises.decode_loop import (
    decode_loop_gqa,
    decode_loop_static,
    decode_loop_window,
)
from kvlab.show.readings.exercises.diagnosis import (
    diagnosis_batch,
    diagnosis_gqa,
    diagnosis_naive_ridge,
)
from kvlab.show.readings.exercises.engine import engine_half_pool, engine_swap
from kvlab.show.readings.exercises.folded import GLOSSARY, count, solution
from kvlab.show.readings.exercises.gemv import (
    gemv_attention_ridge,
    gemv_big_product,
    gemv_h200_batch,
)
from kvlab.show.readings.exercises.kv_layout import kv_layout_batch, kv_layout_block1, kv_layout_cat
from kvlab.show.readings.exercises.long_context import (
    long_context_conventions,
    long_context_kivi_bytes,
    long_context_onset,
    long_context_outliers,
    long_context_sinks,
)
from kvlab.show.readings.exercises.memory_wall import wall_288, wall_fixed_point, wall_joint
from kvlab.show.readings.exercises.paged_attention import (
    paged_block_size,
    paged_fork_append,
    paged_swap_steps,
)
from kvlab.show.readings.exercises.paged_kernel import (
    paged_kernel_empty_split,
    paged_kernel_rows,
    paged_kernel_splits,
)
from kvlab.show.readings.exercises.prefix_caching import (
    prefix_ninety,
    prefix_system_prompts,
    prefix_whole_blocks,
)
from kvlab.show.readings.exercises.speculative import (
    speculative_best_k_gpu,
    speculative_best_k_here,
)
from kvlab.show.readings.exercises.ssm_state import (
    ssm_breakeven,
    ssm_full_rank,
    ssm_hybrid_fraction,
    ssm_narrow_scan,
)

__all__ = [
    "GLOSSARY",
    "count",
    "solution",
    "cache_reuse_doubling",
    "cache_reuse_warm",
    "decode_loop_gqa",
    "decode_loop_window",
    "decode_loop_static",
    "diagnosis_batch",
    "diagnosis_gqa",
    "diagnosis_naive_ridge",
    "engine_half_pool",
    "engine_swap",
    "long_context_sinks",
    "gemv_big_product",
    "gemv_h200_batch",
    "gemv_attention_ridge",
    "kv_layout_batch",
    "kv_layout_block1",
    "kv_layout_cat",
    "long_context_onset",
    "long_context_outliers",
    "long_context_kivi_bytes",
    "long_context_conventions",
    "wall_fixed_point",
    "wall_288",
    "wall_joint",
    "paged_block_size",
    "paged_fork_append",
    "paged_swap_steps",
    "paged_kernel_rows",
    "paged_kernel_splits",
    "paged_kernel_empty_split",
    "prefix_whole_blocks",
    "prefix_system_prompts",
    "prefix_ninety",
    "speculative_best_k_here",
    "speculative_best_k_gpu",
    "ssm_breakeven",
    "ssm_narrow_scan",
    "ssm_hybrid_fraction",
    "ssm_full_rank",
]
