"""Full disks as they really fail (docs/reliability.md "Full disks"), on a real small file system: a tmpfs mounted in a
private mount namespace (``unshare --user --map-root-user --mount``, or ``--mount`` alone as root), so nothing is
mocked and nothing outside the test sees the mount. Skipped, with the reason, where the namespace or the mount cannot
be made (a container without user namespaces, a kernel that refuses them)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from core.paths import PROJECT_ROOT
from tests.helpers import CLI_ENV, FAST

UNSHARE = (["unshare", "--user", "--map-root-user", "--mount"], ["unshare", "--mount"])


@cache
def _namespace() -> tuple[list[str] | None, str]:
    """The ``unshare`` command that lets this process mount a tmpfs of its own, or None and why not."""
    import tempfile

    why = "no unshare(1) on this machine"
    for cmd in UNSHARE:
        with tempfile.TemporaryDirectory() as d:
            try:
                out = subprocess.run([*cmd, "sh", "-c", 'mount -t tmpfs -o size=64k tmpfs "$1"', "sh", d],
                                     capture_output=True, text=True, timeout=60)
            except FileNotFoundError:
                break
            if out.returncode == 0:
                return cmd, ""
            why = f"{' '.join(cmd)} cannot mount a tmpfs here: {out.stderr.strip()[-200:]}"
    return None, why


def in_tmpfs(tmp_path: Path, size: str, script: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """``script`` (sh) in a private mount namespace with a tmpfs of ``size`` at ``$MNT``; ``$OUT`` is ``tmp_path``
    (outside the tmpfs: what the script copies there outlives the namespace)."""
    cmd, why = _namespace()
    if cmd is None:
        pytest.skip(why)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = {**CLI_ENV, "MNT": str(mnt), "OUT": str(tmp_path), "PY": sys.executable, "PYTHONPATH": str(PROJECT_ROOT)}
    return subprocess.run([*cmd, "sh", "-c", f'mount -t tmpfs -o size={size} tmpfs "$MNT" && {script}'],
                          cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_every_write_of_a_run_meets_a_full_disk_and_leaves_what_was_there(tmp_path):
    """tests/full_disk_worker.py on a 4 MiB tmpfs: a first checkpoint larger than the disk is not started (its size
    from the training state); a checkpoint whose write fills the disk (another job takes the space while it writes)
    fails as torch really fails it (a ``RuntimeError``, not ``OSError``) and is reported as a CheckpointWriteError,
    its partial copy gone and the older one resuming; a metrics row, a results row and summary.json written to the
    full disk each raise a WriteError and leave their file as it was."""
    proc = in_tmpfs(tmp_path, "4m", '"$PY" -m tests.full_disk_worker "$MNT"')
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    ck, rec = got["checkpoints"], got["records"]
    assert ck["first_too_big"]["error"] == "CheckpointWriteError" and ck["after_first"] == []
    assert "checkpoint-1: it needs about 6.0 MiB (the size of the training state: weights, optimiser) and the file " \
           "system of" in ck["first_too_big"]["message"]
    assert ck["mid_write"]["error"] == "CheckpointWriteError" and ck["mid_write"]["cause"] == "RuntimeError"
    assert "checkpoint-2 failed (RuntimeError: [enforce fail at inline_container.cc" in ck["mid_write"]["message"]
    assert "its partial copy is removed, leaving 0 B free" in ck["mid_write"]["message"]
    assert "checkpoint-1 is intact" in ck["mid_write"]["message"]
    assert [p for p in ck["after_mid_write"] if "/" not in p] == ["checkpoint-1"] and ck["resumes_from"] == 1
    for what, file in (("metrics", "metrics.jsonl"), ("results", "runs.jsonl"), ("summary", "summary.json")):
        assert rec[what]["error"] == "WriteError", (what, rec[what])
        assert f"/{file} failed (OSError: [Errno 28] No space left on device)" in rec[what]["message"]
        assert "0 B free on the file system of" in rec[what]["message"]
    assert rec["intact"] and rec["after"] == ["metrics.jsonl", "summary.json"]  # no temporary file left


@pytest.mark.slow
def test_the_tiny_recipe_on_a_small_disk_stops_before_its_checkpoint_then_finishes(tmp_path):
    """The issue's replay: the tiny recipe with its run dir on a tmpfs too small for its first checkpoint stops at
    step 2 with a CheckpointWriteError (no traceback), steps 1-2 recorded; once the file system is larger,
    ``resume=auto`` finishes the run, each step recorded once, one results row."""
    keys = " ".join([*FAST, "train.total_steps=4", "train.checkpoint_every=2", "kl.coef=0"])
    run = f'"$PY" -m recipes.run hydra.run.dir="$MNT/run" paths.results_dir="$OUT/results"'
    proc = in_tmpfs(tmp_path, "160k", f'{run} {keys} > "$OUT/first.log" 2>&1; echo $? > "$OUT/first.rc"; '
                                      f'cp -r "$MNT/run" "$OUT/first"; mount -o remount,size=64m "$MNT" && '
                                      f'{run} resume=auto > "$OUT/second.log" 2>&1; echo $? > "$OUT/second.rc"; '
                                      f'cp -r "$MNT/run" "$OUT/second"', timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first = (tmp_path / "first.log").read_text()
    assert (tmp_path / "first.rc").read_text().strip() == "1" and "Traceback" not in first, first[-3000:]
    assert f"CheckpointWriteError: not writing {tmp_path}/mnt/run/checkpoint-2: it needs about" in first, first[-3000:]
    assert "(the size of the training state: weights, optimiser)" in first
    steps = [json.loads(line)["step"] for line in (tmp_path / "first" / "metrics.jsonl").read_text().splitlines()]
    assert [s for s in steps if s] == [1, 2] and not [p for p in os.listdir(tmp_path / "first") if "checkpoint" in p]
    second = (tmp_path / "second.log").read_text()
    assert (tmp_path / "second.rc").read_text().strip() == "0", second[-3000:]
    steps = [json.loads(line) for line in (tmp_path / "second" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if "reward/mean" in r] == [1, 2, 3, 4]
    assert len((tmp_path / "results" / "runs.jsonl").read_text().splitlines()) == 1
