"""Notebook 02, cache reuse and optimized decode (section 9.2): the targets kvlab's loops are held
to beside the peers.

- ``GENERATE`` and ``GENERATE_COMPILED``: the names of transformers' ``generate`` with its dynamic
  cache and of its fastest batch-1 path (a static cache, the forward compiled);
- ``TARGETS``: the speed-ups, (loop, over) to the least ratio, kvlab's compiled static loop is meant
  to reach, and ``target_met``, whether a measured ratio reaches one.

Pure Python; the timings are in ``kvlab.lab.decode_peers``.
"""

from __future__ import annotations

from kvlab._checks import positive

GENERATE = "generate, dynamic cache"
GENERATE_COMPILED = "generate, static cache + compile"

# Targets the bench reports (never asserted): kvlab's optimized loop at least as fast as
# transformers' fastest batch-1 path and as kvlab's plain cached loop.
TARGETS = {("static, compiled", GENERATE_COMPILED): 1.0, ("static, compiled", "cached"): 1.0}


def target_met(value: float, target: float) -> bool:
    """Whether a measured speed-up ``value`` reaches its ``target`` (one of ``TARGETS``)."""
    return positive("value", value) >= positive("target", target)
