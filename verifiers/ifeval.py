"""``ifeval``: Tulu 3 instruction-following constraint checkers (IF-Mixed-Constraints / allenai/RLVR-IFeval format).

Ground truth is one constraint: a JSON object (or dict) ``{"func_name": NAME, **kwargs}``; unused kwargs are
``null`` and dropped. The 25 checkers follow allenai/open-instruct ``open_instruct/if_functions.py`` and the dispatch
``ground_truth_utils.verify_ifeval_sample`` (Tulu 3 release era) / ``IFEvalVerifierOld`` (HEAD):

* ``release_behaviour=False`` (default) -- the fixed checkers as at open-instruct 021dd069 (HEAD ``if_functions.py``).
* ``release_behaviour=True`` -- the Tulu 3 release code (``if_functions.py`` last changed at 9c2d44be, the file at
  the release commit 3dd7a07d and at c8b66a0e3 of Tulu 3.1 GRPO, still carrying the placeholder bug fixed by
  7dba4c9e2, #587, 2025-03-13). Where it differs (``RELEASE_OVERRIDES``):
  - ``validate_placeholders`` returns a ``(bool, list)`` tuple, which is always truthy: **the placeholder constraint
    always passes** (the "placeholder checker that always passed");
  - ``validate_choice`` tests ``text in option`` (the response must be a substring of an option), not
    ``option in text``;
  - ``validate_sections`` counts ``text.split(splitter)`` pieces (leading empty piece dropped) ``== N``; HEAD
    requires at least N ``splitter <number>`` headers (IFEvalG SectionChecker);
  - ``verify_sentence_constraint`` splits sentences after ``.``/``?`` only (HEAD also after ``!``);
  - ``validate_frequency_capital_words`` "around" means exactly N (HEAD: within max(round(0.1 N), 1)).
* ``placeholder_tuple_bug`` -- the placeholder checker alone, named: true = the release's tuple (always passes),
  false = the fixed count; null (default) = as ``release_behaviour``. The Open-Instruct recipes set it true beside
  ``release_behaviour``, so turning the bug off keeps the other release checkers.

Text: the part after the last ``<|assistant|>\\n``, stripped (both versions). A checker without arguments reads it
the same way at the release (``open_instruct_text="release"``), and at the GRPO commit c8b66a0e3, whose
``verify_ifeval_sample`` no longer cuts or strips first, the response as it is (``"grpo"``). Reward 1.0 / 0.0. A
missing ``func_name`` -> 0.0 (as both versions); unreadable JSON or an unknown checker -> None (skip; the original
raised). A checker that raises (``langdetect`` on text with no letters, ``i`` beyond the paragraph count, a
multi-character "letter") -> 0.0, where the original's exception stopped the trainer.
``langdetect`` is seeded (``DetectorFactory.seed = 0``) so rewards are reproducible; the original was unseeded.
"""
from __future__ import annotations

import contextlib
import json
import logging
import re
from typing import Callable

from verifiers._common import column, open_instruct_response, texts

log = logging.getLogger(__name__)
GOLD_COLUMNS = ("ground_truth", "constraint", "answer")


def verify_keywords(text: str, keyword_list: list) -> bool:
    """All keywords present (case-insensitive substring)."""
    return all(k.lower() in text.lower() for k in keyword_list)


def verify_keyword_frequency(text: str, word: str, N: int) -> bool:
    """``word`` appears exactly N times among ``\\b\\w+\\b`` tokens (case-insensitive)."""
    return sum(1 for w in re.findall(r"\b\w+\b", text.lower()) if w == word.lower()) == N


def validate_forbidden_words(text: str, forbidden_words: list) -> bool:
    """None of the words occurs (case-insensitive substring)."""
    return not any(w.lower() in text.lower() for w in forbidden_words)


def verify_letter_frequency(text: str, letter: str, N: int) -> bool:
    """``letter`` (case-sensitive, one character) occurs exactly N times."""
    if len(letter) != 1:
        raise ValueError("Letter parameter must be a single character")
    return text.count(letter) == N


def validate_response_language(text: str, language: str) -> bool:
    """``langdetect.detect(text) == language`` (ISO 639-1 code)."""
    return _langdetect()(text) == language


def verify_paragraph_count(text: str, N: int) -> bool:
    """Exactly N non-empty paragraphs separated by the markdown divider ``* * *``."""
    text = "\n".join(line.strip() for line in text.splitlines()).strip()
    paragraphs = text.split("* * *")
    return all(p.strip() for p in paragraphs) and len(paragraphs) == N


def _quantified(actual: int, N: int, quantifier: str, around: int) -> bool:
    if quantifier == "at least":
        return actual >= N
    if quantifier == "at most":
        return actual <= N
    return quantifier == "around" and abs(actual - N) <= around


def validate_word_constraint(text: str, N: int, quantifier: str) -> bool:
    """Whitespace word count at least / at most / around (+-max(round(0.1 N), 1)) N."""
    return _quantified(len(text.strip().split()), N, quantifier, max(round(N * 0.1), 1))


_SENTENCE_HEAD = re.compile(r"(?<!\w\.\w.)(?<![A-Z][a-z]\.)(?<=\.|\?|!)\s")
_SENTENCE_RELEASE = re.compile(r"(?<!\w\.\w.)(?<![A-Z][a-z]\.)(?<=\.|\?)\s")


def verify_sentence_constraint(text: str, N: int, quantifier: str) -> bool:
    """Sentences (split after ``.``, ``?``, ``!`` + whitespace) at least / at most / around (+-1) N."""
    return _quantified(len(_SENTENCE_HEAD.split(text)), N, quantifier, 1)


def validate_paragraphs(text: str, N: int, first_word: str, i: int) -> bool:
    """Exactly N paragraphs split on ``\\n\\n`` and the i-th (1-based) starts with ``first_word``."""
    paragraphs = text.split("\n\n")
    return len(paragraphs) == N and paragraphs[i - 1].strip().startswith(first_word)


def verify_postscript(text: str, postscript_marker: str) -> bool:
    """The marker occurs and is followed by something (text from the first marker, stripped, is longer)."""
    if postscript_marker not in text:
        return False
    return len(text[text.find(postscript_marker):].strip()) > len(postscript_marker)


def validate_placeholders(text: str, N: int) -> bool:
    """At least N ``[...]`` placeholders."""
    return len(re.findall(r"\[(.*?)\]", text)) >= N


def verify_bullet_points(text: str, N: int) -> bool:
    """Exactly N lines starting (after strip) with ``*`` or ``-``."""
    return sum(1 for line in text.split("\n") if line.strip().startswith(("*", "-"))) == N


def validate_title(text: str) -> bool:
    """A ``<<title>>`` somewhere."""
    return bool(re.findall(r"<<(.*?)>>", text))


def validate_choice(text: str, options: list) -> bool:
    """Some option is a substring of the response."""
    return any(option in text for option in options)


def validate_highlighted_sections(text: str, N: int) -> bool:
    """At least N ``*highlighted*`` spans."""
    return len(re.findall(r"\*(.*?)\*", text)) >= N


def validate_sections(text: str, N: int, section_splitter: str) -> bool:
    """At least N ``<splitter> <number>`` headers (case-insensitive), IFEvalG SectionChecker."""
    pattern = r"\s?" + re.escape(section_splitter) + r"\s?\d+\s?"
    return len(re.split(pattern, text, flags=re.IGNORECASE)) - 1 >= N


def validate_json_format(text: str) -> bool:
    """The whole response parses as JSON (``json.loads`` raises no ValueError)."""
    with contextlib.suppress(ValueError):
        json.loads(text)
        return True
    return False


def validate_repeat_prompt(text: str, original_prompt: str) -> bool:
    """The response starts with the prompt verbatim."""
    return text.startswith(original_prompt)


def validate_two_responses(text: str) -> bool:
    """Exactly one ``******`` separator and two different (stripped) halves."""
    if text.count("******") != 1:
        return False
    first, second = text.split("******")
    return first.strip() != second.strip()


def validate_uppercase(text: str) -> bool:
    return text == text.upper()


def validate_lowercase(text: str) -> bool:
    return text == text.lower()


def validate_frequency_capital_words(text: str, N: int, quantifier: str) -> bool:
    """All-capital words ``\\b[A-Z]+\\b`` at least / at most / around (+-max(round(0.1 N), 1)) N."""
    return _quantified(len(re.findall(r"\b[A-Z]+\b", text)), N, quantifier, max(round(N * 0.1), 1))


def validate_end(text: str, end_phrase: str) -> bool:
    return text.endswith(end_phrase)


def validate_quotation(text: str) -> bool:
    return text.startswith('"') and text.endswith('"')


def validate_no_commas(text: str) -> bool:
    return "," not in text


CHECKERS: dict[str, Callable[..., object]] = {f.__name__: f for f in (
    verify_keywords, verify_keyword_frequency, validate_forbidden_words, verify_letter_frequency,
    validate_response_language, verify_paragraph_count, validate_word_constraint, verify_sentence_constraint,
    validate_paragraphs, verify_postscript, validate_placeholders, verify_bullet_points, validate_title,
    validate_choice, validate_highlighted_sections, validate_sections, validate_json_format, validate_repeat_prompt,
    validate_two_responses, validate_uppercase, validate_lowercase, validate_frequency_capital_words, validate_end,
    validate_quotation, validate_no_commas,
)}


# ---- Tulu 3 release versions of the five checkers that changed (if_functions.py @ 9c2d44be) ----

def release_validate_placeholders(text: str, N: int) -> tuple:
    """Release bug kept on purpose: returns ``(has_enough, placeholders)``; a non-empty tuple is always truthy."""
    placeholders = re.findall(r"\[(.*?)\]", text)
    return len(placeholders) >= N, placeholders


def release_validate_choice(text: str, options: list) -> bool:
    return any(text in option for option in options)


def release_validate_sections(text: str, N: int, section_splitter: str) -> bool:
    sections = text.split(section_splitter)
    if sections[0] == "":
        sections.pop(0)
    return len(sections) == N


def release_verify_sentence_constraint(text: str, N: int, quantifier: str) -> bool:
    return _quantified(len(_SENTENCE_RELEASE.split(text)), N, quantifier, 1)


def release_validate_frequency_capital_words(text: str, N: int, quantifier: str) -> bool:
    return _quantified(len(re.findall(r"\b[A-Z]+\b", text)), N, quantifier, 0)


RELEASE_OVERRIDES: dict[str, Callable[..., object]] = {
    "validate_placeholders": release_validate_placeholders,
    "validate_choice": release_validate_choice,
    "validate_sections": release_validate_sections,
    "verify_sentence_constraint": release_verify_sentence_constraint,
    "validate_frequency_capital_words": release_validate_frequency_capital_words,
}
RELEASE_CHECKERS = {**CHECKERS, **RELEASE_OVERRIDES}


def _langdetect() -> Callable[[str], str]:
    from langdetect import DetectorFactory, detect

    DetectorFactory.seed = 0
    return detect


def _constraint(label) -> dict | None:
    if isinstance(label, dict):
        return dict(label)
    try:
        parsed = json.loads(label)
    except (TypeError, ValueError):
        log.warning("ifeval: ground truth is not JSON: %.200r", label)
        return None
    return parsed if isinstance(parsed, dict) else None


def score_ifeval(text: str, label, release_behaviour: bool = False, placeholder_tuple_bug: bool | None = None,
                 open_instruct_text: str = "release") -> float | None:
    """One sample: 1.0 if the constraint holds, 0.0 if not (or func_name missing), None if unreadable/unknown."""
    constraint = _constraint(label)
    if constraint is None:
        return None
    if "func_name" not in constraint:
        return 0.0
    checkers = RELEASE_CHECKERS if release_behaviour else CHECKERS
    if placeholder_tuple_bug is not None:
        bugged = RELEASE_OVERRIDES if placeholder_tuple_bug else CHECKERS
        checkers = {**checkers, "validate_placeholders": bugged["validate_placeholders"]}
    func = checkers.get(constraint.pop("func_name"))
    if func is None:
        return None
    kwargs = {k: v for k, v in constraint.items() if v is not None}
    try:
        if not constraint:  # a checker without arguments reads the response as open_instruct_text says
            return float(bool(func(open_instruct_response(text, open_instruct_text))))
        return float(bool(func(text.split("<|assistant|>\n")[-1].strip(), **kwargs)))
    except Exception as e:  # noqa: BLE001 - a checker error fails the constraint, not the batch
        log.warning("ifeval: %s raised %s: %s", func.__name__, type(e).__name__, e)
        return 0.0


def ifeval_reward(completions, release_behaviour: bool = False, placeholder_tuple_bug: bool | None = None,
                  open_instruct_text: str = "release", **columns) -> list[float | None]:
    """Tulu 3 IF constraint reward; column ``ground_truth`` (or ``constraint``/``answer``);
    ``release_behaviour=True`` reproduces the Tulu 3 release checkers (always-passing placeholders, see module doc);
    ``placeholder_tuple_bug`` switches that one checker by name (null: as ``release_behaviour``);
    ``open_instruct_text`` ("release" or "grpo") is the text a checker without arguments reads."""
    comps = texts(completions)
    open_instruct_response("", open_instruct_text)  # an unknown value is refused before any sample is scored
    labels = column(columns, GOLD_COLUMNS, len(comps), "ifeval")
    bug = None if placeholder_tuple_bug is None else bool(placeholder_tuple_bug)
    return [score_ifeval(c, g, bool(release_behaviour), bug, open_instruct_text) for c, g in zip(comps, labels)]
