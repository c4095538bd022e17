"""Qwen2.5-Math's answer extraction and normalisation, the rules SimpleRL-Zoo's reward runs.

Source of the rules: hkust-nlp/simpleRL-reason (branch v1 @ cf1c785)
``verl/utils/reward_score/qwen_math_eval_toolkit/parser.py`` (from QwenLM/Qwen2.5-Math ``evaluation/parser.py``, MIT,
(c) 2024 Zhibin Gou): ``extract_answer`` (lines 499-569) and ``strip_string`` (212-350). Here they are tables: the
ordered extraction triggers (:data:`TRIGGERS`) and the ordered normalisation steps (:data:`STRIP_STEPS`), each
citing its line in that file (``L<n>``), run by ``verifiers.normalize``. Their quirks are kept because the reward
depends on them: ``"and"`` is removed anywhere, one-letter unit words go (``"a"``, ``"s"``, ``"m"``...), a word
number becomes digits through the ``word2number`` package (optional: without it that step is skipped, with a
warning). tests/fidelity/rewards holds the whole reward to the source's own over the reward corpus.
"""
from __future__ import annotations

import logging
import re
from typing import Callable, NamedTuple

from verifiers.normalize import Step, brace_fracs, drop_short_lhs, lead_zero, literal, pattern, replace_if, run
from verifiers.normalize import slash_to_frac

log = logging.getLogger(__name__)
try:  # pure-python dependency of the original toolkit
    from word2number import w2n
except ImportError:  # pragma: no cover - depends on the environment
    w2n = None
    log.warning("word2number is not installed: SimpleRL/Qwen-Math strip_string skips word-number conversion")

# Unit words removed from an answer (L74-207, "units mainly from MathQA", in its order, duplicates and misspellings
# included); :func:`_units` adds each with an "s" (L209). Used as regular expressions, unescaped, as there.
UNITS = (
    "east", "degree", "mph", "kmph", "ft", "m sqaure", " m east", "sq m", "deg", "mile", "q .", "monkey", "prime",
    "ratio", "profit of rs", "rd", "o", "gm", "p . m", "lb", "tile", "per", "dm", "lt", "gain", "ab", "way", "west",
    "a .", "b .", "c .", "d .", "e .", "f .", "g .", "h .", "t", "a", "h", "no change", "men", "soldier", "pie",
    "bc", "excess", "st", "inches", "noon", "percent", "by", "gal", "kmh", "c", "acre", "rise", "a . m", "th",
    "π r 2", "sq", "mark", "l", "toy", "coin", "sq . m", "gallon", "° f", "profit", "minw", "yr", "women", "feet",
    "am", "pm", "hr", "cu cm", "square", "v â € ™", "are", "rupee", "rounds", "cubic", "cc", "mtr", "s", "ohm",
    "number", "kmph", "day", "hour", "minute", "min", "second", "man", "woman", "sec", "cube", "mt", "sq inch", "mp",
    "∏ cm ³", "hectare", "more", "sec", "unit", "cu . m", "cm 2", "rs .", "rs", "kg", "g", "month", "km", "m", "cm",
    "mm", "apple", "liter", "loss", "yard", "pure", "year", "increase", "decrease", "d", "less", "Surface", "litre",
    "pi sq m", "s .", "metre", "meter", "inch",
)


_UNIT_RES = tuple(re.compile(r"(^|\W)" + unit + r"($|\W)") for unit in UNITS + tuple(u + "s" for u in UNITS))


def _units(text: str) -> str:
    """L252-260: two passes over the unit words; each removal that would leave nothing is not made."""
    for _ in range(2):
        for unit_re in _UNIT_RES:
            text = unit_re.sub(r"\1\2", text) or text
    return text


def _trailing_text(text: str) -> str:
    """L247-250: a ``\\text{...}`` at the end goes (and the result is stripped) unless nothing would be left."""
    return re.sub(r"\\text{.*?}$", "", text).strip() or text


def _word_number(text: str) -> str:
    """L65-70 and L272: the whole answer read as an English number, if ``word2number`` can."""
    try:
        return str(w2n.word_to_num(text)) if w2n is not None else text
    except Exception:  # noqa: BLE001 - the source swallows every error of word_to_num
        return text


def _bracketed_alnum(text: str) -> bool:
    # L292-302 strips an outer {}, () or [] from an alphanumeric string; isalnum() is false for any string holding a
    # bracket, so the rule never fires. Kept so the table stays the source's.
    return len(text) > 1 and text[0] + text[-1] in ("{}", "()", "[]") and text.isalnum()


BEFORE_UNITS: tuple[Step, ...] = (
    Step(lambda s: str(s).strip(), "L213"), Step(literal("\n"), "L215"), Step(lambda s: s.rstrip("."), "L218"),
    Step(literal("\\!"), "L222"),
    Step(pattern(r"\\begin\{array\}\{.*?\}", r"\\begin{pmatrix}"), "L227"),
    Step(pattern(r"\\end\{array\}", r"\\end{pmatrix}"), "L228"), Step(literal("bmatrix", "pmatrix"), "L229"),
    Step(literal("tfrac", "frac"), "L232"), Step(literal("dfrac", "frac"), "L233"),
    Step(literal("\\neq", "\\ne"), "L235"), Step(literal("\\leq", "\\le"), "L236"),
    Step(literal("\\geq", "\\ge"), "L237"),
    Step(literal("\\left"), "L241"), Step(literal("\\right"), "L242"),
    Step(literal("\\{", "{"), "L243"), Step(literal("\\}", "}"), "L244"),
    Step(_trailing_text, "L247-250"),
)
UNIT_STEP = Step(_units, "L252-260")
AFTER_UNITS: tuple[Step, ...] = (
    Step(literal("^{\\circ}"), "L263"), Step(literal("^\\circ"), "L264"),
    Step(literal("\\$"), "L267"), Step(literal("$"), "L268"),
    Step(literal("\\("), "L269"), Step(literal("\\)"), "L269"),
    Step(_word_number, "L272"),
    Step(pattern(r"\\text\{(.*?)\}", r"\1"), "L275"),
    *(Step(literal(key), "L276-277")
      for key in ("x=", "y=", "z=", "x\\in", "y\\in", "z\\in", "x\\to", "y\\to", "z\\to")),
    Step(literal("\\emptyset", "{}"), "L278"), Step(literal("(-\\infty,\\infty)", "\\mathbb{R}"), "L279"),
    Step(literal("\\%"), "L282"), Step(literal("\\%"), "L283 (the same string again: a second pass)"),
    Step(literal("%"), "L284"),
    Step(literal(" .", " 0."), "L287"), Step(literal("{.", "{0."), "L288"),
    Step(replace_if(_bracketed_alnum, lambda s: s[1:-1]), "L292-303"),
    Step(literal("infinity", "\\infty"), "L306"),
    Step(replace_if(lambda s: "\\infty" not in s, literal("inf", "\\infty")), "L307-308"),
    Step(literal("+\\inity", "\\infty"), "L309"),
    Step(literal("and"), "L312"), Step(literal("\\mathbf"), "L313"),
    Step(pattern(r"\\mbox{.*?}"), "L316"),
    # L319-320 call str.replace for quotes and drop the result: no step.
    Step(replace_if(lambda s: "j" in s and "i" not in s, literal("j", "i")), "L323-324"),
    Step(pattern(r"(\d+)\.0*([^\d])", r"\1\2"), "L327"), Step(pattern(r"(\d+)\.0*$", r"\1"), "L328"),
    # L331-332 return an empty string early; every later step leaves "" as it is.
    Step(lead_zero, "L333-334"), Step(drop_short_lhs, "L337-339"),
    Step(pattern(r"\\sqrt(\w+)", r"\\sqrt{\1}"), "L341 (_fix_sqrt, L60-62)"), Step(literal(" "), "L342"),
    Step(brace_fracs, "L345 (_fix_fracs, L11-40)"),
    Step(lambda s: slash_to_frac(s, keep_sqrt=True), "L348 (_fix_a_slash_b, L43-57)"),
)
STRIP_STEPS = BEFORE_UNITS + (UNIT_STEP,) + AFTER_UNITS
# Sets whose answers keep their units (L568, STRIP_EXCEPTIONS L572).
UNITS_KEPT = ("carp_en", "minerva_math")
# Multiple-choice sets take another path in the source (L501-503, L549-557), not reproduced here.
CHOICE_SETS = ("mmlu_stem", "sat_math", "aqua", "gaokao2023")


def strip_string(text, skip_unit: bool = False) -> str:
    """Qwen2.5-Math ``strip_string`` (L212-350): :data:`STRIP_STEPS` in order, the unit step left out with
    ``skip_unit``."""
    return run(BEFORE_UNITS + AFTER_UNITS if skip_unit else STRIP_STEPS, text)


def boxed_content(text: str) -> str:
    """After the last ``boxed``: the brace-matched group (unclosed: all that follows), or for ``\\boxed 5`` what
    comes before the next ``$``, stripped (L510-529; ``find_box``, L411-431, is the same)."""
    tail = text.split("boxed")[-1]
    if not tail.startswith("{"):
        return tail.split("$")[0].strip()
    depth = 0
    for end, ch in enumerate(tail):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth == 0:
            return tail[1:end]
    return tail[1:]


def _last_number(text: str) -> str:
    found = re.findall(r"-?\d*\.?\d+", text.replace(",", ""))
    return found[-1] if found else ""


class Trigger(NamedTuple):
    """An extraction rule: the first whose ``when`` holds takes the answer with ``take``."""

    when: Callable[[str], bool]
    take: Callable[[str], str]
    cite: str


TRIGGERS: tuple[Trigger, ...] = (
    Trigger(lambda s: "final answer is $" in s and "$. I hope" in s,
            lambda s: s.split("final answer is $", 1)[1].split("$. I hope", 1)[0].strip(), "L505-508 (Minerva)"),
    Trigger(lambda s: "boxed" in s, boxed_content, "L509-529"),
    Trigger(lambda s: "he answer is" in s, lambda s: s.split("he answer is")[-1].strip(), "L530-531"),
    Trigger(lambda s: "final answer is" in s, lambda s: s.split("final answer is")[-1].strip(), "L532-533"),
    Trigger(lambda s: "答案是" in s, lambda s: s.split("答案是")[1].strip().split("\n\n")[0].strip(), "L534-536"),
)
# L561-567, after extraction: line breaks with their indentation go, then one leading ":" and one trailing "." and "/".
TIDY_STEPS: tuple[Step, ...] = (
    Step(pattern(r"\n\s*"), "L561"), Step(replace_if(lambda s: s.startswith(":"), lambda s: s[1:]), "L562-563"),
    Step(replace_if(lambda s: s.endswith("."), lambda s: s[:-1]), "L564-565"),
    Step(replace_if(lambda s: s.endswith("/"), lambda s: s[:-1]), "L566-567"),
)


def extract_answer(pred_str: str, data_name: str = "math", use_last_number: bool = True) -> str:
    """Qwen2.5-Math ``extract_answer`` (L499-569): the first :data:`TRIGGERS` rule that applies, else the last number
    (L537-546, with ``use_last_number``), tidied (:data:`TIDY_STEPS`) and normalised (:func:`strip_string`, units kept
    for :data:`UNITS_KEPT`)."""
    if data_name in CHOICE_SETS or "mmlu" in data_name:
        raise ValueError(f"extract_answer: data_name {data_name!r} is a multiple-choice set, whose extraction is not "
                         f"reproduced here (math sets only)")
    text = pred_str.replace("\u043a\u0438", "")  # L500
    rule = next((t for t in TRIGGERS if t.when(text)), None)
    pred = rule.take(text) if rule else _last_number(text) if use_last_number else ""
    return strip_string(run(TIDY_STEPS, pred), skip_unit=data_name in UNITS_KEPT)
