"""The recorded-measurements page (book/measurements.md): every committed record as a column."""

import json
from pathlib import Path

from kvlab.lab.bench import load_records, records_markdown

ROOT = Path(__file__).resolve().parents[1]


def _record(device, date, rows):
    return {
        "stamp": {
            "device": device,
            "driver": "d",
            "torch": "t",
            "triton": "x",
            "transformers": "y",
            "date": date,
        },
        "calibration": {
            "copy_bytes_per_s": 2e12,
            "matmul_flops": 5e14,
            "matmul_dtype": "bfloat16",
            "device": device,
        },
        "results": {
            "9.5 paged": [{"name": n, "value": v, "unit": "GB/s", "note": ""} for n, v in rows]
        },
    }


def test_records_stand_side_by_side_gpu_first():
    cpu = _record("CPU: AMD EPYC (2 logical cores)", "2026-12-01", [("paged", 3.0)])
    gpu = _record("NVIDIA H200", "2026-12-02", [("paged", 3000.0), ("split", 1.5)])
    text = records_markdown([cpu, gpu])
    assert text.index("NVIDIA H200") < text.index("AMD EPYC")  # run 1 is the GPU
    assert "| paged | 3000 | 3 | GB/s |" in text
    assert "| split | 1.5 | – | GB/s |" in text  # a row the CPU run lacks
    assert "No GPU run" not in text
    assert "No GPU run has been recorded yet" in records_markdown([cpu])
    assert records_markdown([]) == "No run has been recorded yet."
    assert "**Chapter 5: paged**" in text  # the record's section 9.5 is the book's chapter 5


def test_chapter_headings_follow_the_book():
    from kvlab.lab.bench import chapter_heading

    assert chapter_heading("9.6 SSM state and scans") == "Chapter 7: SSM state and scans"
    assert chapter_heading("prefix caching") == "Chapter 6: prefix caching"
    assert chapter_heading("12 decode across devices") == "Chapter 12: decode across devices"
    assert chapter_heading("something new") == "something new"


def test_each_row_says_what_it_measures():
    cpu = _record("CPU: AMD EPYC (2 logical cores)", "2026-12-01", [("paged", 3.0)])
    cpu["results"]["9.5 paged"][0]["note"] = "batch 4, context 512 | gather path"
    assert "| paged | 3 | GB/s | batch 4, context 512 \\| gather path |" in records_markdown([cpu])


def test_committed_records_load_and_render(tmp_path):
    records = load_records(ROOT / "book" / "data" / "measurements")
    assert all({"stamp", "calibration", "results"} <= set(r) for r in records)
    records_markdown(records)  # renders whatever is committed
    (tmp_path / "a.json").write_text(json.dumps(_record("NVIDIA T4", "2026-01-01", [("x", 1.0)])))
    assert load_records(tmp_path)[0]["stamp"]["device"] == "NVIDIA T4"
