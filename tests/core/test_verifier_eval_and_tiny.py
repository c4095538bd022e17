"""Keys the Open-R1 recipes added to the core: the greedy evaluation's own verifier (``verifier.eval_name`` /
``eval_kwargs``), what ``scale=tiny`` merges over the verifier (``verifier.tiny``) and caps in DeepSpeed's buckets
(``scale.zero_bucket_size``), and the eval split of a hub dataset read from another dataset (``data.eval_hub_name``)."""
from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from core.config import schema
from core.config.pipeline import prepare
from core.config.validate import ConfigError
from core.data import prompts as D
from recipes import rl
from tests.core.test_rl_runs import BASE


def test_the_evaluation_scores_with_its_own_verifier(compose_cfg, tmp_path):
    """Training reward ``exact``, evaluation ``gold_parity``: the greedy accuracy is the share of even gold answers
    among the evaluated prompts, whatever the model writes (a reward > 0 counts as correct)."""
    cfg = compose_cfg(*BASE, "verifier.name=tests.stub_rewards:exact",
                      "verifier.eval_name=tests.stub_rewards:gold_parity", f"paths.results_dir={tmp_path}")
    rl.main(cfg, run_dir=str(tmp_path / "run"))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    gold = [int(r["answer"]) for r in D.load_split(prepare(cfg, world=1).config.data, "eval")[:4]]
    parity = sum(a % 2 == 0 for a in gold) / 4
    assert summary["eval_before"] == summary["eval_after"] == parity and 0 < parity < 1


@pytest.mark.parametrize("overrides, message", [
    (["verifier.eval_name=nope"], "verifier.eval_name='nope': unknown verifier 'nope'"),
    (["verifier.eval_name=tests.stub_rewards:exact", "+verifier.eval_kwargs.strict=true"],
     "verifier.eval_kwargs.strict: verifier tests.stub_rewards:exact takes no 'strict'"),
])
def test_a_bad_evaluation_verifier_is_refused(compose_cfg, overrides, message):
    with pytest.raises(ConfigError) as e:
        prepare(compose_cfg(*overrides), world=1)
    assert message in str(e.value)


def _with_tiny(cfg, tiny: dict):
    cfg.verifier.tiny = tiny  # (a null Optional[Dict] node cannot be set from Hydra's command line)
    return cfg


def test_scale_tiny_merges_the_verifier_tiny_node(compose_cfg):
    tiny = {"eval_name": "math_open_r1", "eval_kwargs": {"timeout": 3}}
    full, small = (prepare(_with_tiny(compose_cfg(f"scale={s}"), tiny), world=1).config for s in ("full", "tiny"))
    assert (full.verifier.eval_name, dict(full.verifier.eval_kwargs)) == (None, {})
    assert (small.verifier.eval_name, OmegaConf.to_container(small.verifier.eval_kwargs)) == (
        tiny["eval_name"], tiny["eval_kwargs"])
    with pytest.raises(ConfigError, match="verifier.bogus: unknown key"):  # still checked against the schema
        prepare(_with_tiny(compose_cfg("scale=tiny"), {"bogus": 1}), world=1)


@pytest.mark.parametrize("stage, keys", [("none", ()), ("stage1", ("reduce_bucket_size", "allgather_bucket_size")),
                                         ("stage2", ("reduce_bucket_size", "allgather_bucket_size")),
                                         ("stage3", ("reduce_bucket_size", "stage3_prefetch_bucket_size"))])
def test_scale_tiny_caps_deepspeeds_buckets(compose_cfg, stage, keys):
    cold = "train.warm_start.steps=0"  # no warm start under ZeRO-3
    cfg = prepare(compose_cfg(f"zero={stage}", cold, "scale=tiny"), world=1).config
    assert dict(cfg.zero.get("options", {})) == dict.fromkeys(keys, 1_000_000)
    assert dict(prepare(compose_cfg(f"zero={stage}", cold), world=1).config.zero.get("options", {})) == {}
    if keys:  # a recipe's own option wins
        own = prepare(compose_cfg(f"zero={stage}", f"+zero.options.{keys[0]}=7", cold, "scale=tiny"), world=1).config
        assert own.zero.options[keys[0]] == 7 and own.zero.options[keys[1]] == 1_000_000


def test_the_eval_split_can_come_from_another_hub_dataset(monkeypatch):
    import datasets

    calls = []
    monkeypatch.setattr(datasets, "load_dataset", lambda name, config, split: calls.append((name, config, split))
                        or [{"problem": "1+1", "solution": "2"}])
    cfg = schema.node(schema.PromptDataConfig, source="hub", hub_name="open-r1/OpenR1-Math-220k", hub_config="default",
                      prompt_key="problem", answer_key="solution")
    D.load_split(cfg, "train"), D.load_split(cfg, "eval")
    other = OmegaConf.merge(cfg, {"eval_hub_name": "HuggingFaceH4/MATH-500"})
    assert D.load_split(other, "eval") == [{"prompt": "1+1", "answer": "2"}]
    assert calls == [("open-r1/OpenR1-Math-220k", "default", "train"), ("open-r1/OpenR1-Math-220k", "default", "test"),
                     ("HuggingFaceH4/MATH-500", None, "test")]
