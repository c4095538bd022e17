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


# Open-R1: the values each YAML left unset under the TRL release its setup.py pinned when it was written
# (grpo_config.py at v0.16.0 23a635e, d625c55, 1bca495, 9ac614fb: temperature 0.9, top_k 50; no generation-batch
# shuffle before 9ac614fb), against TRL v0.18.0's (1.0, None, shuffled).
WRITTEN = {"open_r1_grpo_1_5b": (0.9, 50, False), "open_r1_grpo_distill_1_5b": (0.7, 50, False),
           "open_r1_grpo_code_1_5b": (1.0, 50, False), "open_r1_grpo_codeforces_7b": (0.7, 50, False),
           "open_r1_grpo_math_7b": (0.9, 50, True)}
PINNED = {"open_r1_grpo_1_5b": (1.0, 0, True), "open_r1_grpo_distill_1_5b": (0.7, 0, True),
          "open_r1_grpo_code_1_5b": (1.0, 0, True), "open_r1_grpo_codeforces_7b": (0.7, 0, True),
          "open_r1_grpo_math_7b": (0.9, 50, True)}


def _sampling(cfg) -> tuple:
    return cfg.rollout.temperature, cfg.rollout.top_k, cfg.train.shuffle_mini_batches


@pytest.mark.parametrize("name", sorted(WRITTEN))
def test_open_r1_recipes_state_their_run_and_release_and_switch_to_the_written_defaults(name):
    assert sorted(n for n in NAMED if n.startswith("open_r1_")) == sorted(WRITTEN)  # every Open-R1 recipe
    pinned = prepare([f"recipe={name}"], launched=True, packages=False).config
    assert pinned.source.run and "TRL" in pinned.source.release and "TRL" in pinned.source.written_release
    assert _sampling(pinned) == PINNED[name]
    written = prepare([f"recipe={name}", "source.defaults=written"], launched=True, packages=False).config
    assert _sampling(written) == WRITTEN[name]
    assert written.source.written_release != written.source.release or name == "open_r1_grpo_math_7b"


def test_written_defaults_leave_command_line_keys_and_refuse_a_bad_entry():
    from core.config.release import with_source_defaults
    from core.config.validate import ConfigError

    cfg = with_source_defaults(compose(["recipe=open_r1_grpo_1_5b", "source.defaults=written", "rollout.top_k=7"]),
                               keep=("rollout.top_k",))
    assert (cfg.rollout.top_k, cfg.rollout.temperature) == (7, 0.9)  # the typed key stays, the others are written's
    for entry in ("nope.key=1", "rollout.top_k"):
        bad = compose(["recipe=open_r1_grpo_1_5b", "source.defaults=written"])
        bad.source.written_overrides = [entry]
        with pytest.raises(ConfigError, match=f"source.written_overrides entry '{entry}': expected key=value"):
            with_source_defaults(bad)
