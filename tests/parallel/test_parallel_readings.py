"""Readings of notebook 12 (kvlab.show.readings.devices), each outcome fed in, and the pure parts of
kvlab.lab.parallel (the line fit, what was recorded, where to run)."""

import re

import pytest

from kvlab.lab import parallel as lab
from kvlab.show.readings import devices as rd
from kvlab.theory.parallel import Crossing

KIB = 1024


def clean(text):
    assert not re.search(r"\{(glue|cite|doc|ref)", text) and "nan" not in text.lower()
    return text


def test_tensor_parallel_reading_names_what_the_plan_splits():
    on = clean(rd.tensor_parallel_reading("5.24.0", 2, 24, 1, 2, 111_000, True))
    assert (
        "**1 of the 2 KV heads**" in on
        and "1/2 of one device's cache" in on
        and "by vocabulary" in on
    )
    off = rd.tensor_parallel_reading("5.5.0", 2, 24, 1, 2, 111_000, False)
    assert "whole on every rank" in off and "5.5.0" in off


def test_link_reading_says_it_is_not_nvlink():
    t = clean(rd.link_reading("gloo", 2e9, 100e-6, (KIB, 4 * KIB * KIB), 450e9))
    assert "**2 GB/s**" in t and "**100 µs**" in t and "1 KiB to 4 MiB" in t and "225 times" in t
    assert "not measure NVLink" in t


def test_collective_reading_on_every_side():
    from kvlab.theory.agreement import edges

    sizes = (KIB, 64 * KIB, KIB * KIB)
    predicted = (1.5e-4, 2e-4, 1e-3)
    lo_d, lo_a, hi_a, hi_d = edges(1.0, 0.1)

    def text(last_ratio):
        measured = (1.5e-4, 2e-4, last_ratio * 1e-3)
        return clean(rd.collective_reading("all_gather", sizes, measured, predicted, (0.1,) * 3))

    good = text(1.0)
    assert "agrees at 1 KiB, 64 KiB and 1 MiB" in good and "as the model says" in good
    bad = text(1.1 * hi_d)
    assert "disagrees at 1 MiB" in bad and "the measurement above it" in bad
    assert "share the cores" in bad and "all-gather" in bad
    unsure = text((hi_a * hi_d) ** 0.5)
    assert "cannot tell" in unsure and "scatter is as wide" in unsure
    fast = text(0.9 * lo_d)
    assert "the measurement below it" in fast and "overstates a term" in fast


def test_step_reading_all_outcomes():
    from kvlab.theory.agreement import edges

    expected = 8e-3  # one process 10 ms over 2 ranks, plus 3 ms of all-reduces
    lo_d, lo_a, hi_a, hi_d = edges(expected, 0.1)

    def text(split):
        return clean(rd.step_reading(10e-3, split, expected, 2, 8, 2048, 300e-6, 80e6, 0.1))

    t = text(expected)
    assert "40 MB of the 80 MB" in t and "8 all-reduces of 2.05 kB" in t
    assert "The split paid" in t and "agrees" in t and "all the split step does" in t
    above = text(1.1 * hi_d)
    assert "did not pay" in above and "above it" in above and "does not divide" in above
    assert "cannot tell" not in above
    unsure = text((hi_a * hi_d) ** 0.5)
    assert "cannot tell" in unsure and "does not divide" in unsure
    below = text(0.9 * lo_d)
    assert "below it" in below and "caches better" in below
    assert "cannot tell" in text((lo_a * lo_d) ** 0.5)


def test_crossing_reading_covers_each_direction():
    tp = {
        "NVLink": Crossing("batch", None, True, 1, 512),
        "PCIe": Crossing("batch", 92, True, 1, 512),
        "slow": Crossing("batch", 7, False, 1, 512),
        "never": Crossing("batch", None, False, 1, 512),
    }
    cp = {
        "NVLink": Crossing("context", 46_962, False, 1, 10**6),
        "window": Crossing("context", None, False, 1, 10**6),
    }
    t = clean(rd.crossing_reading("Llama-3.2-1B", 8192, 10e-6, tp, cp, 30, 60))
    assert "pays at every batch from 1 to 512" in t and "stops paying at batch **92**" in t
    assert "starts paying at batch **7**" in t and "never pays from batch 1 to 512" in t
    assert "pays from **46,962 tokens**" in t and "never pays up to 1,000,000 tokens" in t
    assert "holds 30 such sequences" in t and "two hold 60" in t and "10 µs latency" in t
    assert "(the dotted and dash-dotted lines)" in t  # both within the axis, to batch 512
    wide = clean(rd.crossing_reading("Llama-3.2-1B", 8192, 10e-6, tp, cp, 516, 1041))
    assert "two hold 1,041:" in wide and "line" not in wide  # neither is drawn on a 512 axis
    half = clean(rd.crossing_reading("Llama-3.2-1B", 8192, 10e-6, tp, cp, 300, 1041))
    assert "two hold 1,041 (the dotted line):" in half
    none = rd.crossing_reading("Llama-3-70B", 512, 0.0, tp, cp, 0, 5)
    assert "cannot hold this model" in none and "with no latency" in none


def test_handoff_readings_both_ways():
    args = (200, 16, 2e-6, 1.3e-5)
    sends = [9e-4, 7e-4, 7.1e-4, 7.2e-4]  # the first slower; the fastest 3% under the median
    t = clean(rd.handoff_reading(851_968, 851_968.0, 852_044, sends, 7e-4, *args))
    assert "**851,968 bytes**" in t and "exactly" in t and "76 bytes" in t
    assert "Over 4 handoffs the fastest send took 700 µs (the first 900 µs)" in t
    assert "1.00 times the prediction: agrees (spread 3%)" in t
    off = rd.handoff_reading(851_968, 800_000.0, 852_044, [6e-3, 6e-3], 7e-4, *args)
    assert "the formula" in off and "not the sequence's blocks" in off
    assert "8.57 times the prediction: above it" in off


def test_handoff_verdict_on_both_sides_of_each_edge_and_in_the_band():
    from kvlab.theory.agreement import edges

    sends = [1.0, 1.05, 1.05]  # a spread of 5%: the agreement band is the floor's 10%
    low_miss, low_agree, high_agree, high_miss = edges(1.0, 0.05)
    words = {
        low_miss / 1.1: "below it",
        (low_miss * low_agree) ** 0.5: "cannot tell (below it",
        low_agree * 1.1: "agrees",
        high_agree / 1.1: "agrees",
        (high_agree * high_miss) ** 0.5: "cannot tell (above it",
        high_miss * 1.1: "above it",
    }
    for fastest, verdict in words.items():
        times = [fastest * t for t in sends]
        text = clean(rd.handoff_reading(100, 100.0, 120, times, 1.0, 8, 16, 1e-6, 1e-5))
        assert f": {verdict}" in text, (fastest, text)


def test_handoff_reading_says_what_was_not_measured():
    text = rd.handoff_reading(100, 100.0, 120, [1e-3, float("nan")], 1e-3, 8, 16, 1e-6, 1e-5)
    assert text.startswith("Not measured: sends[1] (got nan)")
    assert rd.handoff_reading(100, 100.0, 120, [], 1e-3, 8, 16, 1e-6, 1e-5).startswith(
        "Not measured: sends"
    )
    grown = rd.handoff_tables_reading(8, [3, 0, 1], [0, 1, 2, 4])
    assert "[3, 0, 1] (3 blocks)" in grown and "is 1 block longer" in grown
    same = rd.handoff_tables_reading(8, list(range(9)), list(range(9)))
    assert "[0, 1, 2, 3, 4, 5, ...] (9 blocks)" in same and "The tables are as long" in same
    assert "became" not in same and "need not match" in same


def test_recorded_reading_with_and_without_records():
    assert "No GPU run of this page has been recorded yet" in rd.recorded_reading({})
    t = rd.recorded_reading({"NVIDIA H200, 2027-01-01": [("link rate (one way)", 312.5, "GB/s")]})
    assert "**NVIDIA H200, 2027-01-01**" in t and "| link rate (one way) | 312.5 GB/s |" in t


def folded(text, number):
    assert text.startswith(f"<details>\n<summary>Solution to exercise {number}</summary>")
    return clean(text)


def test_exercise_solutions():
    t = folded(rd.exercise_heads("Llama-3-70B", 8, 64, 8, (8, 1), 327_680), 1)
    assert "**8 query heads and 1 KV head**" in t and "41 kB" in t and "328 kB" in t
    t = folded(rd.exercise_latency("Llama-3.2-1B", 8192, 177e-6, 0.3e-6, 32, 5.52e-6), 2)
    assert "**5.52 µs**" in t and "32" in t
    t = folded(
        rd.exercise_handoff(
            "Llama-3-8B", 32_000, 4.19e9, {"NVLink 4": 9.3e-3, "PCIe": 65e-3}, 1.13
        ),
        3,
    )
    assert "| NVLink 4 | 9.3 ms | 122 |" in t and "4.19 GB" in t


def test_binary_bytes():
    assert [rd.binary_bytes(n) for n in (512, KIB, 4 * KIB * KIB, 3 * 2**30)] == [
        "512 B",
        "1 KiB",
        "4 MiB",
        "3 GiB",
    ]


def test_fit_line_recovers_a_line_and_refuses_a_flat_one():
    alpha, beta = lab.fit_line([1e3, 1e5, 1e7], [1e-4 + n / 2e9 for n in (1e3, 1e5, 1e7)])
    assert alpha == pytest.approx(1e-4) and beta == pytest.approx(2e9)
    with pytest.raises(ValueError, match="do not grow"):
        lab.fit_line([1, 2, 3], [3.0, 2.0, 1.0])
    with pytest.raises(ValueError, match="at least two"):
        lab.fit_line([1], [1.0])


def test_recorded_rows_keeps_gpu_records_of_this_page():
    row = {"name": "link rate (one way)", "value": 300.0, "unit": "GB/s", "note": ""}
    records = [
        {
            "stamp": {"device": "CPU: AMD EPYC (2 logical cores)", "date": "d"},
            "results": {lab.SECTION: [row]},
        },
        {
            "stamp": {"device": "NVIDIA H200", "date": "2027-01-01"},
            "results": {"9.2 decode loops": [row]},
        },
        {"stamp": {"device": "NVIDIA H200", "date": "2027-01-02"}, "results": {lab.SECTION: [row]}},
    ]
    assert lab.recorded_rows(records) == {
        "NVIDIA H200, 2027-01-02": [("link rate (one way)", 300.0, "GB/s")]
    }


@pytest.mark.skipif(
    __import__("torch").cuda.device_count() >= 2, reason="two or more GPUs: NCCL ranks"
)
def test_ranks_here_on_a_cpu():
    assert lab.ranks_here() == (2, "cpu")
    with pytest.raises(ValueError, match="world_size"):
        lab.ranks_here(1)
