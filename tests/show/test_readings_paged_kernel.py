"""The readings of the paged-kernel page (notebook 05b, section 9.5): each outcome-dependent sentence
in both of its branches."""

from types import SimpleNamespace

from kvlab.show.readings import paged_kernel as r


def _timing(seconds, kv_bytes=1e6):
    return SimpleNamespace(paged=SimpleNamespace(median=seconds), kv_bytes=kv_bytes,
                           paged_bytes_per_s=kv_bytes / seconds)


def test_source_block_is_a_python_code_block():
    assert r.source_block("def f():\n    pass\n") == "```python\ndef f():\n    pass\n```"


def test_padding_table_gives_the_useful_fraction():
    text = r.padding_reading({4: 16, 32: 32})
    assert "| 4 | 16 | 25% |" in text and "| 32 | 32 | 100% |" in text


def test_programs_reading_both_ways():
    idle = r.programs_reading(1, 8, 132, 33, "an H100")
    assert "8 programs" in idle and "124 multiprocessors idle" in idle and "264 programs" in idle
    busy = r.programs_reading(32, 8, 132, 2, "an H100")
    assert "256 programs" in busy and "already covers" in busy


def test_fp64_reading_both_ways():
    good = r.fp64_reading({(1, 1): 1e-7, (4, 3): 3e-7}, 1e-5, "float32", [1, 37])
    assert "stays within the 1e-05" in good and "**3.0e-07** (group 4, 3 splits)" in good
    bad = r.fp64_reading({(1, 1): 1e-2}, 1e-5, "float32", [1, 37])
    assert "bug in the kernel" in bad


def test_split_reading_cpu_and_gpu_both_ways():
    cpu = dict(copy=1e10, gpu=False)
    slower = r.split_reading(dict(cpu, split=_timing(2.0), one=_timing(1.0)), 8, 1024)
    assert "0.50 times as fast" in slower and "no parallelism" in slower
    faster = r.split_reading(dict(cpu, split=_timing(1.0), one=_timing(2.0)), 8, 1024)
    assert "not expected to help" in faster
    one = _timing(1.0)
    assert "baseline" in r.split_reading(dict(cpu, split=one, one=one), 1, 1024)
    gpu = dict(copy=2e12, gpu=True)
    paid = r.split_reading(dict(gpu, split=_timing(1e-3, 1e9), one=_timing(4e-3, 1e9)), 16, 65536)
    assert "**50%**" in paid and "Splitting paid" in paid
    unpaid = r.split_reading(dict(gpu, split=_timing(4e-3, 1e9), one=_timing(4e-3, 1e9)), 16, 65536)
    assert "did not pay" in unpaid
