"""Format and shaping rewards of Open-R1 (huggingface/open-r1 ``src/open_r1/rewards.py`` @ c1e1192).

Registered: ``format`` (R1 think/answer), ``code_format`` (the same with a fenced code block in the answer),
``tag_count``, ``reasoning_steps``, ``cosine`` (Yeo et al. 2025,
"Demystifying long CoT"), ``repetition_penalty`` (same paper, App. C.2), ``soft_overlong_punishment`` (DAPO,
Yu et al. 2025, Eq. 13). Parameters are keyword columns with Open-Instruct/Open-R1 script defaults.
"""
from __future__ import annotations

import math
import re

from verifiers._common import column, texts

FORMAT_RE = re.compile(r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$", re.DOTALL | re.MULTILINE)
STEPS_RE = re.compile(r"(Step \d+:|^\d+\.|\n-|\n\*|First,|Second,|Next,|Finally,)")


def format_reward(completions, **_) -> list[float]:
    """1 if the whole completion is ``<think>\\n...\\n</think>\\n<answer>\\n...\\n</answer>`` (strict newlines)."""
    return [1.0 if FORMAT_RE.match(c) else 0.0 for c in texts(completions)]


def code_format_pattern(language: str) -> str:
    """Open-R1 ``get_code_format_reward``'s pattern for ``language``, interpolated unescaped as there (the languages
    it names, python and cpp, hold no regex metacharacters)."""
    return rf"^<think>\n.*?\n</think>\n<answer>\n.*?```{language}.*?```.*?\n</answer>$"


def code_format_reward(completions, code_language: str = "python", **columns) -> list[float]:
    """1 if the completion is the ``format`` layout with a block opened by three backticks and the language inside
    the answer (``re.match``, DOTALL | MULTILINE, as Open-R1). The language is the row's ``language`` column when the
    rows have one (Open-R1: "mixed language training", the Codeforces rows), else ``code_language`` (Open-R1's
    script argument of that name, default python).

    >>> done = "<think>\\nplan\\n</think>\\n<answer>\\n```cpp\\nint main(){}\\n```\\n</answer>"
    >>> code_format_reward([done, done], language=["cpp", "python"])
    [1.0, 0.0]
    """
    comps = texts(completions)
    n = len(comps)
    languages = column(columns, ("language",), n, "code_format") if columns.get("language") is not None else \
        [code_language] * n
    return [1.0 if re.match(code_format_pattern(lang), text, re.DOTALL | re.MULTILINE) else 0.0
            for text, lang in zip(comps, languages)]


def tag_count_reward(completions, **_) -> list[float]:
    """0.25 per tag that appears exactly once: ``<think>\\n``, ``\\n</think>\\n``, ``\\n<answer>\\n``, ``\\n</answer>``."""
    tags = ("<think>\n", "\n</think>\n", "\n<answer>\n", "\n</answer>")
    return [sum(0.25 for t in tags if c.count(t) == 1) for c in texts(completions)]


def reasoning_steps_reward(completions, **_) -> list[float]:
    """min(1, n/3) for n step markers (one alternation regex, no MULTILINE: ``^`` is the string start)."""
    return [min(1.0, len(STEPS_RE.findall(c)) / 3) for c in texts(completions)]


def _correct(completions, columns) -> list[bool]:
    # Open-R1 measures correctness with its accuracy reward; unparseable gold counts as correct (reward 1.0 path).
    from verifiers import get_verifier

    acc = get_verifier("math_open_r1")(completions, **columns)
    return [a is None or a >= 1.0 for a in acc]


def cosine_reward(completions, min_value_wrong: float = 0.0, max_value_wrong: float = -0.5,
                  min_value_correct: float = 0.5, max_value_correct: float = 1.0, max_len: int = 1000,
                  **columns) -> list[float]:
    """Cosine length scaling; lengths in characters, p = len/max_len not clamped (Open-R1 behaviour)."""
    comps = texts(completions)
    out = []
    for text, ok in zip(comps, _correct(completions, columns)):
        c = math.cos(len(text) / max_len * math.pi)
        lo, hi = (min_value_correct, max_value_correct) if ok else (max_value_wrong, min_value_wrong)
        out.append(lo + 0.5 * (hi - lo) * (1.0 + c))
    return out


def repetition_penalty_reward(completions, ngram_size: int = 3, max_penalty: float = -1.0, **_) -> list[float]:
    """(1 - unique n-grams / n-grams) x max_penalty over lowercase whitespace words; < n words -> 0."""
    if max_penalty > 0:
        raise ValueError(f"max_penalty {max_penalty} should not be positive")
    out = []
    for text in texts(completions):
        words = text.lower().split()
        if not text or len(words) < ngram_size:
            out.append(0.0)
            continue
        grams = [tuple(words[i:i + ngram_size]) for i in range(len(words) - ngram_size + 1)]
        out.append((1 - len(set(grams)) / len(grams)) * max_penalty)
    return out


def soft_overlong_punishment(completions, completion_lengths=None, max_completion_len: int = 16384,
                             soft_punish_cache: int = 4096, **columns) -> list[float]:
    """DAPO Eq. 13 on token counts: 0 up to Lmax-C, linear to -1 at Lmax, -1 beyond.

    Pass ``completion_lengths`` (tokens, as Open-R1 uses ``completion_ids``) or ``completion_ids``."""
    n = len(completions)
    if completion_lengths is None:
        completion_lengths = [len(ids) for ids in column(columns, ("completion_ids",), n, "soft_overlong_punishment")]
    out = []
    for length in completion_lengths:
        if length <= max_completion_len - soft_punish_cache:
            out.append(0.0)
        elif length <= max_completion_len:
            out.append((max_completion_len - soft_punish_cache - length) / soft_punish_cache)
        else:
            out.append(-1.0)
    return out
