"""The trained model shipped with the book (section 9.7): it loads with the network unavailable, its
tokenizer round-trips text, and scripts/train_tiny.py still trains."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # the model must load from the repository alone

import pytest

import kvlab
from kvlab import trained


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
