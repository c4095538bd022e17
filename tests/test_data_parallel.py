"""The RL loop data-parallel under torchrun (2 CPU ranks over gloo): the same global batch split over
ranks trains the same model as one process, with the plain torch engine (DDP) and DeepSpeed ZeRO-2/3."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import results, run_cli, slow

# Greedy rollouts make the completions independent of each rank's sampling RNG; a reward of the gold answer
# alone makes rewards differ across the batch on any machine (so the gradient is not zero by accident of
# one CPU's rounding); REINFORCE++ with global whitening and the step-level token mean make every
# cross-rank reduction matter to the gradient.
SAME = ["scale=tiny", "logger.progress=false", "logger.tensorboard=false", "train.eval_prompts=16",
        "train.warm_start.steps=0", "verifier.name=tests.stub_rewards:gold_parity", "advantage=reinforce_pp",
        "kl=k1", "rollout.greedy=true", "loss.aggregation=token_mean_global"]


def _run(tmp: Path, nproc: int, *overrides: str):
    proc = run_cli(tmp, *overrides, nproc=nproc)
    assert proc.returncode == 0, proc.stderr[-4000:]


def _rows(tmp: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp / "run" / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("one")
    _run(tmp, 1, *SAME)
    return _rows(tmp)


# stage 3 partitions every parameter (DeepSpeed keeps those under 1e5 elements whole by default: all of a tiny model's)
STAGE3 = "zero=stage3 +zero.options.stage3_param_persistence_threshold=0"


@pytest.mark.distributed
@pytest.mark.parametrize("zero", ["zero=none", slow("zero=stage2"), STAGE3,
                                  slow(f"{STAGE3} rollout.gather_for_generation=false")])
def test_two_ranks_train_like_one_process(one_process, tmp_path, zero):
    _run(tmp_path, 2, *SAME, *zero.split())
    rows = _rows(tmp_path)
    steps = [r for r in rows if "grad_norm" in r]
    want = [r for r in one_process if "grad_norm" in r]
    assert [r["step"] for r in steps] == [1, 2]  # rank 0 alone logs
    assert 0 < want[0]["reward/mean"] < 1 and want[0]["grad_norm"] > 0  # rewards differ: a real gradient
    for got, ref in zip(steps, want):
        assert got["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-4)
        assert got["reward/mean"] == ref["reward/mean"]  # the whole step's rows, gathered for logging
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    assert evals == [r["eval/accuracy"] for r in one_process if "eval/accuracy" in r]
    assert (tmp_path / "run" / "model" / "model.safetensors").exists()
    assert len(results(tmp_path)) == 1


# 3 prompts x 2 completions on 2 ranks: 3 rows each, so the second prompt's group spans the ranks (TRL
# process_slice; the old whole-groups split refused it). The reward of a row is its place in the step.
SPLIT = [*SAME[:5], "verifier.name=tests.stub_rewards:step_position", "kl=k1", "rollout.greedy=true",
         "loss.aggregation=token_mean_global", "train.prompts_per_step=3", "train.group_size=2",
         "train.mini_batch_size=6", "train.micro_batch_size=3"]


@pytest.mark.distributed
@pytest.mark.parametrize("advantage", ["advantage=grpo", slow("advantage=rloo")])
def test_groups_spanning_ranks_train_like_one_process(tmp_path, advantage):
    _run(tmp_path / "one", 1, *SPLIT, advantage)
    _run(tmp_path / "two", 2, *SPLIT, advantage)
    want, got = ([r for r in _rows(tmp_path / d) if "grad_norm" in r] for d in ("one", "two"))
    assert [r["step"] for r in got] == [r["step"] for r in want] == [1, 2]
    for g, w in zip(got, want):
        assert w["reward/mean"] == 1.0 and w["grad_norm"] > 0  # rewards 0, 1, 2, 0, 1, 2: a real gradient
        assert g["reward/mean"] == w["reward/mean"]
        for key in ("grad_norm", "loss", "kl_reward"):
            assert g[key] == pytest.approx(w[key], rel=1e-4, abs=1e-7), key


@pytest.mark.slow
@pytest.mark.distributed
def test_two_rank_run_killed_after_a_checkpoint_resumes(tmp_path):
    import os
    import signal
    import subprocess
    import time

    from core.paths import PROJECT_ROOT
    from tests.helpers import CLI_ENV, cli_command

    common = ["scale=tiny", "logger.progress=false", "logger.tensorboard=false", "train.eval_prompts=8",
              "train.warm_start.steps=0", "train.checkpoint_every=1", "zero=stage2", "train.total_steps=3"]
    ckpt = tmp_path / "run" / "checkpoint"
    proc = subprocess.Popen(cli_command(tmp_path, *common, nproc=2), cwd=PROJECT_ROOT, env=CLI_ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    while proc.poll() is None and not (ckpt / "rng.rank1.pt").exists():
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)  # torchrun and both ranks, right after the first checkpoint
    proc.wait()
    step = json.loads((ckpt / "trainer.json").read_text())["step"]
    assert step < 3 and (ckpt / "rng.pt").exists()  # each rank's RNG stream
    _run(tmp_path, 2, *common, "resume=true")
    assert json.loads((ckpt / "trainer.json").read_text())["step"] == 3
    assert [r["step"] for r in _rows(tmp_path) if "loss" in r] == [1, 2, 3]
    assert len(results(tmp_path)) == 1
