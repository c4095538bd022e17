"""``core.training.checkpoint``: a folder written through ``atomic_dir`` survives a kill at any instant of its
write and swap; ``recover`` puts the newest complete copy back and clears the leftovers; ``prior_run`` checks
``resume`` against what the run dir holds."""
from __future__ import annotations

import json
import os

import pytest

from core.training.checkpoint import (COMPLETE, AlreadyFinished, ResumeError, atomic_dir, prior_run,
                                      recover)


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
