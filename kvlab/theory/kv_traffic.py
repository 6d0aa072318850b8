"""Notebook 04, KV-cache layout (section 9.4): how a measured read or append is held against its
bytes.

The page predicts every time from the bytes it moves: attention's read of K and V at the read
bandwidth, every copy (reads plus writes) at the copy rate, both measured by ``kvlab.calibrate()``
(``kvlab.lab.layout_timing`` counts them: ``read_traffic``, ``append_traffic``, ``predicted_s``).
Its readings decide with the two functions here:

- ``compare_with_bytes``: a time, or a ratio of times, against the bytes model's, judged by
  ``agreement.compare`` with the spread measured in the same run;
- ``cache_resident``: whether a read's bytes fit, with room to spare, in the device's largest
  hardware cache (``kvlab.lab.layout_timing.last_level_cache_bytes``), the likely reason a read
  beats its bytes.

Pure Python.
"""

from __future__ import annotations

from kvlab._checks import positive
from kvlab.theory.agreement import Comparison, compare

# A read's working set stays in a hardware cache between repeats only if it takes at most this share
# of it: the cache also holds the query, the scores and the output, and other processes' lines.
RESIDENT_SHARE = 0.5


def compare_with_bytes(measured: float, predicted: float, spread: float) -> Comparison:
    """A measured time (or ratio of times) against the bytes model's prediction, with ``spread``
    the run-to-run scatter of the timings (and ceilings) behind it: ``agreement.compare``'s
    three outcomes. Off the model, something besides the bytes (arithmetic, fixed per-call costs,
    the hardware caches, another process) set the time."""
    return compare(measured, predicted, spread)


def cache_resident(nbytes: float, cache_bytes: int | None) -> bool:
    """Whether ``nbytes``, a read's working set, fits in a hardware cache of ``cache_bytes``: at
    most ``RESIDENT_SHARE`` of it (False when the size is unknown). Such a read can be served from
    that cache between repeats, faster than the DRAM bandwidth the calibration measured."""
    positive("nbytes", nbytes)
    return cache_bytes is not None and nbytes <= RESIDENT_SHARE * cache_bytes
