"""Rewards for tests that must not depend on what a model generates (loaded by import path:
``verifier.name=tests.stub_rewards:gold_parity``)."""
from __future__ import annotations


def gold_parity(completions: list[str], answer: list[str], **_) -> list[float]:
    """1.0 where the gold answer is even, else 0.0, whatever the completion: a batch of prompts with both
    parities has rewards that differ by construction, on any machine."""
    return [float(int(a) % 2 == 0) for a in answer]


def exact(completions: list[str], answer: list[str]) -> list[float]:
    """1.0 where the completion is the answer: a reward with no keyword arguments beyond its columns."""
    return [float(c.strip() == str(a)) for c, a in zip(completions, answer)]


def first_char_even(completions: list[str], **_) -> list[float]:
    """1.0 where the completion starts with a character of even code point: rewards that differ between the
    samples of one prompt (so pass@k differs from avg@n) and that an evaluation's samples.jsonl records."""
    return [float(bool(c) and ord(c[0]) % 2 == 0) for c in completions]
