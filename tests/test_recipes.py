"""Every named RL recipe (conf/recipe/, loop rl): composes, passes every check a learner rank runs in the world its
layout asks for, and validates at ``scale=tiny`` on this machine. Counted, so a new recipe is covered. Each
source's exact values, published figures (recipes.explain) and tiny runs are in tests/recipes/."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from core.config.composition import compose
from core.config.pipeline import prepare
from core.paths import CONF_DIR

RL_RECIPES = sorted(p.stem for p in (CONF_DIR / "recipe").glob("*.yaml") if "\nloop: rm" not in p.read_text()
                    and not p.stem.startswith("openrlhf_rm_"))
NAMED = ["open_instruct_grpo_8b", "open_instruct_rlvr_70b", "open_instruct_rlvr_8b", "open_r1_grpo_1_5b",
         "open_r1_grpo_code_1_5b", "open_r1_grpo_codeforces_7b", "open_r1_grpo_distill_1_5b", "open_r1_grpo_math_7b",
         "simplerl_zoo_14b", "simplerl_zoo_32b", "simplerl_zoo_7b"]


def test_every_named_recipe_is_discovered():
    assert set(NAMED) <= set(RL_RECIPES) and len(RL_RECIPES) == len(NAMED) + 1  # + tiny_math_grpo


@pytest.mark.parametrize("name", [n for n in RL_RECIPES if n in NAMED])
def test_a_named_recipe_validates_in_its_layout_and_cites_its_source(name, monkeypatch):
    cfg = compose([f"recipe={name}"])
    learners = int(cfg.layout.learner_gpus)
    monkeypatch.setenv("WORLD_SIZE", str(learners))
    cfg = prepare(cfg, world=learners, packages=False).config  # the gpu extra (vLLM, flash-attn) is not here
    assert cfg.source.name != "none" and cfg.source.ref, name
    text = (CONF_DIR / "recipe" / f"{name}.yaml").read_text()
    assert "Source:" in text, name
    assert OmegaConf.select(cfg, "model.name_or_path"), name


@pytest.mark.parametrize("name", RL_RECIPES)
def test_every_recipe_validates_at_tiny_scale_on_this_machine(name, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    cfg = prepare(compose([f"recipe={name}", "scale=tiny"]), world=1).config
    assert cfg.layout.mode == "colocate" and cfg.rollout.engine == "hf" and cfg.model.name_or_path is None
