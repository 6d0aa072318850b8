"""The trained model shipped with the book (section 9.7): it loads with the network unavailable
(HF_HUB_OFFLINE=1, proxies closed), its tokenizer round-trips text, its held-out perplexity and
greedy output match the model card, its weights match the pinned checksum, and scripts/train_tiny.py
trains.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import kvlab
from kvlab.lab import trained

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tokenizer():
    return kvlab.trained_tokenizer()


def test_tokenizer_loads_offline_and_round_trips(tokenizer):
    text = "And the LORD said unto Moses, Go in unto Pharaoh.\nRuth 1"
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id  # <s> prepended, like a Llama tokenizer
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert len(tokenizer) == 4096
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == ids[1:]


def test_tokenizer_is_byte_level(tokenizer):
    text = "Ünïcode → bytes ✓ 漢字"  # nothing the corpus has: byte fallback, never an unknown token
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text


def test_heldout_text_is_whole_books_not_in_training():
    text = trained.heldout_text()
    assert text.startswith("Ruth 1\n") and "Jonah 4" in text
    assert len(trained.heldout_ids()[0]) > 4 * 256  # several training contexts long


# --------------------------------------------------------------------------- the model

# Pinned from the shipped training run (kvlab/data/tiny_kjv/metrics.json): a retrained model must
# update these on purpose, never by accident.
WEIGHTS_SHA256 = "0d54ae0160f374571bc2de4a4a4e604619171b3bc7d277f2b5edd584e2f38cca"
PROMPT = "In the beginning"
GREEDY_IDS = [
    270,
    260,
    343,
    13,
    269,
    260,
    343,
    13,
    269,
    260,
    343,
    13,
    269,
    260,
    343,
    13,
    269,
    260,
    343,
    13,
    269,
    260,
    343,
    13,
]


@pytest.fixture(scope="module")
def model_and_tokenizer():
    return kvlab.trained_model()


def test_weights_checksum_is_pinned():
    import hashlib

    digest = hashlib.sha256((trained.DATA_DIR / "model.safetensors").read_bytes()).hexdigest()
    assert digest == WEIGHTS_SHA256 == trained.metrics()["weights_sha256"]


def test_model_loads_with_the_network_unavailable():
    # A fresh interpreter with the hub switched off and every proxy pointing at a closed port.
    code = (
        "import kvlab; m, t = kvlab.trained_model(); print(t.decode(kvlab.cached_decode(m, t('In"
        " the beginning', return_tensors='pt').input_ids, 5)[0]))"
    )
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HTTPS_PROXY="http://127.0.0.1:9",
        HTTP_PROXY="http://127.0.0.1:9",
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(ROOT),
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip()


def test_model_has_gqa_and_rope(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    config = model.config
    assert config.model_type == "llama" and config.num_key_value_heads < config.num_attention_heads
    assert getattr(model.model, "rotary_emb", None) is not None
    assert model.shape.kv_heads == config.num_key_value_heads and model.tokenizer is tokenizer
    assert (trained.DATA_DIR / "model.safetensors").stat().st_size <= 25 * 2**20
    assert not model.training


def test_heldout_perplexity_matches_the_model_card(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    stated = trained.metrics()["heldout_ppl"]
    assert f"**{stated:.2f}**" in (trained.DATA_DIR / "README.md").read_text()
    measured = trained.heldout_perplexity(model, tokenizer)
    assert measured == pytest.approx(stated, rel=2e-3)
    # It learned something: far better than guessing uniformly among the tokens.
    assert measured < len(tokenizer) / 20


def test_greedy_generation_from_a_fixed_prompt(model_and_tokenizer):
    import torch

    model, tokenizer = model_and_tokenizer
    ids = tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=len(GREEDY_IDS), do_sample=False)
    assert out[0, ids.shape[1] :].tolist() == GREEDY_IDS
    assert torch.equal(
        kvlab.cached_decode(model, ids, len(GREEDY_IDS))[0], torch.tensor(GREEDY_IDS)
    )


def test_heldout_perplexity_rejects_bad_context(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    with pytest.raises(ValueError, match="context"):
        trained.heldout_perplexity(model, tokenizer, context=1)


def test_train_script_check_mode_loss_falls():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train_tiny.py"), "--check"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    first, last = map(float, re.search(r"check: loss ([\d.]+) -> ([\d.]+)", result.stdout).groups())
    assert last < first - 1.0


@pytest.mark.skipif(
    __import__("shutil").which("bible") is None,
    reason="needs Debian's bible-kjv package (apt-get install bible-kjv) for the corpus",
)
def test_train_script_reproduces_the_shipped_run():
    # Corpus, tokenizer and the first training steps, rebuilt from nothing, match what is committed.
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train_tiny.py"), "--replay", "2"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "tokenizer identical" in result.stdout
