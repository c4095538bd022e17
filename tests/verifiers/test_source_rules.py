"""The sources' reward rules where the reward corpus (tests/fidelity/rewards; docs/fidelity.md "Rewards") found ours
apart from them: each case's expected value is what the source's own function gives (Open-Instruct
``open_instruct/math_utils.py`` @3dd7a07d, Open-R1 ``accuracy_reward`` on math-verify, Open-Instruct
``ground_truth_utils.py`` @c8b66a0e3), run in tests/fidelity/rewards/envs.sh's envs."""
from __future__ import annotations

import pytest

from verifiers import get_verifier
from verifiers.tulu3_math_utils import hendrycks_is_equiv, hendrycks_strip_string


def test_hendrycks_falls_back_to_the_raw_strings_where_its_normalisation_raises():
    # fix_a_slash_b catches only the AssertionError of a non-canonical integer: int("x") raises ValueError, so
    # hendrycks_is_equiv compares "x / 2" with "x/2" as given (False), not after stripping the spaces (True).
    assert hendrycks_is_equiv("x / 2", "x/2") is False
    assert hendrycks_is_equiv("x/2", "x/2") is True
    from verifiers.normalize import brace_fracs, slash_to_frac

    with pytest.raises(ValueError):
        slash_to_frac("x/2")
    assert slash_to_frac("x/2", keep_sqrt=True) == "x/2" and slash_to_frac("3/4") == "\\frac{3}{4}"
    # fix_fracs tests the first character of what follows "\frac" before its length: a bare "\frac" raises
    with pytest.raises(IndexError):
        hendrycks_strip_string("1+\\frac")
    assert brace_fracs("1+\\frac") == "1+\\frac" and brace_fracs("\\frac12") == "\\frac{1}{2}"


def test_hendrycks_removes_percent_signs_twice():
    # strip_string replaces "\\%" and then "\%", the same string: a second pass, which "\\\%" needs
    assert hendrycks_strip_string("x=1\\\\\\%%square") == "1square"


def test_every_step_cites_its_source_line():
    from verifiers.qwen_math_parser import STRIP_STEPS
    from verifiers.tulu3_math_utils import HENDRYCKS_STEPS, MINERVA_STEPS

    for steps in (STRIP_STEPS, MINERVA_STEPS, HENDRYCKS_STEPS):
        assert steps and all(step.cite.startswith("L") for step in steps)


def test_open_r1_reads_no_spaced_box():
    # math-verify (0.5.2, Open-R1's pin, and ours) extracts nothing from "\boxed 180180$": Open-R1 scores 0.0
    text = "First, I set up the equations. The result is \\boxed 180180$ done"
    assert get_verifier("math_open_r1")([text], solution=["180180"], workers=0) == [0.0]
    assert get_verifier("math_open_r1")(["The result is $\\boxed{180180}$"], solution=["180180"], workers=0) == [1.0]


def test_open_instruct_text_release_or_grpo():
    # the release cuts at the last "<|assistant|>\n" and strips; the GRPO commit (c8b66a0e3) takes the response as it
    # is: a response without a number is compared whole with the label
    gsm8k = get_verifier("gsm8k")
    assert gsm8k(["\n\n  abc  \n\n"], ground_truth=["abc"]) == [1.0]
    assert gsm8k(["\n\n  abc  \n\n"], ground_truth=["abc"], open_instruct_text="grpo") == [0.0]
    assert gsm8k(["<|assistant|>\n7 or 8"], ground_truth=["8"], open_instruct_text="grpo") == [1.0]
    with pytest.raises(ValueError, match="open_instruct_text='3dd7a07d'"):
        gsm8k(["7"], ground_truth=["7"], open_instruct_text="3dd7a07d")
    with pytest.raises(ValueError, match="open_instruct_text"):
        get_verifier("math_tulu3")(["7"], ground_truth=["7"], open_instruct_text="tulu")


def test_the_antlr_backend_is_picked_where_it_works(monkeypatch):
    # sympy's ANTLR LaTeX backend (the release's; it needs antlr4 4.11) returns unevaluated expressions: \frac{1}{2}
    # is Mul(1, Pow(2, -1), evaluate=False), equal in value to Rational(1, 2) but not the same object. With antlr4 4.11
    # and sympy 1.14 (a scratch env), math_tulu3 then equals both Open-Instruct commits on all 2,170 corpus math rows.
    import sympy
    import sympy.parsing.latex

    from verifiers.tulu3_math_utils import _pick_backend

    def parse_latex(text, backend):
        assert text == r"\frac{1}{2}"
        return sympy.Mul(1, sympy.Pow(2, -1, evaluate=False), evaluate=False)

    monkeypatch.setattr(sympy.parsing.latex, "parse_latex", parse_latex)
    assert _pick_backend() == "antlr"
