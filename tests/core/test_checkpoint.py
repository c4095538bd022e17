"""``core.training.checkpoint``: a folder written through ``atomic_dir`` survives a kill at any instant of its
write and swap; ``recover`` puts the newest complete copy back and clears the leftovers; ``prior_run`` checks
``resume`` against what the run dir holds. Training checkpoints: the last ``keep`` kept, each verified against its
manifest before a resume (a truncated or altered newest one falls back to the one before), free space checked before
a write, and a write that runs out of space leaves the older ones intact."""
from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
import torch

from core.evaluation.schema import EvalRunConfig
from core.training import checkpoint as C
from core.training.checkpoint import (COMPLETE, AlreadyFinished, CheckpointWriteError, ResumeError, atomic_dir,
                                      checkpoint_dirs, prior_run, recover, save_training_state, seed_everything)


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
    os.replace(_save(run, 4), run / ".checkpoint-4.old3")  # killed between the renames of a swap of checkpoint-4
    (run / "metrics.jsonl").write_text("")
    assert prior_run(run, True).checkpoint == run / "checkpoint-4" and _step(run / "checkpoint-4") == 4
    with pytest.raises(ResumeError, match="already holds a run"):
        prior_run(run, False)
    (run / "summary.json").write_text(json.dumps({"run_dir": str(run), "steps": 4}))
    with pytest.raises(AlreadyFinished):
        prior_run(run, "auto")
    with pytest.raises(ResumeError, match="resume='yes': expected false, true or auto"):
        prior_run(run, "yes")


class _Engine:
    """An engine's ``save_state``: one file of ``size`` bytes, as DeepSpeed's shards or the plain engine's
    ``engine.pt`` are."""

    def __init__(self, size: int = 1000):
        self.size = size

    def save_state(self, out_dir) -> None:
        torch.save(torch.zeros(self.size // 4, dtype=torch.float32), Path(out_dir) / "engine.pt")

    def state_bytes(self) -> int:
        return self.size


def _save(run, step: int, keep: int = 2, engine=None) -> Path:
    return save_training_state(run, engine or _Engine(), {"step": step}, keep=keep)


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_the_last_keep_checkpoints_stay(tmp_path, keep):
    for step in range(1, 6):
        _save(tmp_path, step, keep)
    assert [p.name for p in checkpoint_dirs(tmp_path)] == [f"checkpoint-{s}" for s in range(5, 5 - keep, -1)]
    assert sorted(os.listdir(tmp_path)) == sorted(f"checkpoint-{s}" for s in range(5, 5 - keep, -1))
    manifest = json.loads((tmp_path / "checkpoint-5" / "MANIFEST.json").read_text())
    assert manifest["step"] == 5 and set(manifest["files"]) == {"engine.pt", "rng.pt", "trainer.json"}
    assert manifest["bytes"] == sum(f.stat().st_size for f in (tmp_path / "checkpoint-5").iterdir()
                                    if f.name not in ("MANIFEST.json", COMPLETE))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, problem", [
    (lambda c: _truncate(c / "engine.pt"), "engine.pt holds"),  # a short read on a shared file system
    (lambda c: _flip_a_byte(c / "engine.pt"), "engine.pt does not match its SHA-256"),  # same size, other bytes
    (lambda c: (c / "rng.pt").unlink(), "rng.pt is missing"),
    (lambda c: (c / "MANIFEST.json").unlink(), "no readable MANIFEST.json"),
])
def test_an_unreadable_newest_checkpoint_falls_back_to_the_one_before(tmp_path, caplog, damage, problem):
    for step in (1, 2):
        _save(tmp_path, step)
    damage(tmp_path / "checkpoint-2")
    kept = {p.name: p.read_bytes() for p in (tmp_path / "checkpoint-2").iterdir()}
    with caplog.at_level(logging.WARNING, logger=C.__name__):
        prior = prior_run(tmp_path, "auto")
    assert prior.checkpoint == tmp_path / "checkpoint-1" and prior.step == 1
    assert f"checkpoint {tmp_path / 'checkpoint-2'} is unreadable ({problem}" in caplog.text
    assert f"moved to {tmp_path / 'corrupt' / 'checkpoint-2'}" in caplog.text
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-1", "corrupt"]  # out of the way of the new checkpoint-2
    assert {p.name: p.read_bytes() for p in (tmp_path / "corrupt" / "checkpoint-2").iterdir()} == kept  # as it was


def test_a_refused_resume_moves_and_removes_nothing(tmp_path):
    """The issue's replay: every checkpoint's engine.pt damaged (64 bytes flipped). resume=true and resume=auto are
    refused, naming each checkpoint and what is wrong and the steps recorded, and every file stays as it was:
    auto does not start afresh over them."""
    for step in (2, 4, 6):
        _save(tmp_path, step, keep=2)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(7)))
    for step in (4, 6):
        engine = tmp_path / f"checkpoint-{step}" / "engine.pt"
        data = bytearray(engine.read_bytes())
        data[100:164] = bytes(b ^ 0xFF for b in data[100:164])
        engine.write_bytes(bytes(data))
    before = {str(p.relative_to(tmp_path)): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    for resume in (True, "auto"):
        with pytest.raises(ResumeError) as refused:
            prior_run(tmp_path, resume, 8)
        msg = str(refused.value)
        assert f"{tmp_path} holds no checkpoint that verifies (checkpoint-6: unreadable, engine.pt does not match its " \
               "SHA-256; checkpoint-4: unreadable, engine.pt does not match its SHA-256; metrics.jsonl records 6 " \
               "steps, 1-6)" in msg
        assert "nothing was moved or removed, and resume=auto does not start afresh over them" in msg
        assert "was train.checkpoint_every 0" not in msg and "starts afresh when" not in msg
        assert {str(p.relative_to(tmp_path)): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_resume_true_without_any_checkpoint_says_what_the_run_dir_holds(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(3)))
    with pytest.raises(ResumeError, match=r"resume=true but .* holds no complete checkpoint: no checkpoint-<step> "
                                          r"folder \(metrics.jsonl records 2 steps, 1-2\); resume=auto starts the run "
                                          r"afresh there, running the steps metrics.jsonl records again"):
        prior_run(tmp_path, True)
    assert prior_run(tmp_path, "auto").checkpoint is None  # killed before its first checkpoint: it starts afresh


def test_a_checkpoint_is_not_started_without_the_space_it_takes(tmp_path, monkeypatch):
    """The arithmetic of the check (a real full file system: tests/core/test_full_disk.py): before the first
    checkpoint the training state's size, then the newest checkpoint's."""
    from core import writes

    free = {"bytes": 3999}
    monkeypatch.setattr(writes.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**12, 0, free["bytes"]))
    with pytest.raises(CheckpointWriteError, match=r"not writing .*checkpoint-1: it needs about 3.9 KiB \(the size of "
                                                   r"the training state: weights, optimiser\) and the file system of "
                                                   r".* has 3.9 KiB free; there was no earlier checkpoint"):
        _save(tmp_path, 1, engine=_Engine(4000))
    assert os.listdir(tmp_path) == []
    free["bytes"] = 10**9
    _save(tmp_path, 1, engine=_Engine(4000))
    size = C.manifest_bytes(tmp_path / "checkpoint-1")
    free["bytes"] = size - 1
    with pytest.raises(CheckpointWriteError, match=r"not writing .*checkpoint-2: it needs about .* \(the size "
                                                   r"of checkpoint-1\).*checkpoint-1 is intact"):
        _save(tmp_path, 2, engine=_Engine(4000))
    assert os.listdir(tmp_path) == ["checkpoint-1"] and prior_run(tmp_path, True).step == 1
    free["bytes"] = size
    _save(tmp_path, 2, engine=_Engine(4000))
    assert prior_run(tmp_path, True).step == 2


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
