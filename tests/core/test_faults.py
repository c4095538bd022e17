"""Faults a long run meets, injected into the tiny recipe (in-process, a few seconds each): a truncated newest
checkpoint, a disk that fills during a checkpoint write, a non-finite reward, and a non-finite loss in the reward-model
loop. Each ends with every step recorded once and one results row (docs/reliability.md)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from core.config import pipeline
from core.models import reward_model as RM
from core.training.checkpoint import CheckpointWriteError, checkpoint_dirs
from core.training.numerics import NonFiniteError
from recipes import rl, rl_update, rm
from tests.core.test_generate_ahead import MOVING
from tests.helpers import slow

# rewards that move the weights (a gold-parity reward, a whitened global baseline); 4 steps (scale=tiny caps at 2)
RUN = (*MOVING, "train.total_steps=4", "scale.total_steps=4", "train.checkpoint_every=1")


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _steps(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "memory/"))}
            for r in _records(run_dir) if "reward/mean" in r]


def _rows(results_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (results_dir / "runs.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted run the faulted ones must equal (steps and records)."""
    from hydra.core.global_hydra import GlobalHydra

    from core.config.composition import compose

    tmp = tmp_path_factory.mktemp("straight")
    GlobalHydra.instance().clear()
    rl.main(compose([*RUN, f"paths.results_dir={tmp}"]), run_dir=str(tmp / "run"))
    GlobalHydra.instance().clear()
    return _steps(tmp / "run")


def test_a_truncated_newest_checkpoint_resumes_from_the_one_before(compose_cfg, tmp_path, straight, caplog):
    """Killed after the checkpoint of step 4 and before its save (no row, no summary); then the newest checkpoint
    reads back short, as a shared file system may serve it. The resume warns, takes checkpoint-3, runs step 4 again:
    each step once in metrics.jsonl, equal to the uninterrupted run's, and one results row."""
    cfg = (*RUN, f"paths.results_dir={tmp_path}")
    rl.train(rl.setup(compose_cfg(*cfg), run_dir=str(tmp_path / "run")))
    assert [p.name for p in checkpoint_dirs(tmp_path / "run")] == ["checkpoint-4", "checkpoint-3"]  # keep 2
    engine = tmp_path / "run" / "checkpoint-4" / "engine.pt"
    engine.write_bytes(engine.read_bytes()[:1000])
    rl.main(compose_cfg(*cfg, "resume=auto"), run_dir=str(tmp_path / "run"))
    assert "checkpoint-4 is unreadable (engine.pt holds 1000 bytes" in caplog.text
    assert _steps(tmp_path / "run") == straight
    assert [r["steps"] for r in _rows(tmp_path)] == [4]


def test_a_disk_full_during_a_checkpoint_write_leaves_the_older_one_to_resume(compose_cfg, tmp_path, straight,
                                                                             monkeypatch):
    """The disk fills while checkpoint-3 is written, and torch.save says so as it does on a really full file system
    (a RuntimeError from its zip writer, not OSError: tests/core/test_full_disk.py meets it for real): the run ends
    with the CheckpointWriteError, checkpoint-2 is as it was, and resume=auto finishes the run with each step once
    and one row."""
    cfg = (*RUN, f"paths.results_dir={tmp_path}")
    real = torch.save

    def full_disk(obj, path, *a, **kw):
        if ".checkpoint-3.tmp" in str(path):
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 4117184 vs 4117076")
        return real(obj, path, *a, **kw)

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(CheckpointWriteError, match=r"checkpoint-3 failed \(RuntimeError: \[enforce fail at "
                                                   r"inline_container.cc:672\] . unexpected pos .*checkpoint-2 is intact"):
        rl.main(compose_cfg(*cfg), run_dir=str(tmp_path / "run"))
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "run").iterdir() if "checkpoint" in p.name) == \
        ["checkpoint-1", "checkpoint-2"]
    rl.main(compose_cfg(*cfg, "resume=auto"), run_dir=str(tmp_path / "run"))
    assert _steps(tmp_path / "run") == straight
    assert [r["steps"] for r in _rows(tmp_path)] == [4]


def _bad_reward(run_dir: Path, value: str) -> tuple[str, ...]:
    """Step 3's first completion scores ``value`` (tests/stub_rewards.py bad_at_step); the evaluation by gold_parity."""
    return ("verifier.name=tests.stub_rewards:bad_at_step", f"+verifier.kwargs.metrics={run_dir}/metrics.jsonl",
            "+verifier.kwargs.step=3", f"+verifier.kwargs.value={value}",
            "verifier.eval_name=tests.stub_rewards:gold_parity")


def test_an_infinite_reward_stops_the_run_then_a_skip_resume_finishes_it(compose_cfg, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    cfg = (*RUN, f"paths.results_dir={tmp_path}", *_bad_reward(run_dir, "inf"))
    with pytest.raises(NonFiniteError, match=r"step 3: non-finite reward \(1 of 16 values\), advantage \("):
        rl.main(compose_cfg(*cfg), run_dir=str(run_dir))
    saved = json.loads((run_dir / "nonfinite" / "step-3.json").read_text())
    assert saved["nonfinite"]["reward"] == [1, 16] and len(saved["rows"]) == 16
    assert saved["rows"][0]["reward"] == "inf" and saved["rows"][0]["advantage"]["nonfinite"] > 0
    assert all(r["prompt"] and "completion" in r for r in saved["rows"])
    assert [r["step"] for r in _steps(run_dir)] == [1, 2]  # the faulty step reached no record
    updates = []
    monkeypatch.setattr(rl, "update", lambda run, *a: updates.append(run.step + 1) or rl_update.update(run, *a))
    rl.main(compose_cfg(*cfg, "resume=auto", "train.on_nonfinite=skip"), run_dir=str(run_dir))
    steps = _steps(run_dir)
    assert [r["step"] for r in steps] == [1, 2, 3, 4] and updates == [3 + 1]  # step 3 took no optimiser step
    assert [r.get("nonfinite/skipped") for r in steps] == [None, None, 1.0, 0.0]  # skip mode counts from its resume
    assert steps[2]["nonfinite/reward"] == 1.0 and "grad_norm" not in steps[2] and "grad_norm" in steps[3]
    assert [r["steps"] for r in _rows(tmp_path)] == [4]


def test_a_nan_reward_is_a_missing_one_not_a_fault(compose_cfg, tmp_path):
    run_dir = tmp_path / "run"
    rl.main(compose_cfg(*RUN, f"paths.results_dir={tmp_path}", *_bad_reward(run_dir, "nan")), run_dir=str(run_dir))
    steps = _steps(run_dir)
    assert [r["reward/skipped"] for r in steps] == [0, 0, 1, 0] and all(math.isfinite(r["loss"]) for r in steps)
    assert not (run_dir / "nonfinite").exists()


RM_RUN = ("recipe=tiny_rm", "recipe_name=tiny_rm", "scale=tiny", "logger.progress=false", "logger.tensorboard=false")


def _master(engine) -> list[torch.Tensor]:
    """The weights the optimiser steps: DeepSpeed's fp32 master partitions (its public ``safe_get_full_fp32_param``),
    the plain engine's fp32 copies of a bf16 model, or the parameters themselves."""
    if hasattr(engine, "engine"):  # DeepSpeedEngine
        from deepspeed.utils import safe_get_full_fp32_param

        return [safe_get_full_fp32_param(p).clone() for p in engine.module.parameters()]
    return [p.detach().clone() for p in (engine.master.master if engine.master else engine.module.parameters())]


@pytest.mark.parametrize("mode, zero, dtype", [("stop", "none", "float32"), ("skip", "none", "float32"),
                                               slow("skip", "stage2", "float32"), slow("skip", "stage2", "bfloat16"),
                                               slow("skip", "stage3", "bfloat16")])
def test_a_nan_loss_in_the_reward_model_loop(compose_cfg, tmp_path, monkeypatch, mode, zero, dtype):
    """A NaN reward-model output at step 2 makes the loss and the gradient NaN: no optimiser step is taken (the
    weights, the fp32 master weights and the schedule stay as they were: the plain engine's guard, or DeepSpeed's
    overflow check under ZeRO, which skips a bf16 step under ZeRO-1/2/3 from DeepSpeed 0.19.8 only:
    docs/dependencies.md), and the run stops naming both, or skips the step and finishes."""
    run_dir, real, holder = tmp_path / "run", RM.sequence_rewards, {}

    def nan_at_step_2(model, batch):
        r = real(model, batch)  # [2B]
        return r * float("nan") if holder["run"].step + 1 == 2 and model.training else r

    class Hydra:  # the run dir a Hydra job would have (rm.setup reads it from Hydra)
        @staticmethod
        def get():
            return type("H", (), {"runtime": type("R", (), {"output_dir": str(run_dir)})})

    monkeypatch.setattr(rm, "HydraConfig", Hydra)
    monkeypatch.setattr(RM, "sequence_rewards", nan_at_step_2)
    monkeypatch.setattr(pipeline, "command_line_keys", lambda: ("model.dtype",))  # typed: scale=tiny keeps it
    run = holder["run"] = rm.setup(compose_cfg(*RM_RUN, f"paths.results_dir={tmp_path}",
                                               f"train.on_nonfinite={mode}", f"zero={zero}", f"model.dtype={dtype}"))
    step, seen, weights, masters, schedule = rm.rm_step, [], [], [], []

    def recording(r):
        weights.append([t.clone() for _, t in r.engine.named_full_parameters()])  # gathered: ZeRO-3
        masters.append(_master(r.engine))
        schedule.append(r.engine.scheduler.last_epoch)
        seen.append(step(r))
        return seen[-1]

    monkeypatch.setattr(rm, "rm_step", recording)
    if mode == "stop":
        with pytest.raises(NonFiniteError, match="step 2: non-finite loss, grad_norm; the run stops"):
            rm.train(run)
        assert len(seen) == 1 and [r["step"] for r in _records(run_dir) if "loss" in r] == [1]
    else:
        rm.train(run)
        weights.append([t.clone() for _, t in run.engine.named_full_parameters()])
        masters.append(_master(run.engine))
        schedule.append(run.engine.scheduler.last_epoch)
        assert [s["nonfinite/skipped"] for s in seen] == [0.0, 1.0, 0.0, 0.0]
        assert {p.dtype for p in weights[0]} == {getattr(torch, dtype)} and {m.dtype for m in masters[0]} == \
            {torch.float32}
        for kept in (weights, masters):
            assert all(torch.equal(a, b) for a, b in zip(kept[1], kept[2]))  # step 2 left them alone
            assert not all(torch.equal(a, b) for a, b in zip(kept[2], kept[3]))  # step 3 moved them
            assert all(bool(torch.isfinite(t).all()) for t in kept[-1])
        assert schedule == [0, 1, 1, 2, 3] and seen[1]["lr"] == seen[2]["lr"]  # the schedule waited with them
    saved = json.loads((run_dir / "nonfinite" / "step-2.json").read_text())
    assert saved["nonfinite"] == {"loss": [1, 1], "grad_norm": [1, 1]} and saved["rows"][0]["chosen"]
