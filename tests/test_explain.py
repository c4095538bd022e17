"""``python -m recipes.explain``: the batch arithmetic of a recipe in our keys and its source's flags, and the
arithmetic that fails when an override breaks an invariant. The named recipes' published figures are checked in
tests/test_recipes.py."""
from __future__ import annotations

import subprocess
import sys

from core.paths import PROJECT_ROOT
from tests.helpers import CLI_ENV, explain


def _explain(*overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "recipes.explain", *overrides], cwd=PROJECT_ROOT, env=CLI_ENV,
                          capture_output=True, text=True, timeout=120)


def test_the_default_recipe_is_explained_from_its_config():
    proc = _explain("train.total_steps=null", "train.epochs=3", "data.generator.num_train=1000")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "one RL step: train.prompts_per_step 16 x train.group_size 8 = 128 completions" in out
    assert "1000 training rows after the filters -> 62 RL steps per epoch" in out  # 1000 // 16, last batch dropped
    assert "run: 186 RL steps = 3.00 epochs, about 24 views of each example" in out
    assert "186 x 1 = 186 optimiser steps" in out


def test_a_source_view_states_the_batch_in_its_flags():
    proc = explain("source.name=trl", "train.prompts_per_step=16", "train.group_size=7", "train.mini_batch_size=112",
                   "train.micro_batch_size=16")  # in this process: the two tests around it run the CLI
    assert proc.returncode == 0, proc.stderr
    assert "generation batch: 16 x 1 x 7 = 112 completions = 16 prompts x 7" in proc.stdout


def test_the_openrlhf_view_states_the_batch_in_its_flags():
    """No recipe names source.name=openrlhf (OpenRLHF's recipes train reward models): it is a command-line option."""
    proc = explain("source.name=openrlhf", "train.micro_batch_size=32")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith("in openrlhf's flags:\n  --rollout_batch_size: 16\n  --n_samples_per_prompt: 8\n"
                                "  --train_batch_size: 128\n  --micro_train_batch_size: 32\n  --max_epochs: 1\n")


def test_a_broken_invariant_prints_the_failing_arithmetic():
    proc = _explain("train.group_size=14", "train.prompts_per_step=8", "train.mini_batch_size=64")
    assert proc.returncode == 1
    assert "train.prompts_per_step x train.group_size = 8 x 14 = 112 completions is not divisible by " \
           "train.mini_batch_size=64" in proc.stderr
