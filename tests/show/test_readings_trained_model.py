"""Readings of section 9.7 on the trained model (kvlab.show.readings.trained_model), fed both outcomes."""

import re

import pytest

from kvlab.show.readings import trained_model as r


def no_roles(text):
    assert not re.search(r"\{(glue|cite|doc|ref)", text), text
    return text


def test_model_reading_quotes_the_card():
    card = dict(params=4_196_608, layers=4, q_heads=4, kv_heads=2, head_dim=64, train_tokens=1_224_000,
                epochs=1.18, context=256, heldout_ppl=41.234, heldout_books="Ruth and Jonah",
                prompt="In the beginning", sample="In the beginning God")
    text = no_roles(r.model_reading(card))
    assert "4.2 M parameters" in text and "41.2" in text and "1,224,000" in text and "In the beginning God" in text


def test_sink_reading_both_outcomes():
    sinks = [[0.9, 0.05], [0.6, 0.3]]
    none = [[0.02, 0.05], [0.01, 0.03]]
    both = no_roles(r.sink_reading(sinks, sinks, uniform=0.02, tokens=256))
    assert "has attention sinks" in both and "4 of its 4 heads" not in both and "3 of its 4 heads" in both
    assert "first *position*" in both and "90%" in both
    bos_only = no_roles(r.sink_reading(sinks, none, uniform=0.02, tokens=256))
    assert "`<s>` token" in bos_only
    absent = no_roles(r.sink_reading(none, none, uniform=0.02, tokens=256))
    assert "no attention sinks" in absent and "5%" in absent and "2 times the uniform" in absent
    position_only = no_roles(r.sink_reading(none, sinks, uniform=0.02, tokens=256))
    assert "no attention sinks" in position_only and "first position draws attention" in position_only


@pytest.mark.parametrize("window_loss, full_long, verdicts", [
    (5.0, 3.1, ["buys it back", "holds up", "as good as or better"]),
    (3.02, 3.6, ["changed the loss by only", "gets worse", "Recomputing is worse"]),
])
def test_stream_reading_both_outcomes(window_loss, full_long, verdicts):
    loss = {"full": 3.1, "window": window_loss, "sinks + window": 3.2, "recompute": 3.15}
    nbytes = {"full": 4.2e6, "window": 2.6e5, "sinks + window": 2.8e5, "recompute": 2.6e5}
    text = no_roles(r.stream_reading(loss, nbytes, 64, 4, 256, 3.1, full_long))
    for verdict in verdicts:
        assert verdict in text
    assert "64-token window" in text and "4 sinks" in text and "4.2 MB" in text


def test_outlier_reading_both_outcomes():
    yes = no_roles(r.outlier_reading(12.0, 2.5, 9, 0, 512))
    assert "have outlier channels" in yes and "12.0 times" in yes and "9 of 512" in yes
    no = no_roles(r.outlier_reading(3.0, 3.5, 0, 0, 512))
    assert "no more outlier channels" in no


@pytest.mark.parametrize("token_ppl, verdict", [(60.0, "argument holds"), (45.1, "within 1%"), (40.0, "lower than")])
def test_quant_reading_both_outcomes(token_ppl, verdict):
    ppl = {(8, "channel"): 41.0, (4, "channel"): 42.0, (2, "channel"): 45.0, (2, "token"): token_ppl}
    agree = {(8, "channel"): 0.99, (4, "channel"): 0.95, (2, "channel"): 0.8}
    nbytes = {(2, "channel"): 786_000}
    text = no_roles(r.quant_reading(ppl, agree, nbytes, 41.0, 6_290_000))
    assert verdict in text and "8.0 times less" in text and "80.0%" in text
