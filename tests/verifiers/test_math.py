"""``math`` verifiers: default behaviour, fast-path agreement with math-verify, Open-R1 exactness, MATH500."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verifiers import get_verifier, list_verifiers
from verifiers.math import score_default
from verifiers.mv import GOLD_CONFIG, mv_parse, mv_verify, numeric_fast_path


def test_default_math_integers_and_forms():
    m = get_verifier("math")
    comps = [r"so \boxed{68}", r"\boxed{67}", "no answer 68", r"\boxed{\frac{136}{2}}",
             r"\boxed{3} then finally \boxed{68}", r"\boxed{68.0}", [{"role": "assistant", "content": r"\boxed{68}"}]]
    assert m(comps, answer=["68"] * len(comps)) == [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]


def test_default_math_latex_golds_and_unparseable_gold():
    m = get_verifier("math")
    out = m([r"\boxed{\frac{1}{2}}", r"\boxed{0.5}", r"\boxed{x}", r"\boxed{\frac43}"],
            answer=[r"\frac12", "1/2", "", r"\frac{4}{3}"])
    assert out == [1.0, 1.0, None, 1.0]


def test_math_bad_input_errors():
    m = get_verifier("math")
    with pytest.raises(ValueError, match="needs one of the columns answer"):
        m([r"\boxed{1}"], question=["q"])
    with pytest.raises(ValueError, match="1 rows but there are 2 completions"):
        m([r"\boxed{1}", "x"], answer=["1"])
    with pytest.raises(TypeError):
        m(r"\boxed{1}", answer=["1"])
    with pytest.raises(KeyError, match="registered: .*math"):
        get_verifier("maths")


def test_variants_registered():
    names = set(list_verifiers())
    assert {"math", "math_open_r1"} <= names


_num = st.one_of(
    st.integers(-10**6, 10**6).map(str),
    st.decimals(-1000, 1000, places=3, allow_nan=False, allow_infinity=False).map(lambda d: format(d, "f")),
)


@settings(max_examples=150, deadline=None)
@given(_num, _num)
def test_numeric_fast_path_agrees_with_math_verify(pred, gold):
    fast = numeric_fast_path(pred, gold)
    if fast is None:
        return
    slow = mv_verify(mv_parse("\\boxed{" + gold + "}", GOLD_CONFIG), mv_parse("\\boxed{" + pred + "}", GOLD_CONFIG))
    assert fast == float(slow), (pred, gold)


def test_fast_path_declines_near_decimals():
    # math-verify rounds to 6 digits, so unequal decimals are left to it, never called wrong by the fast path.
    assert numeric_fast_path("3.1415927", "3.1415926") is None
    assert numeric_fast_path("68", "69") == 0.0
    assert numeric_fast_path("068", "68") is None


def test_open_r1_boxed_all_makes_a_set():
    # Open-R1's boxed="all": two boxes become {3, 68}, matching neither; our default takes the last one.
    r1 = get_verifier("math_open_r1")
    assert r1([r"\boxed{3} then \boxed{68}", r"\boxed{68}"], solution=["68", "68"]) == [0.0, 1.0]
    assert r1([r"\boxed{1}"], solution=[r"\frac14"]) == [None]  # bare LaTeX gold does not parse -> skip
    assert r1(["The answer is 1/4 no box"], solution=[r"$\frac14$"]) == [0.0]


def _rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_math500_reference_solutions_self_consistent(shared_data):
    rows = _rows(shared_data / "math500" / "test.jsonl")
    assert len(rows) == 500
    out = get_verifier("math")([r["solution"] for r in rows], answer=[r["answer"] for r in rows])
    assert len(out) == 500
    wrong = [(r["unique_id"], r["answer"]) for r, v in zip(rows, out) if v != 1.0]
    assert wrong == []  # 500/500; see docs/verifiers.md


def test_score_default_in_process_matches_pool():
    assert score_default(r"\boxed{\sqrt{2}/2}", r"\frac{\sqrt2}{2}") == 1.0
    assert get_verifier("math")([r"\boxed{\sqrt{2}/2}"], answer=[r"\frac{\sqrt2}{2}"]) == [1.0]


# Exact LaTeX forms the in-process fast path settles: every pair must get math-verify's own verdict.
_FORMS = ["8", "-8", "0", "-0", r"\frac{16}{2}", r"\dfrac{1}{2}", r"\tfrac{2}{4}", r"-\frac{3}{2}", r"\frac{-3}{2}",
          r"\frac{0}{5}", r"\sqrt{16}", r"\sqrt{17}", r"\sqrt{4}", "-2", "2", "4", r"\frac{1}{3}", "0.5"]


def test_latex_fast_path_agrees_with_math_verify():
    from verifiers.math import gold_as_latex
    from verifiers.mv import DEFAULT_ANSWER_CONFIG, latex_fast_path, mv_parse, mv_verify, parse_gold_cached

    settled = 0
    for gold in _FORMS:
        for pred in _FORMS:
            fast = latex_fast_path(pred, gold)
            if fast is None:
                continue
            settled += 1
            ref = mv_verify(list(parse_gold_cached(gold_as_latex(gold))), mv_parse("\\boxed{" + pred + "}", DEFAULT_ANSWER_CONFIG))
            assert fast == float(ref), (pred, gold)
    assert settled >= 250  # of 18 x 18 pairs; sqrt vs non-integer fractions and decimals fall back


@pytest.mark.parametrize("gold,pred,unequal", [
    (r"\frac{8}{21}", "16", True), (r"\sqrt{53}", "31", True), (r"2\sqrt{2}", "3", True), (r"\pi", "3", True),
    ("1+2i", r"\frac{1}{2}", False),  # i parses as a symbol: left to math-verify
    (r"\frac{\sqrt{3}}{2}", r"\frac{1}{2}\sqrt{3}", False),  # equal values: run verify
    ("p - q", "9", False), ("x=5", "5", False), ("0.5", r"\frac{1}{2}", False), (r"(1,2)", "1", False),
])
def test_provably_unequal_only_when_math_verify_says_no(gold, pred, unequal):
    from verifiers.math import gold_as_latex
    from verifiers.mv import DEFAULT_ANSWER_CONFIG, mv_parse, mv_verify, parse_gold_cached, provably_unequal

    g, a = list(parse_gold_cached(gold_as_latex(gold))), mv_parse("\\boxed{" + pred + "}", DEFAULT_ANSWER_CONFIG)
    assert provably_unequal(g, a) is unequal
    if unequal:
        assert mv_verify(g, a) is False
