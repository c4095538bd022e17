"""n completions per problem through a rollout engine, ended where the source's sampler ends them, and scored.

The ``samples`` completions of a problem are that prompt repeated (as GRPO groups are drawn in training),
problem-major: completion ``j`` of problem ``i`` is row ``i * samples + j``. Each completion's text is what
vLLM's ``SamplingParams(stop=..., stop_token_ids=..., skip_special_tokens=True)`` returns, the sampler both
sources evaluate with (SimpleRL-Zoo ``examples/simplelr_math_eval/math_eval.py``, lighteval ``vllm``): the
tokens up to the first EOS or stop token (that token left out), decoded without special tokens, then cut
before the first stop string. Cutting after generation gives the same text as stopping during it, since the
tokens before a stop do not depend on what would follow; stop tokens also end generation early
(:func:`add_stop_tokens`), so only stop strings cost extra tokens.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from core.evaluation.sets import EvalSet
from core.rollout import Sampling


def add_stop_tokens(rollout, stop_token_ids: Sequence[int], vocab_size: int) -> list[int]:
    """The eval's stop tokens join the engine's EOS ids (every engine ends generation and its response mask at
    ``eos_ids``), so generation ends there as vLLM's ``stop_token_ids`` end it. Ids at or above ``vocab_size``
    are left out: the model cannot emit them (a preset's Qwen ids on another vocabulary). Returns the ids
    that now end a completion."""
    rollout.eos_ids = sorted({*rollout.eos_ids, *(i for i in stop_token_ids if 0 <= i < vocab_size)})
    return rollout.eos_ids


def completion_texts(tokenizer, roll, ends: set[int], stop: Sequence[str]) -> tuple[list[str], list[str]]:
    """Each row's text and finish reason (``stop``: an EOS, stop token or stop string ended it; ``length``:
    ``max_new_tokens`` did)."""
    texts, finish = [], []
    for ids, mask in zip(roll.response_ids.tolist(), roll.response_mask.tolist()):
        ids = [t for t, m in zip(ids, mask) if m]
        end = next((j for j, t in enumerate(ids) if t in ends), None)
        reason = "length" if end is None else "stop"
        text = tokenizer.decode(ids[:end], skip_special_tokens=True)
        hit = min((text.find(s) for s in stop if s in text), default=-1)
        if hit >= 0:
            text, reason = text[:hit], "stop"
        texts.append(text)
        finish.append(reason)
    return texts, finish


def generate(rollout, tokenizer, ids: list[list[int]], samples: int, sampling: Sampling, batch: int,
             ends: set[int], stop: Sequence[str], desc: str = "") -> tuple[list[str], list[str]]:
    """Texts and finish reasons of ``samples`` completions of every prompt in ``ids``, problem-major; each
    ``generate`` call holds whole problems, ``batch`` completions at most (0: all at once), its rows numbered from
    ``sampling.first_row`` on across the calls (an engine that seeds each row draws completion ``j`` of problem ``i``
    from ``sampling.seed`` and row ``i * samples + j``, however the calls are cut). A progress bar named ``desc``
    counts the problems done, on a terminal only."""
    from dataclasses import replace

    from tqdm import tqdm

    per_call = max(1, batch // samples) if batch else len(ids)
    texts, finish = [], []
    with tqdm(total=len(ids), desc=desc, unit="problem", disable=None, leave=False, dynamic_ncols=True) as bar:
        for i in range(0, len(ids), per_call):
            rows = replace(sampling, first_row=sampling.first_row + i * samples)
            roll = rollout.generate([p for p in ids[i:i + per_call] for _ in range(samples)], rows)
            t, f = completion_texts(tokenizer, roll, ends, stop)
            texts += t
            finish += f
            bar.update(min(per_call, len(ids) - i))
    return texts, finish


@dataclass
class SetResult:
    """Per problem: ``(n, c)`` of every scored problem (``counts``), problems whose every reward was None
    (``skipped``), and one record per problem for ``samples.jsonl``."""

    counts: list[tuple[int, int]] = field(default_factory=list)
    skipped: int = 0
    records: list[dict] = field(default_factory=list)


def score(s: EvalSet, scorer, texts: list[str], finish: list[str], samples: int, pass_reward: float | None,
          prompts: list[str]) -> SetResult:
    """Rewards of every completion (``scorer(texts, **columns)``: verifiers/correctness.py ``Scorer``), and per
    problem the count of correct ones: by the verifier's correctness term, or with ``pass_reward`` that term's
    reward at least it. A completion the term could not judge (None) is not correct; a problem with no verdict
    at all (an unparseable gold) is skipped, as training's evaluation skips it."""
    scores = scorer(texts, **s.verifier_columns(samples))
    verdicts = scores.correct if pass_reward is None else \
        [None if x is None else float(x) >= pass_reward for x in scores.accuracy]
    out = SetResult()
    for i, row in enumerate(s.rows):
        sl = slice(i * samples, (i + 1) * samples)
        r = [None if x is None else float(x) for x in scores.rewards[sl]]
        scored = any(x is not None for x in verdicts[sl])
        correct = sum(bool(x) for x in verdicts[sl])
        if scored:
            out.counts.append((samples, correct))
        else:
            out.skipped += 1
        out.records.append({"set": s.name, "index": i, "prompt": prompts[i], "answer": row.get("answer"),
                            "completions": texts[sl], "rewards": r, "finish": finish[sl],
                            "correct": correct if scored else None})
    return out
