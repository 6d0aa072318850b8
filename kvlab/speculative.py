"""Notebook 11, speculative decoding: guess a few tokens cheaply, check them in one forward pass.

This module holds the proposers. ``prompt_lookup`` guesses the next tokens by finding the latest
n-gram of the text so far earlier in that text, and proposing what followed it there (Saxena 2023,
prompt lookup decoding, as transformers' ``prompt_lookup_num_tokens`` does it). It costs no model
call, and pays where the output quotes its context: copying, editing, summarising with quotes.

Pure Python: the serving engine (``kvlab.serving``) proposes with it per request, and the decode
loop of notebook 13 per step.
"""

from __future__ import annotations


def prompt_lookup(tokens: list[int], k: int, max_ngram: int = 3) -> list[int]:
    """Up to ``k`` tokens proposed to follow ``tokens``: for n from ``max_ngram`` down to 1, the
    first earlier occurrence of the last n tokens that has a continuation, and up to ``k`` tokens of
    that continuation. ``[]`` when no n-gram recurs. Trusts its inputs (callers check them)."""
    for n in range(min(max_ngram, len(tokens) - 1), 0, -1):
        tail = tokens[-n:]
        for start in range(len(tokens) - n):
            if tokens[start : start + n] == tail:
                return tokens[start + n : start + n + k]
    return []
