"""Train the small Llama that ships with the book (kvlab/data/tiny_kjv), from nothing, seeded.

Stages, all run by default:
  corpus     dump the King James Bible from Debian's bible-kjv (`apt-get install bible-kjv`), one
  verse
             a line, and split off whole held-out books (Ruth, Jonah) into heldout.txt
  tokenizer  train a byte-level BPE (the `tokenizers` library) on the training text, saved in the
             Hugging Face format so that AutoTokenizer loads it
  train      train a Llama (GQA, RoPE) on random windows of the training text; tqdm progress bar,
             loss log (train_log.tsv) and loss curve (loss_curve.png)
  eval       held-out perplexity and a greedy sample, written to metrics.json and the model card

`--replay N` rebuilds the corpus and tokenizer and reruns the first N steps, comparing them with the
committed tokenizer and loss log: a check that this script still reproduces the shipped model.

`--check` trains a very small model for a few hundred steps on the committed held-out text with the
committed tokenizer (no Debian package needed), checks that the loss falls, and writes nothing into
the package: it is the test of this script. Run with one thread to reproduce the shipped run
exactly: `OMP_NUM_THREADS=1 python scripts/train_tiny.py`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
OUT = ROOT / "kvlab" / "data" / "tiny_kjv"
WORK = ROOT / "build" / "tiny_kjv"  # the full training text (not committed: rebuilt from Debian)
HELDOUT_BOOKS = ("Ruth", "Jonah")
SEED = 20261201
VOCAB = 4096
BOS, EOS = "<s>", "</s>"

# The shipped model. Sized so that training takes about half an hour on one CPU thread.
MODEL = dict(
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
)
CONTEXT = 256
TRAIN = dict(steps=400, batch=12, lr=3e-3, warmup=30, weight_decay=0.1, min_lr_ratio=0.1)

CHECK_MODEL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
)
CHECK_CONTEXT = 64
CHECK_TRAIN = dict(steps=300, batch=8, lr=3e-3, warmup=20, weight_decay=0.1, min_lr_ratio=0.1)


# ---------------------------------------------------------------- corpus
def dump_bible() -> str:
    """The whole KJV text as printed by Debian's `bible` command (package bible-kjv)."""
    exe = shutil.which("bible")
    if exe is None:
        raise SystemExit(
            "the `bible` command is missing: apt-get install bible-kjv (it pulls bible-kjv-text)"
        )
    env = dict(os.environ, COLUMNS="100000")  # one verse a line, no wrapping
    return subprocess.run(
        [exe, "Gen1:1-Rev22:21"], capture_output=True, text=True, check=True, env=env
    ).stdout


def split_books(raw: str) -> dict[str, str]:
    """{book: text}: each chapter a heading line ("Ruth 1") then one verse a line, verse numbers
    dropped."""
    books: dict[str, list[str]] = {}
    book = None
    for line in raw.splitlines():
        verse = re.match(r"^\s+\d+ (.*)$", line)
        if verse:
            books[book].append(verse.group(1).strip())
        elif line.strip():
            book = line.strip().rsplit(" ", 1)[0]
            books.setdefault(book, [])
            if books[book]:
                books[book].append("")
            books[book].append(line.strip())
    return {b: "\n".join(lines) + "\n" for b, lines in books.items()}


def prepare_corpus() -> tuple[str, str]:
    books = split_books(dump_bible())
    missing = [b for b in HELDOUT_BOOKS if b not in books]
    if missing or len(books) != 66:
        raise SystemExit(f"unexpected bible dump: {len(books)} books, missing {missing}")
    train = "\n".join(t for b, t in books.items() if b not in HELDOUT_BOOKS)
    heldout = "\n".join(books[b] for b in HELDOUT_BOOKS)
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / "train.txt").write_text(train, encoding="utf-8")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "heldout.txt").write_text(heldout, encoding="utf-8")
    return train, heldout


# ---------------------------------------------------------------- tokenizer
def train_tokenizer(train_text: str, out: Path):
    from tokenizers import ByteLevelBPETokenizer, processors
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    bpe.train_from_iterator(
        train_text.splitlines(keepends=True),
        vocab_size=VOCAB,
        min_frequency=2,
        special_tokens=[BOS, EOS],
        show_progress=False,
    )
    bpe.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bpe.token_to_id(BOS))]
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=EOS,
        clean_up_tokenization_spaces=False,
    )
    tok.save_pretrained(str(out))
    # Name the class every transformers release knows (5.x would write its new "TokenizersBackend").
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    return tok


# ---------------------------------------------------------------- model
def build_model(tok, model_kw: dict, context: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tok),
        max_position_embeddings=context,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **model_kw,
    )
    torch.manual_seed(SEED)
    return LlamaForCausalLM(config)


def learning_rate(step: int, steps: int, lr: float, warmup: int, min_lr_ratio: float, **_) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def train(
    model,
    ids,
    tok,
    context: int,
    steps: int,
    batch: int,
    lr: float,
    weight_decay: float,
    log_path: Path | None,
    stop_after: int | None = None,
    **schedule,
) -> list[tuple]:
    """AdamW on random windows of ``ids`` (each window starts with <s>); returns the log rows.
    ``stop_after`` ends the run early without changing the schedule (for ``--replay``)."""
    import torch
    from tqdm import tqdm

    gen = torch.Generator().manual_seed(SEED)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": other, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
    )
    bos = torch.full((batch, 1), tok.bos_token_id, dtype=torch.long)
    rows, start = [], time.perf_counter()
    log = open(log_path, "w") if log_path else None
    if log:
        log.write("step\ttokens\tloss\tlr\tseconds\n")
    model.train()
    bar = tqdm(
        range(steps if stop_after is None else min(steps, stop_after)), desc="train", mininterval=5
    )
    for step in bar:
        rate = learning_rate(step, steps, lr, **schedule)
        for group in opt.param_groups:
            group["lr"] = rate
        offsets = torch.randint(0, len(ids) - context, (batch,), generator=gen)
        x = torch.cat([bos, torch.stack([ids[o : o + context - 1] for o in offsets])], dim=1)
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        row = (
            step + 1,
            (step + 1) * batch * (context - 1),
            loss.item(),
            rate,
            time.perf_counter() - start,
        )
        rows.append(row)
        if log:
            log.write(f"{row[0]}\t{row[1]}\t{row[2]:.4f}\t{row[3]:.6f}\t{row[4]:.1f}\n")
            log.flush()
        bar.set_postfix(loss=f"{row[2]:.3f}", refresh=False)
    model.eval()
    if log:
        log.close()
    return rows


def plot_curve(rows, path: Path, heldout_loss: float):
    import matplotlib

    matplotlib.use("Agg")
    import numpy as np

    from kvlab.show import plots

    fig, ax = plots.new_figure()
    steps = np.array([r[0] for r in rows])
    losses = np.array([r[2] for r in rows])
    k = max(1, min(25, len(rows)))
    smooth = np.convolve(losses, np.ones(k) / k, mode="valid")
    ax.plot(steps, losses, color="0.8", lw=0.6, label="training loss (one batch)")
    ax.plot(steps[k - 1 :], smooth, lw=1.5, label=f"mean of {k} steps")
    ax.axhline(heldout_loss, color="C3", ls="--", lw=1, label="held-out loss, final model")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats per token)")
    ax.legend()
    plots.stamp_corner(fig)
    fig.savefig(path, dpi=110)


# ---------------------------------------------------------------- card
CARD = """# tiny-kjv: the small trained model of the book

A {params_m:.2f} M-parameter Llama trained by `scripts/train_tiny.py` on the King James Bible, so that
section 9.7 (long-context variants) can measure what a sliding window, attention sinks and KV-cache
quantization cost in quality, offline. Load it with `kvlab.trained_model()`.

| | |
|---|---|
| corpus | King James Version (1611), dumped with `bible Gen1:1-Rev22:21` from Debian's `bible-kjv` / `bible-kjv-text` {debian_version}; {train_chars:,} characters of training text, one verse a line, chapter headings kept, verse numbers dropped (sha256 of the training text `{train_sha}`) |
| licence | the KJV text is in the public domain (its copyright expired; see the package's `copyright` file); the weights, tokenizer and code are released under this repository's Apache-2.0 licence |
| held-out text | the books of {heldout_books} (`heldout.txt`, {heldout_tokens:,} tokens), never seen in training |
| tokenizer | byte-level BPE (`tokenizers`), {vocab} tokens, `<s>` prepended like a Llama tokenizer |
| architecture | Llama: {layers} layers, hidden {hidden}, {q_heads} query heads and {kv_heads} KV heads of dimension {head_dim} (GQA, group {group}), SwiGLU {intermediate}, RoPE (theta {rope_theta:g}), tied embeddings |
| size | {params:,} parameters; `model.safetensors` {weights_bytes:,} bytes (fp32) |
| training | {steps} steps of {batch} windows of {context} tokens (each starting with `<s>`): {train_tokens:,} tokens, {epochs:.2f} passes over the training text; AdamW, peak learning rate {lr:g}, {warmup} warm-up steps, cosine decay; seed {seed}; {train_minutes:.0f} minutes on one CPU thread ({device}) |
| training loss | {final_train_loss:.3f} nats per token (mean of the last 50 steps); see `train_log.tsv` and `loss_curve.png` |
| held-out perplexity | **{heldout_ppl:.2f}** ({heldout_loss:.3f} nats per token), in chunks of {context} tokens |

Greedy continuation of `{prompt!r}`:

> {sample}

## Reproducing it

`apt-get install bible-kjv`, then `OMP_NUM_THREADS=1 python scripts/train_tiny.py` rebuilds the corpus,
the tokenizer, the weights, this card, the log and the curve. `python scripts/train_tiny.py --replay 2`
rebuilds the corpus and tokenizer and reruns the first two steps against the committed log;
`--check` trains a very small model on the held-out text to show the script still learns.

## What this model is not

It is a teaching instrument: large enough to have a real perplexity to lose, real attention patterns
and real key statistics, small enough to train in half an hour on a laptop CPU and to ship in the
repository. It is not a useful language model or chatbot: it knows only the vocabulary and style of one
book, it repeats itself, it has no instruction tuning and no safety training, and its context is only
{context} tokens. Whatever it says about the text it was trained on carries no authority. Findings
measured on it (whether it has attention sinks, outlier key channels, how much 2-bit keys cost) hold for
it; they are evidence about, not proof of, what large models do.
"""

PROMPT = "In the beginning"


def evaluate_and_card(
    model,
    tok,
    rows,
    train_text: str,
    steps: int,
    batch: int,
    context: int,
    lr: float,
    warmup: int,
    **_,
):
    import torch

    from kvlab.lab import hardware, trained

    ppl = trained.heldout_perplexity(model, tok, context=context)
    x = tok(PROMPT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(
            x, max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=tok.pad_token_id
        )
    sample = tok.decode(out[0], skip_special_tokens=True)
    cfg = model.config
    train_tokens = steps * batch * (context - 1)
    n_train = len(tok(train_text, add_special_tokens=False)["input_ids"])
    try:
        debian = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", "bible-kjv-text"], capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        debian = ""
    m = dict(
        params=sum(p.numel() for p in model.parameters()),
        weights_bytes=(OUT / "model.safetensors").stat().st_size,
        train_chars=len(train_text),
        train_sha=hashlib.sha256(train_text.encode()).hexdigest()[:16],
        train_tokens=train_tokens,
        train_text_tokens=n_train,
        epochs=train_tokens / n_train,
        heldout_books=" and ".join(HELDOUT_BOOKS),
        heldout_tokens=len(trained.heldout_ids(tok)[0]),
        heldout_ppl=ppl,
        heldout_loss=math.log(ppl),
        context=context,
        steps=steps,
        batch=batch,
        lr=lr,
        warmup=warmup,
        seed=SEED,
        vocab=len(tok),
        final_train_loss=sum(r[2] for r in rows[-50:]) / len(rows[-50:]),
        train_minutes=rows[-1][4] / 60,
        device=hardware.stamp().get("device", "CPU"),
        debian_version=debian,
        prompt=PROMPT,
        sample=sample.replace("\n", " / "),
        greedy_ids=out[0, x.shape[1] :].tolist(),
        layers=cfg.num_hidden_layers,
        hidden=cfg.hidden_size,
        q_heads=cfg.num_attention_heads,
        kv_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        group=cfg.num_attention_heads // cfg.num_key_value_heads,
        intermediate=cfg.intermediate_size,
        rope_theta=float(getattr(cfg, "rope_theta", None) or cfg.rope_parameters["rope_theta"]),
        weights_sha256=hashlib.sha256((OUT / "model.safetensors").read_bytes()).hexdigest(),
    )
    m["params_m"] = m["params"] / 1e6
    (OUT / "metrics.json").write_text(json.dumps(m, indent=1) + "\n")
    (OUT / "README.md").write_text(CARD.format(**m))
    plot_curve(rows, OUT / "loss_curve.png", m["heldout_loss"])
    print(f"held-out perplexity {ppl:.3f}; sample: {sample!r}")


# ---------------------------------------------------------------- main
def check() -> int:
    """A few hundred steps of a very small model on the committed held-out text: does the loss
    fall?"""
    import torch

    from kvlab.lab import trained

    torch.set_num_threads(1)
    tok = trained.trained_tokenizer()
    ids = trained.heldout_ids(tok)[0]
    model = build_model(tok, CHECK_MODEL, CHECK_CONTEXT)
    rows = train(model, ids, tok, CHECK_CONTEXT, log_path=None, **CHECK_TRAIN)
    first = sum(r[2] for r in rows[:20]) / 20
    last = sum(r[2] for r in rows[-20:]) / 20
    print(f"check: loss {first:.3f} -> {last:.3f} over {len(rows)} steps")
    if not last < first - 1.0:
        print("check FAILED: the loss did not fall by a nat")
        return 1
    return 0


def replay(steps: int) -> int:
    """Rebuild the corpus and tokenizer and rerun the first ``steps`` training steps: do they match
    the committed tokenizer and loss log? (The learning-rate schedule of the first steps does not
    depend on the total, so a short replay follows the shipped run exactly.)"""
    import tempfile

    import torch

    torch.set_num_threads(1)
    train_text, _ = prepare_corpus()
    with tempfile.TemporaryDirectory() as tmp:
        tok = train_tokenizer(train_text, Path(tmp))
        same_tokenizer = (Path(tmp) / "tokenizer.json").read_bytes() == (
            OUT / "tokenizer.json"
        ).read_bytes()
    logged = [
        float(line.split("\t")[2])
        for line in (OUT / "train_log.tsv").read_text().splitlines()[1 : steps + 1]
    ]
    ids = torch.tensor(tok(train_text, add_special_tokens=False)["input_ids"])
    model = build_model(tok, MODEL, CONTEXT)
    rows = train(model, ids, tok, CONTEXT, log_path=None, **TRAIN, stop_after=steps)
    gap = max(abs(r[2] - loss) for r, loss in zip(rows, logged))
    print(
        f"replay: tokenizer {'identical' if same_tokenizer else 'DIFFERENT'}; first {steps} losses "
        f"differ from the log by at most {gap:.1e}"
    )
    return 0 if same_tokenizer and gap < 2e-3 else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--check", action="store_true", help="a short run that verifies the loss falls"
    )
    parser.add_argument(
        "--stage",
        choices=["all", "corpus", "tokenizer", "eval"],
        default="all",
        help="stop after this stage; eval alone re-evaluates the saved model and its log",
    )
    parser.add_argument("--steps", type=int, default=TRAIN["steps"])
    parser.add_argument(
        "--replay",
        type=int,
        metavar="N",
        help="rerun the first N steps and compare with the committed tokenizer and log",
    )
    args = parser.parse_args(argv)
    if args.check:
        return check()
    if args.replay:
        return replay(args.replay)
    import torch

    torch.set_num_threads(1)
    train_text, _ = prepare_corpus()
    if args.stage == "corpus":
        return 0
    settings = dict(TRAIN, steps=args.steps)
    if args.stage == "eval":
        from kvlab.lab import trained

        model, tok = trained.trained_model()
        lines = (OUT / "train_log.tsv").read_text().splitlines()[1:]
        rows = [tuple(float(v) for v in line.split("\t")) for line in lines]
        evaluate_and_card(model, tok, rows, train_text, context=CONTEXT, **settings)
        return 0
    tok = train_tokenizer(train_text, OUT)
    if args.stage == "tokenizer":
        return 0
    ids = torch.tensor(tok(train_text, add_special_tokens=False)["input_ids"])
    model = build_model(tok, MODEL, CONTEXT)
    rows = train(model, ids, tok, CONTEXT, log_path=OUT / "train_log.tsv", **settings)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(str(OUT), safe_serialization=True)
    evaluate_and_card(model, tok, rows, train_text, context=CONTEXT, **settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
