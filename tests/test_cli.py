"""The real CLI end to end: outputs, results rows, multirun, bit-for-bit repeats and resume."""
from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import FAST, results, run_cli

STEP_KEYS = {"reward/mean", "reward/std", "accuracy", "length/mean", "length/max", "length/truncated_frac", "kl",
             "entropy", "clip_frac", "grad_norm", "lr", "loss", "time/generate", "time/verify", "time/logprobs",
             "time/update", "memory/peak_mb"}


def _steps(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "reward/mean" in r]


def _comparable(row):
    return {k: v for k, v in row.items() if not k.startswith(("time/", "memory/"))}


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("straight")
    proc = run_cli(tmp, *FAST, "train.total_steps=3", "logger.tensorboard=true", "kl.coef=0.04")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp


def test_end_to_end_outputs(straight_run):
    from transformers import AutoModelForCausalLM

    run_dir = straight_run / "run"
    steps = _steps(run_dir)
    assert [r["step"] for r in steps] == [1, 2, 3]
    missing = STEP_KEYS - set(steps[0])
    assert not missing, missing
    assert all(0.0 <= r["reward/mean"] <= 1.0 for r in steps)
    assert (run_dir / "config.yaml").exists() and (run_dir / ".hydra" / "overrides.yaml").exists()
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    model = AutoModelForCausalLM.from_pretrained(run_dir / "model")
    assert sum(p.numel() for p in model.parameters()) > 0
    rows = results(straight_run)
    assert len(rows) == 1 and rows[0]["recipe"] == "tiny_math_grpo" and rows[0]["steps"] == 3
    assert 0.0 <= rows[0]["eval_before"] <= 1.0 and 0.0 <= rows[0]["eval_after"] <= 1.0


def test_killed_run_resumes_bit_for_bit(straight_run, tmp_path):
    first = run_cli(tmp_path, *FAST, "train.total_steps=2", "train.checkpoint_every=1", "kl.coef=0.04")
    assert first.returncode == 0, first.stderr[-3000:]
    assert (tmp_path / "run" / "checkpoint" / "trainer.json").exists()
    again = run_cli(tmp_path, *FAST, "train.total_steps=3", "resume=true", "kl.coef=0.04")
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = _steps(tmp_path / "run")
    assert [r["step"] for r in resumed] == [1, 2, 3]  # steps 1-2 from the first process, 3 from the second
    want = [_comparable(r) for r in _steps(straight_run / "run")]
    assert [_comparable(r) for r in resumed] == want  # identical to the uninterrupted run


def test_multirun_gives_one_dir_and_one_row_per_job(tmp_path):
    proc = run_cli(tmp_path, *FAST, "train.total_steps=1", "seed=0,1", multirun=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = results(tmp_path)
    assert sorted(r["seed"] for r in rows) == [0, 1]
    dirs = sorted(p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir() and p.name.isdigit())
    assert dirs == ["0", "1"]
    assert all((tmp_path / "sweep" / d / "model" / "config.json").exists() for d in dirs)


def test_compare_prints_a_markdown_row_per_run(straight_run, capsys):
    from recipes.compare import main

    out = main(["--results-dir", str(straight_run / "results")])
    lines = out.splitlines()
    assert lines[0].startswith("| recipe |") and len(lines) == 3
    assert "tiny_math_grpo" in lines[2]


@pytest.mark.parametrize("overrides, message", [
    (["recipe=no_such_recipe"], "Available options in 'recipe'"),
    (["train.mini_batch_size=24"], "not divisible by train.mini_batch_size=24"),
    (["train.micro_batch_size=5"], "train.mini_batch_size=16 is not divisible by train.micro_batch_size"),
    (["train.group_size=1", "train.mini_batch_size=4", "train.micro_batch_size=4"], "train.group_size=1"),
    (["train.prompts_per_step=100", "train.mini_batch_size=400"], "larger than the training set (64 rows"),
    (["data.source=file", "data.path=/nonexistent/train.jsonl"], "data file not found: /nonexistent/train.jsonl"),
    (["advantage.name=nope"], "advantage.name='nope' is not registered"),
    (["train.packing=maybe"], "train.packing='maybe'; choose one of auto, true, false"),
    (["model.dtype=float16"], "model.dtype=float16: fp16 training needs loss scaling"),
    (["model.dtype=nope"], "model.dtype='nope': expected one of ['bfloat16', 'float32']"),
    (["device=tpu"], "device='tpu': expected auto, cpu, cuda or cuda:N"),
    pytest.param(["device=cuda"], "device=cuda: no CUDA device is available",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")),
    (["zero=stage3"], "train.warm_start.steps=5 with zero.stage=3: the warm start trains a full copy"),
])
def test_bad_input_fails_before_any_model_is_built(tmp_path, overrides, message):
    proc = run_cli(tmp_path, *FAST, *overrides, "model.init_seed=987654")
    assert proc.returncode != 0
    assert message in proc.stderr + proc.stdout, (proc.stderr + proc.stdout)[-3000:]
    assert not (tmp_path / "run" / "model").exists()
    assert "Traceback" not in proc.stderr or "HYDRA_FULL_ERROR" in proc.stderr


def test_tiny_scale_shrinks_the_recipe_and_runs(tmp_path):
    proc = run_cli(tmp_path, "scale=tiny", "logger.progress=false", "logger.tensorboard=false",
                   "train.warm_start.steps=5", "train.warm_start.holdout=8")
    assert proc.returncode == 0, proc.stderr[-3000:]
    cfg = (tmp_path / "run" / "config.yaml").read_text()
    assert "prompts_per_step: 4" in cfg and "total_steps: 2" in cfg and "hidden_size: 32" in cfg
    assert [r["step"] for r in _steps(tmp_path / "run")] == [1, 2]


def test_saved_model_generates_like_the_trained_one(straight_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(straight_run / "run" / "model")
    tok = AutoTokenizer.from_pretrained(straight_run / "run" / "model")
    ids = torch.tensor([tok("12+30=", add_special_tokens=False)["input_ids"]])
    out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape[1] > ids.shape[1]
