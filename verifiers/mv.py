"""math-verify backend: extraction configs of each source, cached gold parsing, and exact numeric fast paths.

math-verify (huggingface/Math-Verify; installed 0.9.0) is the symbolic comparator used by Open-R1 and
SimpleRL-Zoo. Its own timeouts use ``signal.alarm`` and therefore only work in the main thread and cannot
interrupt long C-level sympy/gmp calls; ``verifiers.pool`` adds a process-level wall clock on top.
"""
from __future__ import annotations

import functools
import re
import threading
from decimal import Decimal, InvalidOperation

from latex2sympy2_extended import NormalizationConfig
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

# Open-R1 accuracy_reward answer config (huggingface/open-r1 src/open_r1/rewards.py @ c1e1192):
# boxed first (priority 0), anchored only (no bare LaTeX), boxed="all". Open-R1 also passes equations=True;
# in latex2sympy2_extended >= 1.10 that flag is a deprecated no-op ("handled by the parser now") that only
# logs a warning per call, so it is left False here with no change in behaviour.
OPEN_R1_NORMALIZATION = NormalizationConfig(
    nits=False, malformed_operators=False, basic_latex=True, boxed="all", units=True
)
OPEN_R1_ANSWER_CONFIG = (
    LatexExtractionConfig(
        normalization_config=OPEN_R1_NORMALIZATION, boxed_match_priority=0, try_extract_without_anchor=False
    ),
)
# Our default: Open-R1's settings, but only the LAST boxed answer counts (boxed="last"; Open-R1's "all"
# turns "\boxed{3} ... \boxed{68}" into the set {3, 68}, which then matches neither 3 nor 68), and
# malformed_operators=True so "\frac43" / "\sqrt2" (8 of the 500 MATH500 gold answers) parse.
DEFAULT_ANSWER_CONFIG = (
    LatexExtractionConfig(
        normalization_config=NormalizationConfig(
            nits=False, malformed_operators=True, basic_latex=True, boxed="last", units=True
        ),
        boxed_match_priority=0,
        try_extract_without_anchor=False,
    ),
)
# math-verify's own default extraction (Latex + Expr), used for gold answers by Open-R1 and SimpleRL-Zoo.
GOLD_CONFIG = (LatexExtractionConfig(), ExprExtractionConfig())

# math-verify 0.5.2 defaults that Open-R1 ran with (reference open_r1.md §2): parse timeout 3 s,
# verify precision 6, strict, timeout 3 s. Passed explicitly so a newer math-verify gives the same behaviour.
PARSE_TIMEOUT = 3
VERIFY_TIMEOUT = 3


def _timeout(seconds: int | None) -> int | None:
    # signal.alarm only works in the main thread; elsewhere math-verify would raise, so run without its
    # alarm and rely on the caller's process-level timeout (verifiers.pool).
    return seconds if threading.current_thread() is threading.main_thread() else None


def mv_parse(text: str, config=GOLD_CONFIG, extraction_mode: str = "first_match", timeout: int | None = PARSE_TIMEOUT):
    return parse(text, list(config), extraction_mode=extraction_mode, parsing_timeout=_timeout(timeout))


def mv_verify(gold, answer, timeout: int | None = VERIFY_TIMEOUT) -> bool:
    return bool(verify(gold, answer, float_rounding=6, strict=True, timeout_seconds=_timeout(timeout)))


@functools.lru_cache(maxsize=65536)
def parse_gold_cached(gold: str, config=GOLD_CONFIG, extraction_mode: str = "first_match") -> tuple:
    """Parse a gold answer once (a group of G completions shares one gold). Parsed sympy objects are immutable."""
    return tuple(mv_parse(gold, config, extraction_mode=extraction_mode))


# Fast paths: plain integer / decimal literals only, no sign other than "-", no leading zeros, at most 15
# digits each side, so the answer is exact and identical to math-verify's (tests/verifiers check agreement).
_INT = re.compile(r"-?(?:0|[1-9]\d{0,14})")
_DEC = re.compile(r"-?(?:0|[1-9]\d{0,14})\.\d{1,15}")


def numeric_fast_path(pred: str, gold: str) -> float | None:
    """1.0/0.0 when both sides are plain numeric literals and the outcome is certain; None to fall back."""
    p, g = pred.strip(), gold.strip()
    if p == g and (_INT.fullmatch(p) or _DEC.fullmatch(p)):
        return 1.0
    if _INT.fullmatch(p) and _INT.fullmatch(g):
        return 1.0 if int(p) == int(g) else 0.0
    if (_INT.fullmatch(p) or _DEC.fullmatch(p)) and (_INT.fullmatch(g) or _DEC.fullmatch(g)):
        try:
            if Decimal(p) == Decimal(g):
                return 1.0
        except InvalidOperation:  # pragma: no cover - the regexes admit only valid literals
            return None
        # Unequal decimals can still be "equal" under math-verify's 6-digit rounding: let it decide.
        return None
    return None
