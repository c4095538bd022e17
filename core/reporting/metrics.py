"""Per-step metrics: phase timers, peak memory, ``metrics.jsonl`` and TensorBoard."""
from __future__ import annotations

import json
import math
import resource
import time
from contextlib import contextmanager
from pathlib import Path

import torch


class PhaseTimer:
    """Wall time per named phase (generate, verify, logprobs, update), reset every step. On CUDA each phase
    ends with a synchronise, so the kernels it queued count in its own time, not the next phase's."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def pop(self) -> dict[str, float]:
        out, self.seconds = {f"time/{k}": v for k, v in self.seconds.items()}, {}
        return out


def peak_memory_mb() -> float:
    """Peak GPU memory allocated by torch if CUDA is in use, else the process's peak RSS."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


class MetricsWriter:
    """Appends one JSON line per step to ``metrics.jsonl`` (flushed at once) and mirrors scalars to
    TensorBoard under ``<run_dir>/tb`` when enabled."""

    def __init__(self, run_dir: Path, tensorboard: bool = True, enabled: bool = True):
        self.enabled = enabled
        self.path = Path(run_dir) / "metrics.jsonl"
        self.tb = None
        if enabled and tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(Path(run_dir) / "tb"))

    def log(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        row = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
        if self.tb is not None:
            for k, v in row.items():
                if isinstance(v, (int, float)) and k != "step" and math.isfinite(v):
                    self.tb.add_scalar(k, v, step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def _plain(v):
    if isinstance(v, torch.Tensor):
        return v.item()
    return v

