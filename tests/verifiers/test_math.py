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


# Forms latex2sympy reads unusually ("2(3)" = 5, "1 2" = 3, "2\frac{1}{2}" = 5/2, "\frac123" = 1/23, "2^23" = 2**23,
# "2^3^2" = 64, odd roots of negatives are complex) and ordinary ones: the evaluator must decline the former and
# agree in value with math-verify's parse on everything it accepts.
_ODD_FORMS = [r"2(3)", r"(2)(3)", r"{2}{3}", "1 2", r"2\frac{1}{2}", r"2\frac12", r"\frac123", r"\sqrt23", "2^23",
              "2^3^2", r"2^{3}^{2}", r"\sqrt[3]{-8}", r"\sqrt{-4}", "2.5.3", r"\pi2", r"\sqrt{2}3", r"(2)\sqrt{3}",
              r"\frac{1}{2}\pi", r"\frac{1}{2}(3)", "1,000", "2i", r"\infty", r"50\%", r"5^\circ", r"\pm 2", "x=5",
              r"\text{5}", "(1,2)", r"[0,1]", r"\{2\}", r"\left(2\right)", "1/2", "0^{-1}", r"\frac{1}{0}", "e",
              "-2^2", r"2\cdot-3", r"2\times-3", "--3", "+3", "2+-3", r"1-(2-3)", r"2^{-2}", "(-2)^3", r"10^{-3}",
              r"2\sqrt{2}\pi", r"2\pi\sqrt{2}", r"\pi\sqrt{2}", r"2\sqrt{2}^2", r"2\pi^2", r"1.5\sqrt{2}", r"0.5\pi",
              r"\frac {1}{2}", r"\frac{1} {2}", r"2 \pi", r"\sqrt {2}", r"2^{ 3 }", r"\sqrt[3]{8}", r"\sqrt[ 3 ]{8}",
              r"2^2\sqrt{3}", r"5\cdot 2^{3}", r"3^{2}\cdot\pi", r"\sqrt{\pi}", r"\frac{-1}{2}", r"-\frac{\pi}{6}",
              r"3-2\sqrt{2}", r"\dfrac{3}{4}", r"\tfrac{3}{4}", "0.75", "12", "12.0"]
_MUST_DECLINE = _ODD_FORMS[:35]


def _mv_value(s):
    """math-verify's parse of ``s`` as a gold, as a complex number, or None if not a plain number."""
    from verifiers.math import gold_as_latex
    from verifiers.mv import parse_gold_cached

    parsed = list(parse_gold_cached(gold_as_latex(s)))
    assert parsed, s  # every string in the evaluator's grammar parses, so its "no box" / identical-text 1.0 hold
    try:
        return complex(parsed[0].evalf(30))
    except (TypeError, AttributeError):
        return None


def test_closed_form_value_declines_odd_forms_and_matches_math_verify_values():
    from verifiers.mv import closed_form_value

    assert [s for s in _MUST_DECLINE if closed_form_value(s) is not None] == []
    accepted = [s for s in _ODD_FORMS if closed_form_value(s) is not None]
    assert len(accepted) >= 35
    for s in accepted:
        v, ref = closed_form_value(s), _mv_value(s)
        assert ref is not None and abs(ref.imag) < 1e-12 and abs(v - ref.real) <= 1e-9 * max(1, abs(v)), (s, v, ref)


def _inequality_agrees(pairs):
    from verifiers.math import gold_as_latex
    from verifiers.mv import DEFAULT_ANSWER_CONFIG, mv_parse, mv_verify, parse_gold_cached, provably_distinct_latex

    answers, claimed, contradictions = {}, 0, []
    for gold, pred in pairs:
        if not provably_distinct_latex(pred, gold):
            continue
        claimed += 1
        if pred not in answers:
            answers[pred] = mv_parse("\\boxed{" + pred + "}", DEFAULT_ANSWER_CONFIG)
        if mv_verify(list(parse_gold_cached(gold_as_latex(gold))), answers[pred]):
            contradictions.append((gold, pred))
    return claimed, contradictions


def test_provably_distinct_latex_on_odd_forms():
    from verifiers.mv import closed_form_value

    accepted = [s for s in _ODD_FORMS if closed_form_value(s) is not None]
    claimed, bad = _inequality_agrees([(g, p) for g in accepted for p in accepted])
    assert bad == [] and claimed >= 800


def test_provably_distinct_latex_agrees_with_math_verify_on_math500(shared_data):
    """Every MATH500 gold in the evaluator's grammar: its value equals math-verify's parse; then all self-pairs and
    3000 deterministic cross pairs: whenever the evaluator claims inequality, ``verify`` says False."""
    import random

    from verifiers.mv import closed_form_value, provably_distinct_latex

    golds = sorted({r["answer"] for r in _rows(shared_data / "math500" / "test.jsonl")})
    accepted = [g for g in golds if closed_form_value(g) is not None]
    assert len(accepted) >= 150
    for g in accepted:
        ref = _mv_value(g)
        v = closed_form_value(g)
        assert ref is not None and abs(ref.imag) < 1e-12 and abs(v - ref.real) <= 1e-9 * max(1, abs(ref)), g
    assert not any(provably_distinct_latex(g, g) for g in accepted)
    rng = random.Random(0)
    pairs = [(rng.choice(accepted), rng.choice(accepted)) for _ in range(3000)]
    claimed, bad = _inequality_agrees(pairs)
    assert bad == [] and claimed >= 2500
