"""Every notebook: timing that a reader can trust, synchronised, warm-up excluded, median of
repeats.

On a GPU each repeat is bracketed by CUDA events; on a CPU by ``time.perf_counter``. This module
depends on nothing else in ``kvlab.lab`` (``hardware.calibrate`` times with it), and imports torch
only inside the timers. ``interleaved`` times several calls round-robin, a measurement beside the
ceiling it is compared with, so that load on a shared machine changes both. ``compare_timings``,
whether two timings differ by more than their repeats' spread (notebooks 05 and 05b), decides
readings.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from kvlab import _checks
from kvlab._checks import function, integer


@dataclass(frozen=True)
class Timing:
    """Seconds per call over ``reps`` timed calls."""

    median: float
    min: float
    max: float
    times: tuple[float, ...] = field(repr=False)

    @property
    def spread(self) -> float:
        """(max - min) / median: how noisy the repeats were."""
        return (self.max - self.min) / self.median if self.median > 0 else 0.0

    @property
    def spread_above_min(self) -> float:
        """(lower quartile - min) / min: how far the faster quarter of the repeats sat above the
        fastest one. The minimum is the robust statistic a ceiling and a roofline compare, and this
        is the scatter it carries from run to run; repeats that a busy neighbour slowed, which a
        shared machine makes often, sit above the quartile and do not widen it until they are more
        than a quarter of the run."""
        if self.min <= 0:
            return 0.0
        ordered = sorted(self.times) if self.times else [self.min, self.median]
        position = (len(ordered) - 1) / 4
        low, frac = int(position), position - int(position)
        high = min(low + 1, len(ordered) - 1)
        quartile = ordered[low] + frac * (ordered[high] - ordered[low])
        return (quartile - self.min) / self.min


def measure(fn, warmup: int = 2, reps: int = 5, device=None) -> Timing:
    """Time ``fn()``: ``warmup`` untimed calls, then ``reps`` timed ones.

    ``device`` defaults to kvlab's device (the first CUDA GPU when there is one, as
    ``kvlab.devices.device()``); pass ``"cpu"`` to time host code on a GPU machine.
    """
    import torch

    function("fn", fn)
    integer("warmup", warmup, 0)
    integer("reps", reps, 1)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = _checks.device("device", device)
    cuda = dev.type == "cuda"
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    return _timing([_time_once(fn, cuda) for _ in range(reps)])


def _time_once(fn, cuda: bool) -> float:
    if cuda:
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _timing(times: list[float]) -> Timing:
    return Timing(statistics.median(times), min(times), max(times), tuple(times))


def interleaved(fns: dict, reps: int = 5, warmup: int = 1, device=None) -> dict[str, Timing]:
    """Time several calls round-robin: ``warmup`` untimed rounds, then ``reps`` rounds in each of
    which every call in ``fns`` (a dict, name to function) runs once, the starting call rotating
    from round to round. Returns a ``Timing`` per name.

    A measurement and the ceiling it is compared with (``kvlab.lab.hardware``'s probes), or two
    rivals, timed this way see the same load: a neighbour that slows the machine for a second
    slows both, and their ratio holds where two measurements taken a minute apart would not.
    """
    import torch

    if not isinstance(fns, dict) or not fns:
        raise TypeError(f"fns must be a non-empty dict of name to function, got {fns!r:.80}")
    for name, fn in fns.items():
        function(f"fns[{name!r}]", fn)
    integer("reps", reps, 1)
    integer("warmup", warmup, 0)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    cuda = _checks.device("device", device).type == "cuda"
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    if cuda:
        torch.cuda.synchronize()
    times = {name: [] for name in names}
    for r in range(reps):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name].append(_time_once(fns[name], cuda))
    return {name: _timing(times[name]) for name in names}


def merge_timings(parts) -> Timing:
    """One Timing over all the repeats of several, for measurements taken one repeat at a time
    (interleaved with a rival's, so that drift on a shared machine hits both alike)."""
    if isinstance(parts, (str, bytes)) or not hasattr(parts, "__iter__"):
        raise TypeError(f"parts must be a list of Timing, got {type(parts).__name__}")
    parts = list(parts)
    if not parts or not all(isinstance(p, Timing) for p in parts):
        raise TypeError(
            f"parts must be a non-empty list of Timing (kvlab.measure), got {parts!r:.80}"
        )
    times = tuple(t for part in parts for t in part.times)
    ordered = sorted(times)
    return Timing(ordered[len(ordered) // 2], ordered[0], ordered[-1], times)


@dataclass(frozen=True)
class Comparison:
    """Two timings side by side (notebooks 05, 05b). ``ratio`` = b's median / a's median, how many
    times as fast ``a`` was. ``outcome``: ``"faster"`` when a's slowest repeat beat b's fastest,
    ``"slower"`` when a's fastest lost to b's slowest, else ``"even"``: the repeats overlap, and a
    shared machine's noise could explain the difference of the medians."""

    ratio: float
    a: Timing
    b: Timing

    @property
    def outcome(self) -> str:
        if self.a.max < self.b.min:
            return "faster"
        if self.a.min > self.b.max:
            return "slower"
        return "even"


def compare_timings(a: Timing, b: Timing) -> Comparison:
    """Whether ``a`` was faster than ``b`` beyond the spread of their repeats (see
    :class:`Comparison`)."""
    for name, t in (("a", a), ("b", b)):
        if not all(hasattr(t, f) for f in ("median", "min", "max")):
            raise TypeError(f"{name} must be a kvlab.lab.timing.Timing, got {type(t).__name__}")
        if not t.median > 0:
            raise ValueError(f"{name}.median must be > 0 seconds, got {t.median!r}")
    return Comparison(b.median / a.median, a, b)
