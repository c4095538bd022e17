"""``math`` verifiers backed by math-verify: our default (last ``\\boxed{}``) and Open-R1's accuracy reward.

Registered names (one function per source; pick by name in config, no branching at call sites):

* ``math`` -- default. Gold from ``answer`` (or ``solution`` / ``ground_truth``), parsed once per distinct gold
  with math-verify's default extractors; ``None`` when the gold cannot be parsed. Answer = content of the LAST
  ``\\boxed{}`` (brace-matched), compared by exact fast paths (``verifiers.mv.latex_fast_path``), else math-verify ``verify``
  (precision 6, strict) on ``parse("\\boxed{content}")`` with Open-R1's normalisation but ``boxed="last"``.
  No boxed answer -> 0.0.
* ``math_open_r1`` -- Open-R1 ``accuracy_reward`` exactly (huggingface/open-r1 src/open_r1/rewards.py @ c1e1192):
  gold = ``parse(solution, extraction_mode="first_match")``, empty -> None; answer parsed from the whole
  completion with boxed priority 0, anchored only, ``boxed="all"``; exception -> None.
* ``math_simplerl`` and ``math_tulu3`` live in ``verifiers/math_sources.py``.
"""
from __future__ import annotations

from verifiers._common import column, last_boxed_content, texts
from verifiers.mv import (
    DEFAULT_ANSWER_CONFIG,
    OPEN_R1_ANSWER_CONFIG,
    closed_form_value,
    exact_value,
    latex_fast_path,
    mv_parse,
    mv_verify,
    numeric_fast_path,
    parse_gold_cached,
    provably_distinct_latex,
    provably_unequal,
)
from verifiers.pool import map_scores

GOLD_COLUMNS = ("answer", "solution", "ground_truth")


def fast_default(text: str, gold: str) -> float | None:
    """In-process exact paths: identical answer text, or both sides plain numbers / integer fractions / sqrt (see
    ``verifiers.mv.latex_fast_path``), then provable inequality of two closed-form reals
    (``verifiers.mv.provably_distinct_latex``; never equality). Both gold grammars always parse in math-verify, so
    "no box" is a certain 0.0 and identical text a certain 1.0."""
    gold = str(gold)
    content = last_boxed_content(text)
    if exact_value(gold) is None and numeric_fast_path(gold, gold) != 1.0 and closed_form_value(gold) is None:
        return None  # gold parsing (~3 ms of antlr) happens in the pool, once per worker
    if content is not None and content.strip() == gold.strip():
        return 1.0
    if content is None:
        return 0.0
    fast = latex_fast_path(content, gold)
    if fast is None and provably_distinct_latex(content, gold):
        return 0.0  # distinct closed-form reals: math-verify's verdict is certainly False
    return fast


def answer_key(text: str, gold: str) -> tuple:
    """Samples with the same gold and boxed answer get the same ``score_default``: score one per call; the gold
    comes first so the pool's key order sends a gold's answers to one worker, which parses that gold once."""
    return str(gold), last_boxed_content(text)


def gold_as_latex(gold: str) -> str:
    """A bare gold answer such as ``\\frac{14}{3}`` has no LaTeX delimiters, so math-verify would not find it:
    wrap it in ``\\boxed{}`` (as SimpleRL-Zoo does). A full solution that already has a box is kept as is."""
    return gold if "\\boxed" in gold or "\\fbox" in gold else "\\boxed{" + gold + "}"


def score_default(text: str, gold: str) -> float | None:
    """One sample of ``math``: 1.0 / 0.0, or None when the gold cannot be parsed."""
    gold = str(gold)
    gold_parsed = parse_gold_cached(gold_as_latex(gold))
    if not gold_parsed:
        return None
    content = last_boxed_content(text)
    if content is None:
        return 0.0
    if content.strip() == gold.strip():
        return 1.0  # identical answer text: correct whenever the gold parses
    fast = latex_fast_path(content, gold)
    if fast is not None:
        return fast
    # Parsing only the extracted "\boxed{...}" instead of the whole (long) completion keeps the regex scan short.
    answer = mv_parse("\\boxed{" + content + "}", DEFAULT_ANSWER_CONFIG)
    if provably_unequal(gold_parsed, answer):
        return 0.0  # distinct closed-form numbers: skip math-verify's simplify (verifiers.mv.provably_unequal)
    return 1.0 if mv_verify(list(gold_parsed), answer) else 0.0


def _open_r1_fast_path(text: str, gold: str) -> float | None:
    # With exactly one \boxed, braced, and no Minerva "final answer is" phrase, Open-R1's boxed="all" extraction is
    # that box's content, so the exact numeric fast path gives math-verify's answer. math-verify reads no "\boxed 5"
    # (the spaced form, which last_boxed_content takes): that one goes to math-verify.
    if text.count("\\boxed") != 1 or text.count("\\boxed{") != 1 or "\\fbox" in text or \
            "final answer" in text.lower():
        return None
    content = last_boxed_content(text)
    return None if content is None else numeric_fast_path(content, gold)


def fast_open_r1(text: str, gold: str) -> float | None:
    gold = str(gold)
    if not (gold.strip() and numeric_fast_path(gold, gold) == 1.0):
        return None
    return _open_r1_fast_path(text, gold)


def score_open_r1(text: str, gold: str) -> float | None:
    """One sample of Open-R1 ``accuracy_reward`` (rewards.py @ c1e1192)."""
    gold = str(gold)
    gold_parsed = parse_gold_cached(gold)
    if len(gold_parsed) == 0:
        return None  # Open-R1: "If the gold solution is not parseable, we return `None` to skip this example"
    fast = _open_r1_fast_path(text, gold)
    if fast is not None:
        return fast
    try:
        answer = mv_parse(text, OPEN_R1_ANSWER_CONFIG)
        return float(mv_verify(list(gold_parsed), answer))
    except Exception:  # Open-R1 catches any verify error and returns None
        return None


def math_reward(completions, **columns) -> list[float | None]:
    """Default math verifier (see module docstring); ``timeout`` (s, per sample) and ``workers`` optional."""
    comps = texts(completions)
    golds = column(columns, GOLD_COLUMNS, len(comps), "math")
    return map_scores(score_default, list(zip(comps, golds)), fast_default, key=answer_key, **_pool_kwargs(columns))


def math_open_r1_reward(completions, **columns) -> list[float | None]:
    """Open-R1 accuracy reward; gold column ``solution`` (Open-R1's name), else ``answer``."""
    comps = texts(completions)
    golds = column(columns, ("solution", "answer", "ground_truth"), len(comps), "math_open_r1")
    return map_scores(score_open_r1, list(zip(comps, golds)), fast_open_r1, **_pool_kwargs(columns))


def _pool_kwargs(columns: dict) -> dict:
    return {k: columns[k] for k in ("timeout", "workers") if k in columns}
