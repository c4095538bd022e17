"""``recipes.probe`` and ``recipes.plan`` on every model of conf/model (issue 36: ``model=qwen2_5_0_5b_random``, whose
``model.tiny`` nests ``rope_parameters``, ended in transformers' ``StrictDataclassFieldValidationError``: the nested
value reached the config class as a DictConfig). Each model through the RL loop at short lengths; the nested one also
through the reward-model loop (its own loader, core/models/reward_model.py)."""
from __future__ import annotations

import json

import pytest

from core.paths import CONF_DIR
from recipes import probe as probe_cli
from recipes.plan import plan

MODELS = sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))
# hub checkpoints (7-8B, built on fake tensors): about 8 s of CPU each, 20-25 s on this shared machine
HUB = {m for m in MODELS if "name_or_path:" in (CONF_DIR / "model" / f"{m}.yaml").read_text()}
SHORT = ["data.max_prompt_tokens=6", "rollout.max_new_tokens=16", "train.micro_batch_size=8",
         "train.logprob_micro_batch_size=8", "train.warm_start.steps=0"]


def test_the_models_are_found():
    """Counted, so the test below cannot pass on none: the six of conf/model, the nested one among them."""
    assert len(MODELS) == len(list((CONF_DIR / "model").glob("*.yaml"))) >= 6
    assert "qwen2_5_0_5b_random" in MODELS and len(HUB) == 3


@pytest.mark.parametrize("model", [pytest.param(m, marks=[pytest.mark.slow] if m in HUB else []) for m in MODELS])
def test_probe_and_plan_work_with_every_model(model, capsys):
    probe_cli.main([f"model={model}", *SHORT, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["per_gpu_bytes"] > 0 and report["phases"]["update"]["flops"] > 0
    out = plan([f"model={model}", *SHORT], knobs=False)
    assert out["per_gpu_gib"] >= report["per_gpu_bytes"] / 2 ** 30  # the plan adds the overhead
    assert out["step_seconds"] > 0 and out["time"]["phases"]["update"] > 0


def test_reward_model_loop_with_the_nested_tiny_config():
    out = plan(["recipe=tiny_rm", "model=qwen2_5_0_5b_random", "train.max_len=64", "train.lora.rank=8"], knobs=False)
    assert out["memory"]["phases"]["rm_update"]["lora"] > 0 and out["time"]["phases"]["update"] > 0
