"""Accuracy means the correctness term (verifiers/correctness.py, docs/verifiers.md "Accuracy"): with a weighted reward
that adds a bonus to every completion, the per-step ``accuracy``, the greedy held-out accuracy (``eval/accuracy``,
the row's ``eval_before`` / ``eval_after``, the final line) and ``recipes.eval``'s pass@1 count the correctness
term's verdicts, not ``reward > 0``; each term's mean is logged (``rewards/<term>/mean``); a weighted reward whose
accuracy term is missing or ambiguous is refused before any model is built, naming ``verifier.accuracy_term``."""
from __future__ import annotations

import json
import logging
import math

import pytest
from omegaconf import OmegaConf

from core.config.pipeline import prepare
from core.config.validate import ConfigError
from core.data import prompts as D
from recipes import rl
from tests.core.test_rl_runs import BASE
from verifiers import VERIFIERS
from verifiers.correctness import Scorer, correct_above

PARITY, BONUS = "tests.stub_rewards:gold_parity", "tests.stub_rewards:bonus"


def _terms(*terms: tuple[str, float]) -> str:
    return "+verifier.kwargs.terms=[" + ",".join(f"{{name:'{n}',weight:{w}}}" for n, w in terms) + "]"


def _rows(run_dir, key: str) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if key in r]


@pytest.mark.parametrize("extra", [(), ("verifier.accuracy_term=" + PARITY, "verifier.eval_name=weighted",
                                        "+verifier.eval_kwargs.terms=[{name:math},{name:'" + PARITY + "'}]")],
                         ids=["auto", "chosen"])
def test_a_weighted_reward_with_a_bonus_reports_accuracy_from_its_correctness_term(compose_cfg, tmp_path, caplog,
                                                                                   extra):
    """Gold parity (1/0, a correctness term) plus 0.1 x a bonus paid to every completion: every reward is > 0, so
    'reward > 0' reads 1.0 everywhere; the accuracy is the parity term's, in training and in the greedy evaluation
    (``chosen``: the term named, and the evaluation's own weighted reward of two correctness terms counts it too)."""
    cfg = compose_cfg(*BASE, "verifier.name=weighted", _terms((PARITY, 1.0), (BONUS, 0.1)), *extra,
                      f"paths.results_dir={tmp_path}")
    with caplog.at_level(logging.INFO, logger="recipes.rl"):
        rl.main(cfg, run_dir=str(tmp_path / "run"))
    gold = [int(r["answer"]) for r in D.load_split(prepare(cfg, world=1).config.data, "eval")[:4]]
    share = sum(a % 2 == 0 for a in gold) / 4
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["eval_before"] == summary["eval_after"] == share and 0 < share < 1
    assert [r["eval/accuracy"] for r in _rows(tmp_path / "run", "eval/accuracy")] == [share, share]
    steps = _rows(tmp_path / "run", "loss")
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        parity = r[f"rewards/{PARITY}/mean"]
        assert r["accuracy"] == parity and r[f"rewards/{BONUS}/mean"] == 1.0
        assert math.isclose(r["reward/mean"], parity + 0.1, rel_tol=1e-5)
    assert f"greedy held-out accuracy (correct by {PARITY}): before RL {share:.3f}, after RL {share:.3f}" in caplog.text


@pytest.mark.parametrize("overrides, message", [
    (["verifier.name=weighted", _terms((BONUS, 1.0), ("format", 0.5))],
     "verifier.accuracy_term=null: the weighted reward of tests.stub_rewards:bonus, format has no correctness term"),
    (["verifier.name=weighted", _terms((PARITY, 1.0), ("math", 1.0))],
     f"verifier.accuracy_term=null: the weighted reward of {PARITY}, math has several correctness terms"),
    (["verifier.name=weighted", _terms(("math", 1.0), (BONUS, 0.1)), "verifier.accuracy_term=format"],
     f"verifier.accuracy_term='format': not a term of this weighted reward; its terms: math, {BONUS}"),
    (["verifier=weighted", "verifier.kwargs.terms=[{name: format}, {name: tag_count, weight: 0.1}]"],
     "verifier.accuracy_term=null: the weighted reward of format, tag_count has no correctness term"),
    (["verifier.name=format"], "verifier.accuracy_term=null: verifier format is a format reward"),
    (["verifier.accuracy_term=format"], "verifier.accuracy_term='format': verifier math is not a weighted sum"),
])
def test_a_reward_without_one_accuracy_term_is_refused_naming_the_key(compose_cfg, overrides, message):
    with pytest.raises(ConfigError) as e:
        prepare(compose_cfg("scale=tiny", *overrides), world=1)
    assert message in str(e.value)


def test_unset_terms_are_reported_once(compose_cfg):
    with pytest.raises(ConfigError) as e:
        prepare(compose_cfg("scale=tiny", "verifier=weighted"), world=1)
    assert "verifier.kwargs.terms: required and not set" in str(e.value) and "accuracy_term" not in str(e.value)


def test_a_named_term_or_a_repeated_one_resolves():
    """``verifier.accuracy_term`` may name any term (the user's call); a repeated name is ``name#k``."""
    s = Scorer("weighted", {"terms": [{"name": BONUS}, {"name": BONUS, "weight": 0.5}, {"name": PARITY}]},
               chosen=f"{BONUS}#2")
    scores = s(["a", "b"], answer=["2", "3"])
    assert s.labels == [BONUS, f"{BONUS}#2", PARITY] and s.accuracy_name == f"{BONUS}#2"
    assert scores.rewards == [2.5, 1.5] and scores.correct == [True, True]
    assert Scorer("weighted", {"terms": [{"name": BONUS}, {"name": PARITY}]})(["a"], answer=["3"]).correct == [False]


def test_every_registered_verifier_says_whether_it_judges_correctness():
    """A verifier added without ``correct_above`` would silently count 'reward > 0' as correct."""
    assert [n for n in VERIFIERS.names() if n != "weighted" and "correct_above" not in VERIFIERS.meta(n)] == []
    assert correct_above("format") is None and correct_above("math") == 0.0 and correct_above("code") == 0.99
    assert correct_above(PARITY) == 0.0 and correct_above(BONUS) is None  # one's own: its attribute, else 0


def test_eval_counts_a_weighted_set_by_its_correctness_term(tmp_path):
    """recipes.eval on a set scored by gold parity + 1.0 x bonus: every reward is >= 1 (eval.pass_reward's old
    default), pass@1 is the parity term's share, 3 of 6."""
    from recipes import eval as ev
    from tests.test_eval import _eval_cfg

    data = tmp_path / "set.jsonl"
    data.write_text("".join(json.dumps({"q": f"{a}=", "a": str(a)}) + "\n" for a in range(6)))
    cfg = _eval_cfg("eval.sets=[mine]", "rollout.max_new_tokens=4", f"paths.results_dir={tmp_path}/results",
                    f"+sets.mine={{path:{data},prompt_key:q,answer_key:a,verifier:weighted}}")
    OmegaConf.update(cfg, "sets.mine.verifier_kwargs", {"terms": [PARITY, BONUS]}, force_add=True)  # weight 1 each
    assert ev.main(cfg, out_dir=str(tmp_path / "out")) == 0.5
    records = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert [r["rewards"] for r in records] == [[2.0], [1.0]] * 3
    assert [r["correct"] for r in records] == [1, 0] * 3
