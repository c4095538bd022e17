"""What a run says while it runs (issue 27, "say what is happening"), run as a user would: the start summary before
any model is built, each long phase announced, a plain line per step in ``run.log``, samples at the first and last
step, the warm start only on the recipe's own model and data unless asked for, no third-party deprecation noise,
and ``recipes.eval`` naming its output dir."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from core.paths import PROJECT_ROOT
from tests.helpers import CLI_ENV, FAST, run_cli


def _samples_steps(run: Path) -> list[int]:
    return sorted({json.loads(line)["step"] for line in (run / "samples.jsonl").read_text().splitlines()})


def test_the_demo_says_what_it_does_before_and_while_it_runs(tmp_path):
    """The summary (recipe, scale, model, data rows, batch arithmetic, warm start, run dir) comes before the first
    model is built; the warm start, model build and evaluations are announced; run.log holds one plain line per
    step; samples.jsonl holds the first and the last step though samples_every is 10."""
    proc = run_cli(tmp_path, *FAST, "train.total_steps=3", "train.warm_start.eval_every=5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out, run = proc.stdout, tmp_path / "run"
    summary = out.index("tiny_math_grpo: rl loop, scale=full, seed=0")
    for line in ("model       tiny qwen2 built locally (hidden 32", "data        arithmetic (generated): 64 training "
                 "rows, 8 held-out", "3 RL steps of 4 prompts x 4 completions = 16", f"run dir     {run}",
                 "warm start  up to 5 supervised steps on the training answers, until held-out accuracy 0.3: the "
                 "recipe's own model and data"):
        assert line in out[summary:], out[:3000]
    order = [out.index(s) for s in ("warm start: up to 5 supervised steps", "building models: policy, reference",
                                    "greedy evaluation on 8 held-out prompts (before RL): accuracy",
                                    "greedy evaluation on 8 held-out prompts (after RL): accuracy")]
    assert summary < order[0] and order == sorted(order), out[:3000]
    log = (run / "run.log").read_text()
    steps = [line.split(" - ", 1)[1] for line in log.splitlines() if " - step " in line]
    assert [s.split()[1] for s in steps] == ["1/3", "2/3", "3/3"], log[-3000:]
    assert all(s.split()[2::2][:3] == ["reward", "acc", "loss"] for s in steps), steps
    assert " - step " not in out  # the console has the progress bar, not the lines
    assert _samples_steps(run) == [1, 3]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def own_data(tmp_path) -> list[str]:
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(12) for b in range(3)]
    train, held = _jsonl(tmp_path / "train.jsonl", rows[:28]), _jsonl(tmp_path / "eval.jsonl", rows[28:])
    return ["data.source=file", f"data.path={train}", f"data.eval_path={held}"]


def test_own_data_gets_no_warm_start_unless_asked_for(tmp_path, own_data):
    """The demo recipe with data.source=file: no supervised pass on the file's answers (the summary says why, and
    config.yaml records it); train.warm_start.enabled=true asks for it."""
    base = [*FAST, *own_data, "train.total_steps=1", "train.warm_start.eval_every=1",
            "train.warm_start.target_accuracy=0", "train.warm_start.holdout=4"]
    proc = run_cli(tmp_path / "own", *base)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("warm start  none: data.source, data.path set on the command line: a model or data of your own gets no "
            "supervised pass unless train.warm_start.enabled=true") in proc.stdout, proc.stdout[:3000]
    assert "warm start: up to" not in proc.stdout
    assert "    enabled: false" in (tmp_path / "own" / "run" / "config.yaml").read_text()

    asked = run_cli(tmp_path / "asked", *base, "train.warm_start.enabled=true")
    assert asked.returncode == 0, asked.stderr[-3000:]
    assert "warm start: up to 5 supervised steps on 24 training answers" in asked.stdout, asked.stdout[:3000]
    assert "stopped at step 1" in asked.stdout and "train.warm_start.enabled=true" in asked.stdout
    assert "    enabled: true" in (tmp_path / "asked" / "run" / "config.yaml").read_text()


@pytest.mark.parametrize("keys,runs", [
    ((), True), (("model.tiny.hidden_size", "data.generator.num_train", "train.warm_start.steps"), True),
    (("data.path",), False), (("data",), False), (("model.name_or_path",), False), (("model",), False),
    (("data.hub_name", "seed"), False),
])
def test_auto_warm_starts_only_the_recipes_own_model_and_data(keys, runs):
    from core.config.warm_start import decide

    ws = {"enabled": "auto", "steps": 2000}
    assert decide(type("WS", (), ws), keys).runs is runs
    assert decide(type("WS", (), {**ws, "enabled": True}), keys).runs
    assert not decide(type("WS", (), {**ws, "enabled": False}), ()).runs
    assert not decide(type("WS", (), {**ws, "steps": 0}), ()).runs


def test_whether_the_warm_start_runs_is_not_part_of_its_cache_key(monkeypatch):
    """auto and true build the same start, and the starts cached before ``enabled`` existed stay valid."""
    import torch

    from core.config.frozen import FrozenConfig
    from core.models import warm_start

    monkeypatch.setattr(warm_start, "cached_build", lambda kind, key, build: key)
    ws = {"steps": 5, "eval_every": 1, "target_accuracy": 0.3, "holdout": 1, "batch_size": 2, "lr": 1e-3, "seed": 0,
          "target": "{answer}"}
    keys = [warm_start.warm_started_dir("m", None, FrozenConfig({**ws, **extra}), [[1], [2]], ["1", "2"],
                                        torch.device("cpu"), None, 4)
            for extra in ({}, {"enabled": "auto"}, {"enabled": True})]
    assert keys[0] == keys[1] == keys[2] and "enabled" not in keys[0]["ws"]


def test_warm_start_checks_follow_whether_it_runs():
    """ZeRO-3 refuses a warm start that would run, not one that auto leaves off; enabled=true needs steps."""
    from core.config.pipeline import prepare
    from core.config.validate import ConfigError

    with pytest.raises(ConfigError, match="train.warm_start.steps=2000 with zero.stage=3"):
        prepare(["zero=stage3"])
    assert not prepare(["zero=stage3", "model=qwen2_5_0_5b_random"]).plan.warm_start
    with pytest.raises(ConfigError, match="train.warm_start.enabled=true with train.warm_start.steps=0"):
        prepare(["train.warm_start.enabled=true", "train.warm_start.steps=0"])


def test_the_entry_point_filters_torchs_deprecation_of_the_collectives_deepspeed_calls(tmp_path):
    """The warning torch raises when DeepSpeed's ZeRO-3 gathers (``all_gather_into_tensor``), in a process set up
    as ``python -m recipes.run`` sets itself up, with every other warning left alone."""
    script = (
        "import warnings, torch, torch.distributed as dist\n"
        "from recipes.run import _quiet\n"
        "_quiet()\n"
        "dist.init_process_group('gloo', rank=0, world_size=1, store=dist.HashStore())\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    dist.all_gather_into_tensor(torch.zeros(2), torch.ones(2))\n"
        "    warnings.warn('kept', FutureWarning)\n"
        "print([str(w.message) for w in seen])\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=PROJECT_ROOT, env=CLI_ENV, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "['kept']", proc.stdout + proc.stderr[-2000:]


@pytest.mark.slow
def test_a_tiny_zero3_reward_model_run_summarises_and_prints_no_deprecation_noise(tmp_path):
    """torch's FutureWarnings for the collectives DeepSpeed's ZeRO-3 calls every step are filtered at the entry
    point (recipes/run.py); the reward-model loop prints its summary and logs a line per step too."""
    proc = run_cli(tmp_path, "recipe=tiny_rm", "scale=tiny", "zero=stage3", "train.max_steps=2",
                   "logger.tensorboard=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "is deprecated" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stdout.index("tiny_rm: rm loop, scale=tiny") < proc.stdout.index("building the reward model")
    assert "2 optimiser steps of 8 pairs" in proc.stdout
    log = (tmp_path / "run" / "run.log").read_text()
    assert " - step 1/2 acc " in log and " - step 2/2 acc " in log, log[-2000:]


def test_eval_names_its_output_dir_and_announces_each_set(tmp_path, shared_data):
    from tests.helpers import tiny_model

    model, tok = tiny_model()
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    cmd = [sys.executable, "-m", "recipes.eval", f"paths.results_dir={tmp_path}/results",
           f"hydra.run.dir={tmp_path}/ev",
           f"model.name_or_path={tmp_path}/model", "eval.limit=2", "rollout.max_new_tokens=4",
           f"paths.data_dir={shared_data}"]
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, env=CLI_ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"output dir {tmp_path}/ev" in proc.stdout, proc.stdout
    assert "math500: 2 problems x 1 sample(s): done" in proc.stdout
    assert proc.stdout.index("output dir") < proc.stdout.index("math500: 2 problems x 1 sample(s) ...")
