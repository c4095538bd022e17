"""Open-R1's five recipes, one RL step after another, against TRL 0.18.0's own GRPOTrainer (docs/fidelity.md):
``make fidelity``, or ``pytest -m fidelity tests/fidelity`` once tests/fidelity/envs.sh has built the env."""
from __future__ import annotations

import pytest

from core.paths import CONF_DIR
from tests.fidelity.harness import SOURCES, check_rl

TRL = sorted(r for r, s in SOURCES.items() if s["package"] == "trl")


def test_every_open_r1_recipe_has_a_trl_check():
    assert TRL == sorted(p.stem for p in CONF_DIR.glob("recipe/open_r1_*.yaml")) and len(TRL) == 5


@pytest.mark.fidelity
@pytest.mark.parametrize("recipe", TRL)
def test_steps_match_trl(recipe, tmp_path):
    per_step = check_rl(recipe, tmp_path, "trl_grpo.py")
    assert len(per_step) == 2
