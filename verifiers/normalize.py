"""Answer normalisation as data: a normaliser is an ordered table of steps, each a string-to-string function named
by the source line it reproduces, applied in order (:func:`run`). The sources' normalisers (Qwen2.5-Math's
``strip_string`` in ``verifiers/qwen_math_parser.py``, Minerva's and Hendrycks' in ``verifiers/tulu3_math_utils.py``)
are tables of these steps; their order is the sources' order, and tests/fidelity/rewards holds each table to the
source's own function over the reward corpus.

The LaTeX repairs two of those sources share (Hendrycks' MATH ``_fix_fracs``, ``_fix_a_slash_b``, ``_fix_sqrt``,
which Qwen2.5-Math and Open-Instruct both carry) are written here once, with the one way their copies differ as an
argument.
"""
from __future__ import annotations

import re
from typing import Callable, NamedTuple


class Step(NamedTuple):
    """One normalisation step: ``fn`` maps the answer string to the next; ``cite`` names the source line."""

    fn: Callable[[str], str]
    cite: str


def run(steps: tuple[Step, ...], text: str) -> str:
    for step in steps:
        text = step.fn(text)
    return text


def literal(old: str, new: str = "") -> Callable[[str], str]:
    """Every ``old`` replaced by ``new`` (``str.replace``)."""
    return lambda s: s.replace(old, new)


def pattern(regex: str, repl: str = "", flags: int = 0) -> Callable[[str], str]:
    """Every match of ``regex`` replaced by ``repl`` (``re.sub``)."""
    compiled = re.compile(regex, flags)
    return lambda s: compiled.sub(repl, s)


def replace_if(test: Callable[[str], bool], fn: Callable[[str], str]) -> Callable[[str], str]:
    """``fn(s)`` where ``test(s)``, else ``s``."""
    return lambda s: fn(s) if test(s) else s


def brace_fracs(s: str, short_piece: str = "keep") -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{72}`` -> ``\\frac{1}{72}``: after each ``\\frac`` not followed by
    ``{``, the first two characters become braced arguments (a ``{`` second character opens the denominator itself).
    A piece of fewer than two characters leaves the whole string as it was (``short_piece="keep"``, Qwen2.5-Math), or,
    when it is empty, raises IndexError as Open-Instruct's copy does (``"raise"``: it tests ``substr[0]`` first)."""
    head, *pieces = s.split("\\frac")
    out = [head]
    for piece in pieces:
        if short_piece == "raise" and not piece:
            raise IndexError("\\frac with nothing after it")
        if not piece.startswith("{"):
            if len(piece) < 2:
                return s
            numerator, second, rest = piece[0], piece[1], piece[2:]
            piece = "{" + numerator + "}" + (second if second == "{" else "{" + second + "}") + rest
        out.append(piece)
    return "\\frac".join(out)


def slash_to_frac(s: str, keep_sqrt: bool = False) -> str:
    """``a/b`` of two integers written as Python writes them back (``str(int(a)) == a``: no sign but ``-``, no
    leading zero, space or underscore) -> ``\\frac{a}{b}``. With ``keep_sqrt`` (Qwen2.5-Math) a side
    holding ``sqrt`` passes as it is and any error leaves the string; without (Open-Instruct), a side that is not an
    integer raises the ValueError of ``int`` (Open-Instruct catches only the AssertionError of a non-canonical one)."""
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:  # both sides through int() first, as the sources do, so the first ValueError is theirs
        canonical = [(keep_sqrt and "sqrt" in p) or str(int(p)) == p for p in parts]
    except ValueError:
        if keep_sqrt:
            return s
        raise
    return "\\frac{" + parts[0] + "}{" + parts[1] + "}" if all(canonical) else s


def brace_sqrt_first(s: str) -> str:
    """``\\sqrt3`` -> ``\\sqrt{3}``: the one character after each ``\\sqrt`` not followed by ``{`` gets braces
    (Hendrycks' ``_fix_sqrt``; a ``\\sqrt`` at the very end raises IndexError, as there)."""
    head, *pieces = s.split("\\sqrt")
    return "\\sqrt".join([head] + [p if p[0] == "{" else "{" + p[0] + "}" + p[1:] for p in pieces])


def cut_spaced_text_unit(s: str) -> str:
    """Hendrycks' ``_remove_right_units``: everything from ``\\text{ `` on is a unit and goes; a second one is an
    error (their ``assert len(splits) == 2``)."""
    head, found, tail = s.partition("\\text{ ")
    if found and "\\text{ " in tail:
        raise AssertionError("more than one '\\text{ ' unit")
    return head


def drop_short_lhs(s: str) -> str:
    """``k = 5`` -> `` 5``: one ``=`` whose left side has at most two characters keeps only its right side."""
    sides = s.split("=")
    return sides[1] if len(sides) == 2 and len(sides[0]) <= 2 else s


def lead_zero(s: str) -> str:
    """``.5`` -> ``0.5``."""
    return "0" + s if s.startswith(".") else s
