"""kvlab.show.format, and the readings' helpers: how the book writes a number, without matplotlib."""

import subprocess
import sys
from pathlib import Path

from kvlab.show.format import sci, si, sig
from kvlab.show.readings import ratio_text, within


def test_helpers():
    assert within(1.0, 1.2, 1.25) and not within(1.0, 2.0, 1.25) and not within(0.0, 1.0, 2)
    assert ratio_text(2.1, 1.0) == "2.1 times" and ratio_text(45.0, 1.0) == "45 times"
    assert sci(3.13e8) == r"$3.13 \times 10^{8}$" and sci(655_000) == "655,000" and sci(12.5) == "12.5"


def test_si_prefixes():
    assert si(3.35e12, "B/s") == "3.35 TB/s" and si(0.0051, "s") == "5.1 ms" and si(2.5e-6, "s") == "2.5 µs"
    assert si(999.96e9, "B/s") == "1 TB/s" and si(5400.0, "s") == "5,400 s" and si(0.0, "B") == "0 B"
    assert sig(3.14159) == "3.14"


# The readings that import torch: each takes a model from kvlab.lab.paged_attention or kvlab.lab.paged_kernel
# (compare_timings, the kernel's rounding tolerance). Every other reading, and the number formats, import none.
TORCH_READINGS = ("kvlab.show.readings.paged_attention", "kvlab.show.readings.paged_kernel",
                  "kvlab.show.readings.preemption")


def reading_modules() -> list[str]:
    root = Path(__file__).resolve().parents[2]
    files = sorted((root / "kvlab" / "show" / "readings").rglob("*.py"))
    return [".".join(f.relative_to(root).with_suffix("").parts).removesuffix(".__init__") for f in files]


def test_readings_import_no_plotting_and_format_no_torch():
    """Readings never pull in matplotlib. The number formats and every reading but TORCH_READINGS import no
    torch either: their models live in kvlab.theory. Each of TORCH_READINGS does import it (else it belongs
    with the others)."""
    free = [m for m in reading_modules() if m not in TORCH_READINGS]
    assert len(free) > len(TORCH_READINGS) and set(TORCH_READINGS) <= set(reading_modules())
    code = (f"import importlib, sys, kvlab.show.format; [importlib.import_module(m) for m in {free!r}]; "
            "assert 'torch' not in sys.modules, [m for m in sys.modules if m.startswith('kvlab')]; "
            f"[importlib.import_module(m) for m in {TORCH_READINGS!r}]; "
            "assert 'matplotlib' not in sys.modules")
    runs = [subprocess.Popen([sys.executable, "-c", code])]
    runs += [subprocess.Popen([sys.executable, "-c", f"import sys, {m}; assert 'torch' in sys.modules, '{m}'"])
             for m in TORCH_READINGS]
    assert [run.wait() for run in runs] == [0] * len(runs)


def test_si_refuses_bad_digits():
    import pytest

    for digits, error in [(0, ValueError), (True, TypeError), (2.0, TypeError)]:
        with pytest.raises(error, match="digits must be an int"):
            si(1.0, "B", digits)
