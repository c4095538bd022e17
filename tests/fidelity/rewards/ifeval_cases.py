"""IFEval rows of the reward corpus (tests/fidelity/rewards/corpus.py): for each of the 25 constraint checkers of
Tulu 3's IF-Mixed-Constraints (allenai/open-instruct ``open_instruct/if_functions.py``), constraints in the
data's ground-truth format and responses on each side of them and at their edges. Every response also comes with
white space around it and behind an ``<|assistant|>\\n`` of its own, the two things the sources' text handling
differs on (``ground_truth_utils.verify_ifeval_sample``: the release strips and cuts at the last
``<|assistant|>\\n``; the GRPO commit hands the checkers without arguments the response as it is).
"""
from __future__ import annotations

import json
import random

# The keys of a ground truth in allenai/RLVR-IFeval: every argument of every checker, null where unused.
KEYS = ("N", "quantifier", "end_phrase", "keyword_list", "word", "forbidden_words", "letter", "i", "first_word",
        "postscript_marker", "options", "section_splitter", "original_prompt", "language")
EN = "The weather was pleasant this morning, so we walked to the market and bought fresh bread and apples."
DE = "Das Wetter war heute Morgen angenehm, also gingen wir zum Markt und kauften frisches Brot und Äpfel."
LONG = " ".join(["word"] * 50)

CASES: list[tuple[str, dict, list[str]]] = [
    ("verify_keywords", {"keyword_list": ["apple", "Market"]}, [EN, "An APPLE a day.", "market apple", ""]),
    ("verify_keyword_frequency", {"word": "cat", "N": 2}, ["cat and cat", "Cat, cat, cat!", "cats cat", "concat cat"]),
    ("validate_forbidden_words", {"forbidden_words": ["bad", "Ugly"]}, ["all good", "a BAD day", "badge", "ugly"]),
    ("verify_letter_frequency", {"letter": "a", "N": 3}, ["banana", "Banana", "aaa", "bAnana"]),
    ("verify_letter_frequency", {"letter": "ab", "N": 1}, ["ab"]),
    ("validate_response_language", {"language": "en"}, [EN, DE]),
    ("validate_response_language", {"language": "de"}, [DE, EN, "12345 !!!"]),
    ("verify_paragraph_count", {"N": 2}, ["one\n* * *\ntwo", "one\n* * *\n\n* * *\ntwo", "one", "  a \n * * * \n b "]),
    ("validate_word_constraint", {"N": 10, "quantifier": "at least"}, [LONG, "too short here"]),
    ("validate_word_constraint", {"N": 50, "quantifier": "around"}, [LONG, LONG + " a b c d e", LONG + " a b c d e f"]),
    ("validate_word_constraint", {"N": 3, "quantifier": "at most"}, ["a b c", "a b c d"]),
    ("validate_word_constraint", {"N": 3, "quantifier": "exactly"}, ["a b c"]),
    ("verify_sentence_constraint", {"N": 3, "quantifier": "at least"},
     ["One. Two? Three!", "One. Two. Three.", "Mr. Smith went. Dr. Who came. e.g. this. Done."]),
    ("verify_sentence_constraint", {"N": 2, "quantifier": "around"}, ["Hi! Yo! Hey! Ho!", "A. B. C. D. E."]),
    ("verify_sentence_constraint", {"N": 1, "quantifier": "at most"}, ["Just one sentence here", "One. Two."]),
    ("validate_paragraphs", {"N": 2, "first_word": "Hello", "i": 2},
     ["Intro\n\nHello there", "Intro\n\nhello there", "Hello\n\nHello\n\nx", "one paragraph"]),
    ("validate_paragraphs", {"N": 1, "first_word": "A", "i": 3}, ["A single paragraph"]),
    ("verify_postscript", {"postscript_marker": "P.S."}, ["Text.\nP.S. more", "Text. P.S.", "no marker", "P.S.   "]),
    ("validate_placeholders", {"N": 2}, ["[name] and [place]", "only [one]", "none", "[][]"]),
    ("verify_bullet_points", {"N": 2}, ["* a\n* b", "- a\n* b\n- c", "* a", "  * a\n  - b"]),
    ("validate_title", {}, ["<<My Title>>\nbody", "no title", "<<>>"]),
    ("validate_choice", {"options": ["My answer is yes.", "My answer is no."]},
     ["My answer is yes.", "My answer is no. Because...", "yes", "My answer is maybe."]),
    ("validate_highlighted_sections", {"N": 2}, ["*one* and *two*", "*only one*", "**bold**", "no"]),
    ("validate_sections", {"N": 2, "section_splitter": "SECTION"},
     ["SECTION 1\nfoo\nSECTION 2\nbar", "SECTION 1 foo", "Intro\nSECTION 1\na\nSECTION 2\nb",
      "section 1 a section 2 b"]),
    ("validate_sections", {"N": 3, "section_splitter": "Part"}, ["Part 1 a Part 2 b Part 3 c", "Part a Part b Part c"]),
    ("validate_json_format", {}, ['{"a": 1}', "not json", "```json\n{\"a\": 1}\n```", "[1, 2]", ""]),
    ("validate_repeat_prompt", {"original_prompt": "Write a poem."},
     ["Write a poem. Roses are red.", "write a poem. x", "Roses. Write a poem."]),
    ("validate_two_responses", {}, ["first******second", "same ****** same", "a******b******c", "only one"]),
    ("validate_uppercase", {}, ["ALL CAPS 123", "Not caps", ""]),
    ("validate_lowercase", {}, ["all lower 123", "Not lower", "ß"]),
    ("validate_frequency_capital_words", {"N": 2, "quantifier": "at least"}, ["NASA and FBI", "Only NASA", "A B"]),
    ("validate_frequency_capital_words", {"N": 10, "quantifier": "around"},
     [" ".join(["ABC"] * 10), " ".join(["ABC"] * 11), " ".join(["ABC"] * 12)]),
    ("validate_frequency_capital_words", {"N": 1, "quantifier": "at most"}, ["ONE", "ONE TWO"]),
    ("validate_end", {"end_phrase": "Is there anything else I can help with?"},
     ["Sure. Is there anything else I can help with?", "Is there anything else I can help with?!", "no"]),
    ("validate_quotation", {}, ['"quoted"', '"half', "none", '"']),
    ("validate_no_commas", {}, ["no commas here", "one, comma", ""]),
]


def ground_truth(func_name: str, kwargs: dict, padded: bool) -> str:
    """The constraint as the data stores it: JSON, every key (null where unused) when ``padded``."""
    body = {k: kwargs.get(k) for k in KEYS} if padded else dict(kwargs)
    return json.dumps({"func_name": func_name, **body})


def variants(response: str) -> list[tuple[str, str]]:
    return [("plain", response), ("spaced", f"\n  {response}  \n"),
            ("assistant_inside", f"Draft.\n<|assistant|>\n{response}")]


def ifeval_rows(rng: random.Random) -> list[dict]:
    rows = []
    for func_name, kwargs, responses in CASES:
        for response in responses:
            for variant, text in variants(response):
                for padded in (True, False):
                    rows.append({"id": f"i{len(rows):05d}", "task": "ifeval", "set": "ifeval", "problem": "Respond.",
                                 "ground_truth": ground_truth(func_name, kwargs, padded), "completion": text,
                                 "end": rng.choice(["<|im_end|>", ""]),
                                 "case": f"{func_name}:{variant}:{'padded' if padded else 'minimal'}"})
    rows.append({"id": f"i{len(rows):05d}", "task": "ifeval", "set": "ifeval", "problem": "Respond.",
                 "ground_truth": json.dumps({"N": 2}), "completion": "text", "end": "", "case": "no_func_name"})
    return rows
