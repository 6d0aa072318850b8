"""kvlab._checks, the vocabulary every public entry point validates with (CONTRIBUTING.md,
"Errors"), and ``restoring``, the one context manager around a temporary change to a caller's
object."""

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import kvlab
from kvlab import _checks
from kvlab._checks import (
    causal_lm,
    device,
    dtype,
    flag,
    function,
    integer,
    integers,
    items,
    one_of,
    padding_mask,
    positive,
    real,
    restoring,
    token_id_tensor,
    token_ids,
)

ROOT = Path(__file__).resolve().parents[1]

# (call, error type, message pattern): the message names the argument, the value and what is
# allowed.
BAD = [
    (
        lambda: integer("block_size", True),
        TypeError,
        r"block_size must be an int >= 1, got bool True",
    ),
    (
        lambda: integer("block_size", 4.0),
        TypeError,
        r"block_size must be an int >= 1, got float 4.0",
    ),
    (lambda: integer("n", 1.5), TypeError, r"n must be an int >= 1, got float 1.5"),
    (lambda: integer("n", "3"), TypeError, r"n must be an int >= 1, got str '3'"),
    (lambda: integer("n", None), TypeError, r"n must be an int >= 1, got NoneType None"),
    (lambda: integer("layer", 2, 0, 2), ValueError, r"layer must be an int in \[0, 2\), got 2"),
    (lambda: integer("n", math.inf), TypeError, r"n must be an int"),
    (lambda: integers("batches", 3), TypeError, r"batches must be a list of ints, got int 3"),
    (lambda: integers("batches", "12"), TypeError, r"batches must be a list of ints, got str"),
    (lambda: integers("batches", []), ValueError, r"batches must hold at least one int"),
    (lambda: integers("batches", [1, True]), TypeError, r"batches\[1\] must be an int"),
    (lambda: real("x", math.inf), ValueError, r"x must be a finite number, got inf"),
    (lambda: real("x", math.nan), ValueError, r"x must be a finite number, got nan"),
    (lambda: real("x", True), TypeError, r"x must be a finite number, got bool True"),
    (lambda: real("share", 1.5, 0, 1), ValueError, r"share must be in \[0, 1\], got 1.5"),
    (lambda: real("share", "0.5", 0, 1), TypeError, r"share must be a number in \[0, 1\], got str"),
    (lambda: real("t", -1.0, 0), ValueError, r"t must be a finite number >= 0, got -1.0"),
    (lambda: positive("w", 0), ValueError, r"w must be a finite number > 0, got 0"),
    (lambda: flag("debug", "no"), TypeError, r"debug must be True or False, got str 'no'"),
    (lambda: flag("debug", 1), TypeError, r"debug must be True or False, got int 1"),
    (lambda: flag("debug", None), TypeError, r"debug must be True or False"),
    (
        lambda: one_of("bits", 4.0, (2, 4, 8)),
        ValueError,
        r"bits must be one of \(2, 4, 8\), got 4.0",
    ),
    (lambda: one_of("cached", 1, (True, False)), ValueError, r"cached must be one of"),
    (
        lambda: one_of("path", "flash", ("kernel", "gather")),
        ValueError,
        r"path must be one of .*got 'flash'",
    ),
    (
        lambda: token_ids("prompt", "abcd"),
        TypeError,
        r"prompt must be a list of token ids.*tokenize the text",
    ),
    (lambda: token_ids("prompt", 7), TypeError, r"prompt must be a list of token ids .*got int 7"),
    (
        lambda: token_ids("prompt", [1, 1.0]),
        TypeError,
        r"prompt\[1\] must be a token id .*got float 1.0",
    ),
    (lambda: token_ids("prompt", [True]), TypeError, r"prompt\[0\] must be a token id"),
    (lambda: token_ids("prompt", [[1, 2]]), TypeError, r"prompt\[0\] must be a token id"),
    (
        lambda: token_ids("prompt", [1, 128], 128),
        ValueError,
        r"prompt\[1\] must be a token id in \[0, 128\) \(the model's vocab_size is 128\), got 128",
    ),
    (
        lambda: token_ids("prompt", [-1]),
        ValueError,
        r"prompt\[0\] must be a token id in \[0, 2\*\*63\)",
    ),
    (lambda: token_ids("prompt", []), ValueError, r"prompt must hold at least one token id"),
    (
        lambda: token_ids("prompt", torch.ones(3)),
        TypeError,
        r"prompt must be .*1-D integer tensor, got a torch.float32",
    ),
    (
        lambda: token_ids("prompt", torch.ones(1, 3, dtype=torch.long)),
        TypeError,
        r"prompt must be .*shape \(1, 3\)",
    ),
    (lambda: function("measure", "f"), TypeError, r"measure must be a function .*got str 'f'"),
    (
        lambda: device("device", "bogus"),
        ValueError,
        r"device must be a torch.device or a name like 'cpu'",
    ),
    (lambda: device("device", 3), TypeError, r"device must be a torch.device"),
    (
        lambda: device("device", "cuda:7"),
        ValueError,
        r"device 'cuda:7' is not available on this machine",
    ),
    (lambda: device("device", "meta"), ValueError, r"device must hold data"),
    (
        lambda: dtype("dtype", "fp16"),
        TypeError,
        r"dtype must be a torch.dtype such as torch.float32",
    ),
    (
        lambda: dtype("dtype", torch.int64),
        TypeError,
        r"dtype must be a floating-point torch.dtype, got torch.int64",
    ),
    (
        lambda: causal_lm("model", None),
        TypeError,
        r"model must be a Hugging Face causal LM .*got NoneType",
    ),
    (
        lambda: causal_lm("model", "gpt2"),
        TypeError,
        r"model must be a Hugging Face causal LM .*got str",
    ),
    (lambda: items("events", 3, int), TypeError, r"^events must be a list of int, got int$"),
    (lambda: items("events", "ab", str), TypeError, r"^events must be a list of str, got str$"),
    (
        lambda: items("sweep", None, float, what="BatchPoint (batch_sweep)"),
        TypeError,
        r"^sweep must be a list of BatchPoint \(batch_sweep\), got NoneType$",
    ),
    (lambda: items("events", [1, "2"], int), TypeError, r"^events\[1\] must be an int, got str$"),
    (
        lambda: items("trace", [1], str, each="a Request (make_trace)"),
        TypeError,
        r"^trace\[0\] must be a Request \(make_trace\), got int$",
    ),
    (
        lambda: token_id_tensor("input_ids", [[1, 2]]),
        TypeError,
        r"input_ids must be a torch.Tensor of token ids, got list",
    ),
    (
        lambda: token_id_tensor("input_ids", torch.ones(1, 2)),
        TypeError,
        r"input_ids must hold integer token ids \(torch.long\), got dtype torch.float32",
    ),
    (
        lambda: token_id_tensor("input_ids", torch.ones(1, 0, dtype=torch.long)),
        ValueError,
        r"input_ids must have shape \[batch, prompt_length >= 1\], got \[1, 0\]",
    ),
    (
        lambda: token_id_tensor("input_ids", torch.tensor([[3, 9]]), 8),
        ValueError,
        r"input_ids must be token ids in \[0, 8\) \(the model's vocab_size\), got \[9\]",
    ),
    (
        lambda: padding_mask("attention_mask", torch.tensor([[1, 0]]), torch.ones(1, 2)),
        ValueError,
        r"attention_mask must be left-padded",
    ),
    (
        lambda: padding_mask("attention_mask", torch.tensor([[1, 2]]), torch.ones(1, 2)),
        ValueError,
        r"attention_mask must hold only 0 \(padding\) and 1 \(token\), got values such as \[2\]",
    ),
]


@pytest.mark.parametrize("call, error, match", BAD)
def test_each_check_names_the_argument_the_value_and_what_is_allowed(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_checks_return_what_kvlab_uses():
    assert integer("n", np.int64(3)) == 3 and type(integer("n", np.int64(3))) is int
    assert integers("batches", (1, 2)) == [1, 2]
    assert real("x", 1) == 1.0 and type(real("x", np.float32(0.5))) is float
    assert real("x", 1.0, 1, math.inf, high_open=True) == 1.0
    assert flag("debug", False) is False
    assert token_ids("prompt", torch.tensor([3, 1])) == [3, 1]
    assert token_ids("prompt", np.array([3, 1], dtype=np.int32)) == [3, 1]
    assert token_ids("prompt", (5,), 8) == [5] and token_ids("reply", [], empty=True) == []
    assert device("device", "cpu") == torch.device("cpu")
    assert dtype("dtype", torch.float16) is torch.float16
    assert one_of("bits", 4, (2, 4, 8)) == 4
    assert items("events", (3, 4), int) == [3, 4] and items("events", iter([]), int) == []
    assert items("trace", (x for x in "ab"), str) == ["a", "b"]
    ids = torch.tensor([[0, 5, 7]])
    assert token_id_tensor("input_ids", ids, 8) is ids
    assert torch.equal(padding_mask("attention_mask", None, ids), torch.ones_like(ids))
    mask = padding_mask("attention_mask", torch.tensor([[0.0, 1.0, 1.0]]), ids)
    assert mask.dtype == torch.long and mask.tolist() == [[0, 1, 1]]


@pytest.fixture(scope="module")
def model():
    return kvlab.tiny_model(
        "llama",
        layers=1,
        hidden=32,
        q_heads=2,
        kv_heads=1,
        vocab=64,
        intermediate=32,
        device="cpu",
        dtype=torch.float32,
    )


def test_restoring_switches_a_model_for_the_block_and_back_on_any_exception(model):
    model.set_attn_implementation("eager")
    with restoring(model, attn_implementation="sdpa"):
        assert model.config._attn_implementation == "sdpa"
    assert model.config._attn_implementation == "eager"
    with pytest.raises(RuntimeError, match="inside"), restoring(model, attn_implementation="sdpa"):
        model.train()
        raise RuntimeError("inside")
    assert model.config._attn_implementation == "eager" and not model.training


class _Counter:
    def __init__(self):
        self.value = 0

    def snapshot(self):
        return self.value

    def restore(self, snapshot):
        self.value = snapshot


def test_restoring_rolls_a_stateful_object_back_only_when_the_block_raises():
    counter = _Counter()
    with restoring(counter):
        counter.value = 1
    assert counter.value == 1
    with pytest.raises(KeyboardInterrupt), restoring(counter):
        counter.value = 2
        raise KeyboardInterrupt  # any exception, not only Exception
    assert counter.value == 1
    with pytest.raises(TypeError, match="attn_implementation switches a model's attention"):
        with restoring(counter, attn_implementation="sdpa"):
            pass


def test_every_temporary_change_to_a_model_goes_through_restoring():
    """Outside ``restoring`` a module may set a model's attention only where it means it for good:
    the model it just built (``lab/pretrained.py``), and ``use_paged_attention``, whose name says
    so."""
    allowed = {"_checks.py", "serving/attention.py", "lab/pretrained.py"}
    pattern = re.compile(r"set_attn_implementation\(|_attn_implementation\s*=[^=]")
    found = []
    for path in (ROOT / "kvlab").rglob("*.py"):
        name = path.relative_to(ROOT / "kvlab").as_posix()
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line) and name not in allowed:
                found.append(f"kvlab/{name}:{number}: {line.strip()}")
    assert not found, "switch a caller's model with kvlab._checks.restoring:\n" + "\n".join(found)
    attention = (ROOT / "kvlab" / "serving" / "attention.py").read_text()
    assert attention.count("set_attn_implementation(") == 1  # use_paged_attention's, for good


def test_no_module_keeps_a_checker_of_its_own():
    """The small checkers modules once wrote for themselves are gone: every module validates with
    the vocabulary (a composite check of a module's own objects may stay, under a descriptive
    name)."""
    pattern = re.compile(
        r"^def (_positive\w*|_between|_width|_latency|_placement|check_choice|"
        r"require_positive_int|_check_positive|_positive_int|token_list)\(",
        re.M,
    )
    found = [
        f"{p.relative_to(ROOT)}: {m.group(1)}"
        for p in (ROOT / "kvlab").rglob("*.py")
        for m in pattern.finditer(p.read_text())
    ]
    assert not found
    assert not hasattr(_checks, "between")  # real(name, value, low, high) took its place


def test_instance_names_the_argument_and_the_kind_it_wants():
    assert _checks.instance("result", {}, dict) == {}
    with pytest.raises(TypeError, match=r"result must be a dict, got str 'r'"):
        _checks.instance("result", "r", dict)
    with pytest.raises(TypeError, match=r"rows must be a list or tuple, got int 3"):
        _checks.instance("rows", 3, (list, tuple))
    with pytest.raises(TypeError, match=r"cache must be a KVCache, got NoneType None"):
        _checks.instance("cache", None, int, "a KVCache")


def test_record_names_the_argument_the_record_and_its_fields():
    from types import SimpleNamespace

    timing = SimpleNamespace(min=1.0, median=1.2)
    assert _checks.record("cost", timing, "kvlab.lab.timing.Timing", "min", "median") is timing
    with pytest.raises(
        TypeError,
        match=r"cost must be a kvlab.lab.timing.Timing \(a record with min, median\), got float 1.5",
    ):
        _checks.record("cost", 1.5, "kvlab.lab.timing.Timing", "min", "median")
    with pytest.raises(TypeError, match=r"cost must be a .*, got SimpleNamespace"):
        _checks.record("cost", SimpleNamespace(min=1.0), "kvlab.lab.timing.Timing", "min", "median")
