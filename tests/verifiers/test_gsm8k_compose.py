"""GSM8K verifiers (Open-Instruct exact and tolerant), reward composition, source-exact math variants."""
from __future__ import annotations

import json
import math

import pytest

from verifiers import get_verifier
from verifiers.compose import ComposedReward, open_instruct_reward
from verifiers.math_sources import simplerl_extract


def test_gsm8k_open_instruct_quirks():
    g = get_verifier("gsm8k")
    assert g(["so 1,234 apples", "it is 18.0", "The answer is -5", "<|assistant|>\n7 then 9"],
             answer=["1234", "18", "-5", "9"]) == [1.0, 0.0, 0.0, 1.0]  # release regex: ints carry no sign


def test_gsm8k_numeric_tolerant():
    g = get_verifier("gsm8k_numeric")
    assert g(["it is 18.0", "The answer is -5", "no number", "x"], answer=["18", "-5", "3", "n/a"]) == [1.0, 1.0, 0.0, None]


def test_gsm8k_test_solutions_self_consistent(shared_data):
    rows = [json.loads(line) for line in open(shared_data / "gsm8k" / "test.jsonl")]
    assert len(rows) == 1319
    sols = [r["answer"] for r in rows]
    assert sum(v == 1.0 for v in get_verifier("gsm8k_numeric")(sols, answer=sols)) == 1319
    exact = get_verifier("gsm8k")(sols, answer=sols)
    misses = [s.split("####")[-1].strip() for s, v in zip(sols, exact) if v != 1.0]
    assert misses == ["-10", "-3"]  # the release regex drops the sign of negative integers


def test_compose_weights_none_and_open_instruct_penalty():
    r = open_instruct_reward("gsm8k")
    assert r(["x 18", "x 17", "18"], answer=["18"] * 3, finished=[True, True, False]) == [10.0, 0.0, -10.0]
    c = ComposedReward(["math", ("gsm8k", 0.5)])
    assert c([r"\boxed{18}", "no"], answer=["18", ""]) == [1.5, 0.0]
    assert c.last_metrics["rewards/math/none_frac"] == 0.5
    only_none = ComposedReward(["math"])
    assert only_none(["x"], answer=[""]) == [None] and math.isnan(only_none.last_metrics["reward/mean"])
    with pytest.raises(KeyError, match="registered"):
        ComposedReward(["nope"])
    with pytest.raises(ValueError, match="finished"):
        r(["1"], answer=["1"])


def test_simplerl_pipeline_cuts_and_extracts():
    text = "<|im_start|>user\n\\boxed{1}<|im_end|>\n<|im_start|>assistant\nSo the answer is \\boxed{5}.<|im_end|>junk \\boxed{9}"
    assert simplerl_extract(text) == "5"
    f = get_verifier("math_simplerl")
    assert f([text, "the answer is 5", "final: 5 apples 6"], ground_truth=["5", "5", "5"]) == [1.0, 1.0, 0.0]


def test_tulu3_flex_candidates():
    f = get_verifier("math_tulu3")
    outs = ["<|assistant|>\nFinal Answer: The final answer is $\\frac{1}{2}$. I hope it is correct.",
            "we get $x = 3$ and so $7$", "\\boxed{0.5}", "\\boxed{2}"]
    assert f(outs, ground_truth=["\\frac{1}{2}", "7", "\\frac{1}{2}", "3"]) == [1.0, 1.0, 1.0, 0.0]


def _math500(shared_data):
    return [json.loads(line) for line in open(shared_data / "math500" / "test.jsonl")]


def test_math500_source_variants_counts(shared_data):
    """Exact source behaviour on the reference solutions; the misses are explained in docs/verifiers.md."""
    rows = _math500(shared_data)
    sols, ans = [r["solution"] for r in rows], [r["answer"] for r in rows]
    tulu = get_verifier("math_tulu3")(sols, ground_truth=ans)
    assert sum(v == 1.0 for v in tulu) == 500
    simple = get_verifier("math_simplerl")(sols, ground_truth=ans)
    misses = sorted(a for a, v in zip(ans, simple) if v != 1.0)
    assert len(misses) == 7 and "\\text{east}" in misses  # Qwen-Math strip_string removes unit words
    r1 = get_verifier("math_open_r1")(sols, solution=sols)
    assert sum(v == 1.0 for v in r1) == 492  # malformed_operators=False: "\frac43", "11\sqrt2" do not parse


def test_weighted_verifier_sums_terms_as_trl_reward_weights():
    """``verifier.name=weighted``: Open-R1's accuracy + format + tag_count, each term's None adding nothing."""
    w = get_verifier("weighted")
    good = "<think>\nfine\n</think>\n<answer>\n\\boxed{18}\n</answer>"
    terms = [{"name": "math", "weight": 1.0}, {"name": "format", "weight": 1.0}, {"name": "tag_count", "weight": 0.5}]
    assert w([good, "no tags 18"], terms=terms, answer=["18", "18"]) == [2.5, 0.0]
    assert w([good], terms=terms, answer=[""]) == [1.5]  # math says None (no gold): format and tags still count
    with pytest.raises(ValueError, match="at least one term"):
        w(["x"], answer=["1"])


def test_routed_verifier_dispatches_on_the_dataset_column_with_a_scale():
    """Open-Instruct Tulu 3: ``dataset`` gsm8k / MATH / ifeval, 10 for a verified sample."""
    r = get_verifier("routed")
    routes = {"gsm8k": "gsm8k", "math": "math_tulu3"}
    out = r(["so 18", "\\boxed{2}", "so 17", "\\boxed{3}"], routes=routes, scale=10.0,
            dataset=["gsm8k", "MATH", "gsm8k", "MATH"], ground_truth=["18", "2", "18", "2"], answer=["18", "", "18", ""])
    assert out == [10.0, 10.0, 0.0, 0.0]
    with pytest.raises(KeyError, match=r"dataset value\(s\) \['ifeval'\] have no route"):
        r(["x"], routes=routes, dataset=["ifeval"], answer=["1"])
    with pytest.raises(KeyError, match="the rows have no 'source' column"):
        r(["x"], routes=routes, route_column="source", answer=["1"])
