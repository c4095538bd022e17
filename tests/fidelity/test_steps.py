"""Each recipe's RL steps against its source framework's own code (docs/fidelity.md): ``make fidelity``, or
``pytest -m fidelity tests/fidelity`` once tests/fidelity/envs.sh has built the envs. Which source each recipe is
checked against, and how, is tests/fidelity/sources.yaml."""
from __future__ import annotations

import pytest

from core.paths import CONF_DIR
from tests.fidelity.harness import SOURCES, check_engine, check_rl, check_rm

# The driver that runs each package's step code in its env.
DRIVERS = {"trl": "trl_grpo.py", "verl": "verl_grpo.py", "open_instruct": "open_instruct_rl.py"}
# Reward-model recipes' drivers (sources.yaml ``driver``, else OpenRLHF's train_rm: tests/fidelity/openrlhf_rm.py).
RM_STEP = sorted(r for r, s in SOURCES.items()
                 if s["check"] == "step" and (s["package"] == "openrlhf" or s.get("driver", "").endswith("_rm.py")))
# Checked again at the source's engine (sources.yaml ``engine``: bf16, fp32 master weights, the sharding, 2 ranks).
ENGINE = sorted(r for r, s in SOURCES.items() if "engine" in s)
RL_STEP = sorted(r for r, s in SOURCES.items() if s["check"] == "step" and s["package"] in DRIVERS and r not in RM_STEP)


def test_every_named_recipe_says_how_it_is_checked():
    named = sorted(p.stem for p in CONF_DIR.glob("recipe/*.yaml") if not p.stem.startswith("tiny_"))
    assert sorted(SOURCES) == named and len(named) == 15
    for recipe, src in SOURCES.items():
        assert src["check"] in ("step", "function"), recipe
        assert (src["check"] == "step") == (src["package"] is not None), recipe
    assert len(RL_STEP) == 11 and len(RM_STEP) == 4
    # issue 41: at least one recipe of each source family at its engine (Open-R1 on TRL, SimpleRL-Zoo on veRL,
    # OpenRLHF, Open-Instruct)
    assert {SOURCES[r]["package"] for r in ENGINE} == {"trl", "verl", "openrlhf", "open_instruct"}


@pytest.mark.fidelity
@pytest.mark.parametrize("recipe", RL_STEP)
def test_rl_steps_match_the_source(recipe, tmp_path):
    per_step = check_rl(recipe, tmp_path, DRIVERS[SOURCES[recipe]["package"]])
    assert len(per_step) == 2


@pytest.mark.fidelity
@pytest.mark.parametrize("recipe", RM_STEP)
def test_rm_steps_match_the_source(recipe, tmp_path):
    per_step = check_rm(recipe, tmp_path, SOURCES[recipe].get("driver", "openrlhf_rm.py"))
    assert len(per_step) == 3


@pytest.mark.fidelity
@pytest.mark.parametrize("recipe", ENGINE)
def test_engine_steps_match_the_source(recipe, tmp_path):
    rm = recipe in RM_STEP
    driver = SOURCES[recipe].get("driver", "openrlhf_rm.py") if rm else DRIVERS[SOURCES[recipe]["package"]]
    per_step = check_engine(recipe, tmp_path, driver)
    assert len(per_step) == (3 if rm else 2)
