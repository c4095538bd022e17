"""Run by tests/core/test_full_disk.py inside a private mount namespace, with a small tmpfs mounted at ``argv[1]``:
each write of a run's output meets a really full file system (no mock), and the last line printed is JSON saying
what happened (the error each write raised, its cause's type, what the file system holds after)."""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import torch

from core.reporting.metrics import MetricsWriter
from core.reporting.results import append_row, read_rows, write_summary
from core.training.checkpoint import prior_run, save_training_state
from core.writes import WriteError

FS = Path(sys.argv[1])
MiB = 2**20


def fill(path: Path) -> None:
    """Write ``path`` until the file system is full (page by page, so no page is left), as another job would."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for chunk in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError:
                continue
    finally:
        os.close(fd)


class Engine:
    """An engine's ``save_state`` of ``size`` bytes; with ``neighbour``, another job fills the disk as it starts."""

    def __init__(self, size: int, neighbour: Path | None = None):
        self.size, self.neighbour = size, neighbour

    def save_state(self, out_dir) -> None:
        if self.neighbour is not None:
            fill(self.neighbour)
        torch.save(torch.zeros(self.size // 4, dtype=torch.float32), Path(out_dir) / "engine.pt")

    def state_bytes(self) -> int:
        return self.size


def attempt(write) -> dict:
    try:
        write()
    except WriteError as e:
        return {"error": type(e).__name__, "message": str(e), "cause": type(e.__cause__).__name__}
    return {"error": None}


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def checkpoints() -> dict:
    out, run = {}, FS / "ckpt"
    run.mkdir()
    out["first_too_big"] = attempt(lambda: save_training_state(run, Engine(6 * MiB), {"step": 1}, keep=2))
    out["after_first"] = listing(run)
    save_training_state(run, Engine(MiB), {"step": 1}, keep=2)
    out["mid_write"] = attempt(lambda: save_training_state(run, Engine(MiB, FS / "other_job.bin"), {"step": 2},
                                                           keep=2))
    out["after_mid_write"] = listing(run)
    (FS / "other_job.bin").unlink()
    out["resumes_from"] = prior_run(run, True).step
    shutil.rmtree(run)
    return out


def records() -> dict:
    out, run = {}, FS / "records"
    run.mkdir()
    writer = MetricsWriter(run, tensorboard=False)
    writer.log(1, {"loss": 1.0})
    (run / "summary.json").write_text('{"steps": 1}')
    append_row(FS / "results", {"run_dir": str(run), "steps": 1})
    before = {p: (run / p).read_bytes() for p in ("metrics.jsonl", "summary.json")}
    table = read_rows(FS / "results")
    fill(FS / "other_job.bin")
    long = {"loss": 2.0, "note": "x" * 20000}  # more than a page: it needs space the file system no longer has
    out["metrics"] = attempt(lambda: writer.log(2, long))
    out["results"] = attempt(lambda: append_row(FS / "results", {"run_dir": str(run), "steps": 2, **long}))
    out["summary"] = attempt(lambda: write_summary(run, {"steps": 2, **long}))
    out["intact"] = all((run / p).read_bytes() == b for p, b in before.items()) and read_rows(FS / "results") == table
    out["after"] = listing(run)
    return out


if __name__ == "__main__":
    print(json.dumps({"checkpoints": checkpoints(), "records": records()}))
