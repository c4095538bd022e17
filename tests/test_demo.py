"""The default recipe learns: greedy held-out accuracy after RL beats before by >= 15 points, for several
seeds (the README gives the spread over seeds 0-4, thread counts 1-2 and two CPU kernel sets)."""
from __future__ import annotations

import pytest

from tests.helpers import results, run_cli


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_default_recipe_learns(tmp_path, seed):
    proc = run_cli(tmp_path, "logger.progress=false", f"seed={seed}", timeout=1200)  # python -m recipes.run
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = results(tmp_path)
    assert row["recipe"] == "tiny_math_grpo" and row["seed"] == seed and row["steps"] == 150
    assert row["eval_after"] - row["eval_before"] >= 0.15, row
