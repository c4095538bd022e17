"""The default recipe learns: greedy held-out accuracy after RL beats before by >= 15 points."""
from __future__ import annotations

import pytest

from tests.helpers import results, run_cli


@pytest.mark.slow
def test_default_recipe_learns(tmp_path):
    proc = run_cli(tmp_path, "logger.progress=false", timeout=900)  # python -m recipes.run, default seed
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = results(tmp_path)
    assert row["recipe"] == "tiny_math_grpo" and row["seed"] == 0 and row["steps"] == 60
    assert row["eval_after"] - row["eval_before"] >= 0.15, row
