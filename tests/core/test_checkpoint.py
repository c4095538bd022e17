"""``core.training.checkpoint``: a folder written through ``atomic_dir`` survives a kill at any instant of its
write and swap; ``recover`` puts the newest complete copy back and clears the leftovers; ``prior_run`` checks
``resume`` against what the run dir holds."""
from __future__ import annotations

import json
import os

import pytest
import torch

from core.evaluation.schema import EvalRunConfig
from core.training.checkpoint import (COMPLETE, AlreadyFinished, ResumeError, atomic_dir, prior_run,
                                      recover, seed_everything)


def _write(path, step: int, complete: bool = True, stamp: int = 0):
    path.mkdir(parents=True)
    (path / "trainer.json").write_text(json.dumps({"step": step}))
    if complete:
        (path / COMPLETE).write_text(str(stamp))


def _step(path) -> int:
    return json.loads((path / "trainer.json").read_text())["step"]


# every instant of atomic_dir's write-then-swap: (what lies on disk, the step a resume must find)
STATES = {
    "before the first checkpoint is complete": ({".checkpoint.tmp11": (1, False)}, None),
    "writing a new checkpoint": ({"checkpoint": (1, True), ".checkpoint.tmp11": (2, False)}, 1),
    "new one complete, not yet swapped": ({"checkpoint": (1, True), ".checkpoint.tmp11": (2, True)}, 2),
    "between the two renames": ({".checkpoint.old11": (1, True), ".checkpoint.tmp11": (2, True)}, 2),
    "swapped, old not yet removed": ({"checkpoint": (2, True), ".checkpoint.old11": (1, True)}, 2),
    "an earlier process's leftovers": ({"checkpoint": (3, True), ".checkpoint.tmp7": (2, False),
                                        ".checkpoint.old7": (1, True)}, 3),
}


@pytest.mark.parametrize("state", sorted(STATES))
def test_recover_finds_the_newest_complete_checkpoint_after_a_kill_anywhere(tmp_path, state):
    layout, want = STATES[state]
    for name, (step, complete) in layout.items():
        _write(tmp_path / name, step, complete, stamp=step)  # later checkpoints, later stamps
    got = recover(tmp_path / "checkpoint")
    assert (got is None) == (want is None)
    if want is not None:
        assert got == tmp_path / "checkpoint" and _step(got) == want
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if want is None else ["checkpoint"])


def test_atomic_dir_leaves_the_old_folder_when_the_write_fails(tmp_path):
    _write(tmp_path / "checkpoint", 1)
    with pytest.raises(RuntimeError):
        with atomic_dir(tmp_path / "checkpoint") as tmp:
            (tmp / "trainer.json").write_text(json.dumps({"step": 2}))
            raise RuntimeError("killed mid-write")
    assert _step(tmp_path / "checkpoint") == 1 and os.listdir(tmp_path) == ["checkpoint"]
    with atomic_dir(tmp_path / "checkpoint") as tmp:
        (tmp / "trainer.json").write_text(json.dumps({"step": 2}))
    assert _step(tmp_path / "checkpoint") == 2 and (tmp_path / "checkpoint" / COMPLETE).exists()


def test_prior_run_checks_resume_against_the_run_dir(tmp_path):
    run = tmp_path / "run"
    assert prior_run(run, False).checkpoint is None  # a fresh dir
    assert prior_run(run, "auto").checkpoint is None
    with pytest.raises(ResumeError, match="holds no complete checkpoint"):
        prior_run(run, True)
    _write(run / ".checkpoint.old3", 4)  # killed between the renames of its last checkpoint swap
    (run / "metrics.jsonl").write_text("")
    assert prior_run(run, True).checkpoint == run / "checkpoint" and _step(run / "checkpoint") == 4
    with pytest.raises(ResumeError, match="already holds a run"):
        prior_run(run, False)
    (run / "summary.json").write_text(json.dumps({"run_dir": str(run), "steps": 4}))
    with pytest.raises(AlreadyFinished):
        prior_run(run, "auto")
    with pytest.raises(ResumeError, match="resume='yes': expected false, true or auto"):
        prior_run(run, "yes")


@pytest.fixture
def restore_determinism():
    """seed_everything switches a process-wide torch flag: put it back for the tests after."""
    was = torch.are_deterministic_algorithms_enabled(), os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    yield
    torch.use_deterministic_algorithms(was[0], warn_only=True)
    if was[1] is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)


def test_the_deterministic_key_is_off_by_default_and_off_on_a_cuda_process(monkeypatch, restore_determinism):
    """The sources do not turn deterministic algorithms on; on CUDA they NaN-fill every ``torch.empty``
    (ZeRO-3 gather buffers, a colocated vLLM). The default leaves them off, whatever the device (a CUDA process
    faked here: seed_everything never asks the device), and leaves cuBLAS's workspace alone."""
    from core.config import schema

    assert schema.Config.deterministic is False and EvalRunConfig.deterministic is False
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    torch.use_deterministic_algorithms(True)
    seed_everything(0, deterministic=schema.Config.deterministic)
    assert not torch.are_deterministic_algorithms_enabled() and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    seed_everything(0, deterministic=True)
    assert torch.are_deterministic_algorithms_enabled() and os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
