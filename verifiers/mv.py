"""math-verify backend: extraction configs of each source, cached gold parsing, and exact numeric fast paths.

math-verify (huggingface/Math-Verify; installed 0.9.0) is the symbolic comparator used by Open-R1 and
SimpleRL-Zoo. Its own timeouts use ``signal.alarm`` and therefore only work in the main thread and cannot
interrupt long C-level sympy/gmp calls; ``verifiers.pool`` adds a process-level wall clock on top.
"""
from __future__ import annotations

import cmath
import functools
import math
import re
import threading
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Sequence

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
# ASCII digits only: Python's \d, int() and float() also accept Unicode digits ("1３", "١٣", "𝟏𝟑" are 13 to
# them), which math-verify keeps as unparsed strings, so such answers must fall through to math-verify.
_INT = re.compile(r"-?(?:0|[1-9][0-9]{0,14})")
_DEC = re.compile(r"-?(?:0|[1-9][0-9]{0,14})\.[0-9]{1,15}")


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


# Exact LaTeX forms (``-``-signed integers, ``\\frac``/``\\dfrac``/``\\tfrac`` of integers, ``\\sqrt`` of a
# natural number). math-verify parses them to sympy Integer / Rational / sqrt(n), and for such values its verdict is
# exact equality: ``sympy_str_eq`` is ``a == b``, ``sympy_numeric_eq`` compares ``doit()`` values (no Float involved),
# the ``evalf(chop=True, n=15)`` branch cannot chop a non-zero difference of at least 1e-12, and ``simplify(a - b)``
# is zero only for equal values. Fraction parts have at most 6 digits so distinct fractions differ by >= 1e-12, and
# sqrt(n) (n < 1e6) is compared only with integers or another sqrt (distinct values differ by >= 5e-4).
_FRAC = re.compile(r"(-?)\\[dt]?frac\{(-?(?:0|[1-9][0-9]{0,5}))\}\{([1-9][0-9]{0,5})\}")
_SQRT = re.compile(r"\\sqrt\{(0|[1-9][0-9]{0,5})\}")


def exact_value(s: str) -> tuple[str, Fraction] | None:
    """``("rat", q)`` for an integer or integer fraction, ``("sqrt", n)`` for ``\\sqrt{n}``; None otherwise."""
    s = s.strip()
    if _INT.fullmatch(s):
        return "rat", Fraction(int(s))
    m = _FRAC.fullmatch(s)
    if m:
        q = Fraction(int(m.group(2)), int(m.group(3)))
        return "rat", -q if m.group(1) else q
    m = _SQRT.fullmatch(s)
    return ("sqrt", Fraction(int(m.group(1)))) if m else None


def _equal(a: tuple[str, Fraction], b: tuple[str, Fraction]) -> bool:
    if a[0] == b[0]:
        return a[1] == b[1]
    rad, q = (a[1], b[1]) if a[0] == "sqrt" else (b[1], a[1])
    return q >= 0 and q * q == rad  # sqrt(n) == m  <=>  m >= 0 and m^2 == n


def _comparable(a: tuple[str, Fraction], b: tuple[str, Fraction]) -> bool:
    # sqrt(n) against a non-integer fraction a/b can differ by ~1e-16, inside evalf's chop: leave it to math-verify.
    return a[0] == b[0] or (a[1].denominator == 1 and b[1].denominator == 1)


def latex_fast_path(pred: str, gold: str) -> float | None:
    """Plain numbers (``numeric_fast_path``), then exact fraction / sqrt forms; None to fall back to math-verify."""
    fast = numeric_fast_path(pred, gold)
    if fast is not None:
        return fast
    a, b = exact_value(pred), exact_value(gold)
    if a is None or b is None or not _comparable(a, b):
        return None
    return 1.0 if _equal(a, b) else 0.0


def _numeric(x) -> complex | None:
    """Value of a closed-form sympy number with no Float in it (30 digits), else None."""
    from sympy import Expr, Float, Symbol

    if not isinstance(x, Expr) or isinstance(x, Symbol) or not x.is_number or x.has(Float):
        return None
    try:
        v = complex(x.evalf(30))
    except (TypeError, ValueError, OverflowError, ZeroDivisionError):
        return None
    return v if cmath.isfinite(v) else None


def provably_unequal(gold: Sequence, answer: Sequence) -> bool:
    """True when math-verify's ``verify(gold, answer)`` is certainly False, without running ``simplify``.

    Pairs are (sympy, sympy): both closed-form numbers without Floats (not relations, sets, tuples, matrices or
    symbols) whose values differ by more than 1e-6 relative. For such pairs ``sympy_expr_eq`` can only succeed
    through ``a == b``, exact ``doit()`` equality, ``evalf(chop=True) == 0`` or ``simplify(a - b).is_zero``, all of
    which need equal values. (str, str) pairs must differ after ``strip``; mixed pairs always compare False.
    """
    if not gold or not answer:
        return False
    for g in gold:
        for t in answer:
            if isinstance(g, str) or isinstance(t, str):
                if isinstance(g, str) and isinstance(t, str) and g.strip() == t.strip():
                    return False
                continue
            a, b = _numeric(g), _numeric(t)
            if a is None or b is None or abs(a - b) <= 1e-6 * max(1.0, abs(a), abs(b)):
                return False
    return True


# ---------------------------------------------------------------------------------------------------------------
# Provable inequality of closed-form real numbers, decided in the caller without math-verify.
# ---------------------------------------------------------------------------------------------------------------
# re.ASCII: "\s" and "\d" then match ASCII only (a Unicode digit or space would otherwise reach float()).
_TOKEN = re.compile(
    r"\s*(?:(\d{1,30}(?:\.\d{1,30})?)|\\(dfrac|tfrac|frac|sqrt|pi|cdot|times)(?![A-Za-z])|([-+(){}\[\]^]))",
    re.ASCII,
)
_MAX_ABS = 1e100  # larger intermediate values: decline (float range and precision stay far from their limits)


class _Decline(Exception):
    pass


class _Eval:
    """Recursive descent over the token list; raises ``_Decline`` on anything outside the grammar."""

    def __init__(self, toks: list[tuple[str, str]]):
        self.toks, self.i = toks, 0

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, kind: str | None = None, val: str | None = None) -> tuple[str, str]:
        t = self.peek()
        if t is None or (kind is not None and t[0] != kind) or (val is not None and t[1] != val):
            raise _Decline
        self.i += 1
        return t

    def at(self, kind: str, *vals: str) -> bool:
        t = self.peek()
        return t is not None and t[0] == kind and (not vals or t[1] in vals)

    @staticmethod
    def check(v: float) -> float:
        if not (abs(v) <= _MAX_ABS):  # also rejects nan
            raise _Decline
        return v

    def expr(self) -> float:  # term (('+' | '-') term)*
        v = self.term()
        while self.at("op", "+", "-"):
            op = self.take()[1]
            v = self.check(v + self.term() if op == "+" else v - self.term())
        return v

    def term(self) -> float:  # unary ((\cdot | \times) unary)*
        v = self.unary()
        while self.at("cmd", "cdot", "times"):
            self.take()
            v = self.check(v * self.unary())
        return v

    def unary(self) -> float:  # ('-' | '+') unary | chain;  -2^2 = -(2^2), as latex2sympy reads it
        if self.at("op", "-", "+"):
            return -self.unary() if self.take()[1] == "-" else self.unary()
        return self.chain()

    def chain(self) -> float:
        # Implicit multiplication only as NUM? (\sqrt | \pi)*: "2\sqrt{3}\pi". latex2sympy reads "2(3)", "(2)(3)",
        # "{2}{3}" and "1 2" as SUMS and "2\frac{1}{2}" as a mixed number, so every other juxtaposition declines.
        juxtaposable = self.at("num") or self.at("cmd", "sqrt", "pi")  # not "(2)\sqrt{3}", "\frac{1}{2}\pi"
        v = self.power()
        while juxtaposable and self.at("cmd", "sqrt", "pi"):
            v = self.check(v * self.power())
        return v

    def power(self) -> float:  # primary ('^' ('{' [-+]? INT '}' | one digit))?; chained ^ declines
        base = self.primary()
        if not self.at("op", "^"):
            return base
        self.take()
        if self.at("op", "{"):
            self.take()
            sign = -1 if self.at("op", "-") else 1
            if self.at("op", "-", "+"):
                self.take()
            e = self.take("num")[1]
            self.take("op", "}")
        else:
            sign, e = 1, self.take("num")[1]
            if len(e) != 1:  # "2^23" is 2**23 to latex2sympy, "2^2.5" is unclear: decline
                raise _Decline
        if "." in e or len(e) > 3 or self.at("op", "^"):
            raise _Decline
        n = sign * int(e)
        if base == 0 and n <= 0:
            raise _Decline
        try:
            return self.check(float(base) ** n)
        except (OverflowError, ZeroDivisionError):
            raise _Decline from None

    def group(self) -> float:  # '{' expr '}'
        self.take("op", "{")
        v = self.expr()
        self.take("op", "}")
        return v

    def primary(self) -> float:
        t = self.take()
        if t[0] == "num":
            return self.check(float(t[1]))
        if t == ("op", "("):
            v = self.expr()
            self.take("op", ")")
            return v
        if t == ("op", "{"):
            self.i -= 1
            return self.group()
        if t[0] == "cmd" and t[1] in ("frac", "dfrac", "tfrac"):  # braced arguments only ("\frac123" is 1/23)
            num, den = self.group(), self.group()
            if den == 0:
                raise _Decline
            return self.check(num / den)
        if t == ("cmd", "sqrt"):
            root = 2
            if self.at("op", "["):
                self.take()
                r = self.take("num")[1]
                self.take("op", "]")
                if "." in r or not 2 <= int(r) <= 100:
                    raise _Decline
                root = int(r)
            x = self.group()  # braced radicand only ("\sqrt23" is sqrt(2)*3)
            if x < 0:  # sympy's principal root of a negative number is complex: decline
                raise _Decline
            return self.check(x ** (1.0 / root))
        if t == ("cmd", "pi"):
            return math.pi
        raise _Decline


@functools.lru_cache(maxsize=65536)
def closed_form_value(s: str) -> float | None:
    """Real value of ``s`` if it lies in a small unambiguous LaTeX grammar, else None.

    Grammar: decimal / integer literals (at most 30 digits each side), ``\\frac``/``\\dfrac``/``\\tfrac`` with braced
    arguments, ``\\sqrt{x}`` and ``\\sqrt[n]{x}`` (x >= 0), ``\\pi``, binary ``+ - \\cdot \\times``, unary ``-``/``+``,
    ``( )`` and ``{ }`` grouping, ``^{k}`` / ``^d`` with an integer k (|k| < 1000) or one digit (no chained ``^``), and
    implicit multiplication only as a number or ``\\sqrt``/``\\pi`` followed by ``\\sqrt``/``\\pi`` factors.
    Everything else -- letters (``i``, ``e``, units), ``\\infty``, ``,``, ``=``, ``/``, ``\\%``, ``\\text``,
    ``^\\circ``, ``\\pm``, ``\\left``, intervals, sets, matrices, any other command or juxtaposition -- gives None.
    """
    toks, pos, s = [], 0, s.strip()
    while pos < len(s):
        m = _TOKEN.match(s, pos)
        if m is None or m.end() == pos:
            return None
        pos = m.end()
        if m.group(1) is not None:
            toks.append(("num", m.group(1)))
        elif m.group(2) is not None:
            toks.append(("cmd", m.group(2)))
        else:
            toks.append(("op", m.group(3)))
    if not toks:
        return None
    p = _Eval(toks)
    try:
        v = p.expr()
    except (_Decline, RecursionError, ValueError, OverflowError, ZeroDivisionError):
        return None
    return v if p.i == len(toks) and math.isfinite(v) else None


def provably_distinct_latex(pred: str, gold: str) -> bool:
    """True when ``pred`` and ``gold`` are both in ``closed_form_value``'s grammar and their values are far apart.

    Why this never contradicts math-verify (``verify(gold, answer, float_rounding=6, strict=True)``): every string in
    the grammar is a closed-form real number that latex2sympy parses to the same value (the grammar excludes each
    form it reads unusually: "2(3)" = 5, "{2}{3}" = 5, "1 2" = 3, "2\\frac{1}{2}" = 5/2, "\\frac123" = 1/23,
    "2^23" = 2**23, "2^3^2" = (2^3)^2, odd roots of negatives, which sympy makes complex), so both parses are
    numbers with no symbols, relations, sets, tuples or matrices. For such a pair ``sympy_expr_eq`` can only succeed
    through ``str`` equality, exact ``doit()`` equality, ``round(6)`` equality when a Float is involved (values
    within 1e-6), ``evalf(chop=True, n=15)`` of the difference being 0, or ``simplify(a - b) == 0``: each needs the
    values to agree to ~1e-6. The extracted strings can only compare equal when the texts normalise identically,
    which preserves the value. So a float gap of more than 1e-4 * max(1, |a|, |b|) (float error here is ~1e-15
    relative) means math-verify says False. It is never used to declare equality. tests/verifiers/test_math.py
    checks it against math-verify on MATH500 gold pairs and on the odd forms above.
    """
    a, b = closed_form_value(pred), closed_form_value(gold)
    return a is not None and b is not None and abs(a - b) > 1e-4 * max(1.0, abs(a), abs(b))
