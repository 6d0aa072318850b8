"""kvlab.show.format, and the readings' helpers: how the book writes a number, without matplotlib."""

import subprocess
import sys

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


def test_readings_import_no_plotting_and_format_no_torch():
    """Readings never pull in matplotlib. The number formats and the readings whose models live in
    kvlab.theory import no torch either; readings decided by a model that lives in a kvlab.lab module
    (the engine's, the prefix cache's, the paging simulator's) import it, and torch with it."""
    code = ("import sys, kvlab.show.format, kvlab.show.readings.diagnosis, kvlab.show.readings.long_context; "
            "assert 'torch' not in sys.modules, sorted(sys.modules); "
            "import kvlab.show.readings.exercises, kvlab.show.readings.engine, kvlab.show.readings.prefix_caching; "
            "assert 'matplotlib' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_si_refuses_bad_digits():
    import pytest

    for digits, error in [(0, ValueError), (True, TypeError), (2.0, TypeError)]:
        with pytest.raises(error, match="digits must be an int"):
            si(1.0, "B", digits)
