"""``ifeval``: one hand-made passing and failing response per checker, plus the Tulu 3 release switch."""
from __future__ import annotations

import json

import pytest

from verifiers import get_verifier
from verifiers.ifeval import CHECKERS, RELEASE_CHECKERS, RELEASE_OVERRIDES

# func_name -> (kwargs, response that satisfies the constraint, response that does not)
CASES = {
    "verify_keywords": ({"keyword_list": ["Apple", "pie"]}, "I like apple PIE.", "I like apple tart."),
    "verify_keyword_frequency": ({"word": "cat", "N": 2}, "Cat sat. The cat-nap ended.", "cat cat cat"),
    "validate_forbidden_words": ({"forbidden_words": ["bad", "evil"]}, "A good day.", "An EVIL plan."),
    "verify_letter_frequency": ({"letter": "z", "N": 2}, "zig zag", "zigzag Zz z"),
    "validate_response_language": ({"language": "fr"},
                                   "Bonjour, je suis très content de vous voir aujourd'hui dans cette belle ville.",
                                   "Hello, I am very happy to see you today in this beautiful city."),
    "verify_paragraph_count": ({"N": 2}, "First part.\n* * *\nSecond part.", "First.\n* * *\n* * *\nThird."),
    "validate_word_constraint": ({"N": 10, "quantifier": "around"}, " ".join(["w"] * 11), " ".join(["w"] * 12)),
    "verify_sentence_constraint": ({"N": 2, "quantifier": "at most"}, "One. Two.", "One. Two. Three?"),
    "validate_paragraphs": ({"N": 2, "first_word": "Then", "i": 2}, "Intro here.\n\nThen more.", "Intro.\n\nSo more."),
    "verify_postscript": ({"postscript_marker": "P.S."}, "Body.\nP.S. see you", "Body.\nP.S."),
    "validate_placeholders": ({"N": 2}, "Dear [name], at [address].", "Dear [name], hello."),
    "verify_bullet_points": ({"N": 2}, "* one\n- two\nend", "* one\n* two\n* three"),
    "validate_title": ({}, "<<My Poem>>\nroses", "My Poem\nroses"),
    "validate_choice": ({"options": ["My answer is yes.", "My answer is no."]},
                        "My answer is yes.", "I am not sure."),
    "validate_highlighted_sections": ({"N": 2}, "*one* and *two*", "*one* only"),
    "validate_sections": ({"N": 2, "section_splitter": "Section"}, "Section 1\nfoo\nSection 2\nbar",
                          "Section 1\nfoo and more"),
    "validate_json_format": ({}, '{"a": [1, 2]}', "{'a': 1}"),
    "validate_repeat_prompt": ({"original_prompt": "Write a poem."}, "Write a poem. Roses are red.",
                               "Sure! Write a poem."),
    "validate_two_responses": ({}, "Answer A.\n******\nAnswer B.", "Answer A.\n******\nAnswer A."),
    "validate_uppercase": ({}, "HELLO WORLD 42!", "HELLO World"),
    "validate_lowercase": ({}, "hello world 42!", "hello World"),
    "validate_frequency_capital_words": ({"N": 2, "quantifier": "at least"}, "USA and NASA", "USA and nasa"),
    "validate_end": ({"end_phrase": "Any other questions?"}, "Done. Any other questions?",
                     "Any other questions? Bye."),
    "validate_quotation": ({}, '"quoted text"', '"quoted text'),
    "validate_no_commas": ({}, "no commas here", "one, two"),
}


def _label(name: str, kwargs: dict, as_json: bool = True, nulls: bool = True):
    # Tulu 3 rows carry every kwarg of the schema, unused ones null.
    d = {"func_name": name, **kwargs, **({"unused_kwarg": None} if nulls else {})}
    return json.dumps(d) if as_json else d


def test_every_registered_checker_has_a_case():
    assert len(CHECKERS) == 25  # the IFEval taxonomy in open-instruct if_functions.py
    assert sorted(CASES) == sorted(CHECKERS)
    assert sorted(RELEASE_CHECKERS) == sorted(CHECKERS)


@pytest.mark.parametrize("release", [False, True])
def test_positive_and_negative_case_per_checker(release):
    f = get_verifier("ifeval")
    comps, labels, want = [], [], []
    for name, (kwargs, good, bad) in CASES.items():
        comps += [good, bad]
        labels += [_label(name, kwargs)] * 2
        bad_result = 1.0 if (release and name == "validate_placeholders") else 0.0
        want += [1.0, bad_result]
    got = f(comps, ground_truth=labels, release_behaviour=release)
    names = [n for n in CASES for _ in (0, 1)]
    wrong = [(n, i % 2, g) for i, (n, g, w) in enumerate(zip(names, got, want)) if g != w]
    assert wrong == []
    assert len(got) == 2 * len(CHECKERS) == 50


def test_release_placeholder_checker_always_passes():
    f = get_verifier("ifeval")
    label = [_label("validate_placeholders", {"N": 3})]
    assert f(["no placeholders at all"], ground_truth=label, release_behaviour=True) == [1.0]
    assert f(["no placeholders at all"], ground_truth=label) == [0.0]
    assert f(["[a] [b] [c]"], ground_truth=label) == [1.0]


@pytest.mark.parametrize("release,bug,no_placeholders,choice", [
    (True, None, 1.0, 1.0), (True, True, 1.0, 1.0), (True, False, 0.0, 1.0),  # the other release checkers stay
    (False, None, 0.0, 0.0), (False, True, 1.0, 0.0), (False, False, 0.0, 0.0),
])
def test_placeholder_tuple_bug_switches_that_checker_alone(release, bug, no_placeholders, choice):
    """``placeholder_tuple_bug``: the release's always-passing placeholder checker by name (null: as
    ``release_behaviour``); ``validate_choice`` ("ye" is in an option only as the release reads it) is untouched."""
    f = get_verifier("ifeval")
    labels = [_label("validate_placeholders", {"N": 3}), _label("validate_choice", {"options": ["yes", "no"]})]
    got = f(["no placeholders at all", "ye"], ground_truth=labels, release_behaviour=release,
            placeholder_tuple_bug=bug)
    assert got == [no_placeholders, choice]


@pytest.mark.parametrize("name,kwargs,text,fixed,release", [
    ("validate_choice", {"options": ["yes", "no"]}, "My answer is yes.", 1.0, 0.0),  # release: text in option
    ("validate_choice", {"options": ["yes", "no"]}, "ye", 0.0, 1.0),
    ("validate_sections", {"N": 2, "section_splitter": "SECTION"}, "SECTION 1 a SECTION 2 b SECTION 3 c", 1.0, 0.0),
    ("verify_sentence_constraint", {"N": 1, "quantifier": "at most"}, "Wow! Great.", 0.0, 1.0),
    ("validate_frequency_capital_words", {"N": 10, "quantifier": "around"}, " ".join(["OK"] * 11), 1.0, 0.0),
])
def test_release_differences(name, kwargs, text, fixed, release):
    assert name in RELEASE_OVERRIDES
    f = get_verifier("ifeval")
    label = [_label(name, kwargs)]
    assert f([text], ground_truth=label) == [fixed]
    assert f([text], ground_truth=label, release_behaviour=True) == [release]


def test_dispatch_edge_cases():
    f = get_verifier("ifeval")
    quote = '  "quoted"\n'
    # no kwargs at all: the release (3dd7a07d) strips the response first as for every checker; the GRPO commit
    # (c8b66a0e3) passes it as it is (tests/fidelity/rewards holds both to the sources)
    assert f([quote], ground_truth=[_label("validate_quotation", {}, nulls=False)]) == [1.0]
    assert f([quote], ground_truth=[_label("validate_quotation", {}, nulls=False)], release_behaviour=True) == [1.0]
    assert f([quote], ground_truth=[_label("validate_quotation", {}, nulls=False)], release_behaviour=True,
             open_instruct_text="grpo") == [0.0]
    assert f(["Draft.\n<|assistant|>\nlower"], ground_truth=[_label("validate_lowercase", {}, nulls=False)],
             open_instruct_text="grpo") == [0.0]  # the GRPO commit does not cut at "<|assistant|>\n"
    with pytest.raises(ValueError, match="open_instruct_text='tulu'"):
        f([quote], ground_truth=[_label("validate_quotation", {})], open_instruct_text="tulu")
    assert f([quote], ground_truth=[_label("validate_quotation", {})], release_behaviour=True) == [1.0]
    assert f(["<|user|>\nHi, there\n<|assistant|>\nno commas"],
             ground_truth=[_label("validate_no_commas", {}, as_json=False)]) == [1.0]
    assert f(["x", "x", "x"], ground_truth=['{"N": 2}', "not json", _label("no_such_checker", {})]) == [0.0, None, None]
    # checker errors fail the constraint instead of the batch
    assert f(["12345", "a"], ground_truth=[_label("validate_response_language", {"language": "en"}),
                                          _label("validate_paragraphs", {"N": 1, "first_word": "a", "i": 3})]) == [0.0, 0.0]
