"""The readings of notebook 11 (the engine), each outcome-dependent sentence in both of its branches."""

def test_life_reading_both_outcomes():
    from kvlab.show.readings.engine import life_reading

    busy = life_reading(dict(requests=5, steps=21, chunked=3, preemptions=1, stalled=2, cached_tokens=8), 4, 12, 8)
    calm = life_reading(dict(requests=5, steps=9, chunked=0, preemptions=0, stalled=0, cached_tokens=0), 4, 12, 8)
    assert "ran in chunks" in busy and "ran out 1 time" in busy and "8 prompt tokens" in busy
    assert "no prefill was chunked" in calm and "never ran out" in calm and "prefix cache" not in calm


def test_comparison_reading_both_outcomes():
    from kvlab.show.readings.engine import comparison_reading

    win = comparison_reading(16, 8, 90.0, 45.0, 1.0, 2.5, 5.0, on_gpu=False)
    lose = comparison_reading(16, 8, 40.0, 45.0, 3.0, 2.5, 5.0, on_gpu=True)
    assert "**2.00**" in win and "never waits" in win and "which returns a batch" in win
    assert "at least 2 times" in lose and "fell short" in lose and "slowed the requests" in lose


def test_curve_reading_both_outcomes():
    from kvlab.lab.engine import CurvePoint
    from kvlab.show.readings.engine import curve_reading

    growing = [CurvePoint(1, 20.0, 0.05, 1.0, 0, 0.2), CurvePoint(4, 70.0, 0.057, 3.9, 0, 0.2),
               CurvePoint(8, 75.0, 0.06, 4.4, 2, 0.2)]
    flat = [CurvePoint(1, 20.0, 0.05, 1.0, 0, 0.0), CurvePoint(4, 21.0, 0.19, 3.9, 0, 0.0)]
    text = curve_reading(growing, capacity=4.5, chosen=4)
    assert "grew from 20" in text and "pool, which holds about 4.5" in text and "preempted 2" in text
    assert "of the flat-step prediction" in text and "still set the cost" in text
    assert "20% of the tokens admitted came from cached" in text
    text = curve_reading(flat, capacity=20.0, chosen=1)
    assert "barely moved" in text and "did not bind" in text and "only 27%" in text and "no admission hit" in text
    assert "was off" in curve_reading(flat, capacity=20.0, chosen=1, prefix_caching=False)


