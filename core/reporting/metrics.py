"""Per-step metrics: phase timers, peak memory, ``metrics.jsonl``, TensorBoard and Weights & Biases."""
from __future__ import annotations

import hashlib
import json
import math
import os
import resource
import shutil
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from core.writes import appending, replace_text


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


def to_floats(metrics: dict) -> dict:
    """``metrics`` with its tensors (detached scalars kept on the device while a step accumulates them, so no
    micro-batch waits for the GPU) turned into floats in one host transfer; plain numbers pass through. float64
    holds every float32 value exactly, so the floats are those ``.item()`` would give."""
    keys = [k for k, v in metrics.items() if torch.is_tensor(v)]
    if not keys:
        return dict(metrics)
    values = torch.stack([metrics[k].double() for k in keys]).tolist()  # the one sync
    return {**metrics, **dict(zip(keys, values))}


_CLEAR_REFS, _STATUS = Path("/proc/self/clear_refs"), Path("/proc/self/status")


def _cpu_peak_resettable() -> bool:
    """Whether Linux lets this process reset its high-water RSS (``VmHWM``) by writing ``5`` to
    ``/proc/self/clear_refs`` (proc(5))."""
    return os.access(_CLEAR_REFS, os.W_OK)


def reset_peak_memory() -> None:
    """Start a step's peak memory (the loops call it first in a step, :func:`peak_memory` last): CUDA's allocator
    peak, or on the CPU the process's high-water RSS, reset to the current RSS."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats()
    elif _cpu_peak_resettable():
        _CLEAR_REFS.write_text("5")


def peak_memory() -> dict[str, float]:
    """The step's peak since :func:`reset_peak_memory`, in MiB, as ``memory/peak_mb``: GPU memory allocated by
    torch if CUDA is in use, else the process's high-water RSS. Where the CPU's cannot be reset it is the peak
    since the process started, named ``memory/peak_since_start_mb`` so it is not read as the step's. This rank's: the
    loops log the largest over ranks (core/training/distributed.py ``mean_metrics``)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return {"memory/peak_mb": torch.cuda.max_memory_allocated() / 2**20}
    if _cpu_peak_resettable():
        hwm = next(line for line in _STATUS.read_text().splitlines() if line.startswith("VmHWM:"))
        return {"memory/peak_mb": int(hwm.split()[1]) / 1024}  # kB
    return {"memory/peak_since_start_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # Linux: KiB


class MetricsWriter:
    """The run's records: one JSON line per step's metrics in ``metrics.jsonl`` and one per sample completion in
    ``samples.jsonl`` (each flushed at once), mirrored to TensorBoard under ``<run_dir>/tb`` when enabled (scalars,
    and the samples as text). The JSONL files are the record; TensorBoard mirrors them. ``rows`` and
    ``sample_rows`` count the lines written, which a checkpoint keeps: a resumed run cuts the files back to them
    (:meth:`rewind`), so every record holds each step once however the run was killed."""

    def __init__(self, run_dir: Path, tensorboard: bool = True, enabled: bool = True, wandb=None,
                 config: dict | None = None):
        self.enabled = enabled
        self.path, self.samples_path = Path(run_dir) / "metrics.jsonl", Path(run_dir) / "samples.jsonl"
        self.tb_dir = Path(run_dir) / "tb"
        self.tb = self._open_tb() if enabled and tensorboard else None
        self.wandb = WandbMirror(Path(run_dir), wandb, config or {}) if enabled and wandb and wandb.enabled else None
        self.rows, self.sample_rows = len(_lines(self.path)), len(_lines(self.samples_path))

    def _open_tb(self):
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(str(self.tb_dir))

    def log(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        row = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        _append(self.path, [row])
        self.rows += 1
        self._mirror(row)

    def samples(self, step: int, records: list[dict]) -> None:
        """Sample completions of ``step`` (each a dict: prompt, completion, reward, ...)."""
        if not self.enabled or not records:
            return
        rows = [{"step": step, **r} for r in records]
        _append(self.samples_path, rows)
        self.sample_rows += len(rows)
        self._mirror_samples(step, rows)

    def _mirror(self, row: dict) -> None:
        if self.tb is not None:
            for k, v in row.items():
                if isinstance(v, (int, float)) and k != "step" and math.isfinite(v):
                    self.tb.add_scalar(k, v, row["step"])
        if self.wandb is not None:
            self.wandb.log(row)

    def _mirror_samples(self, step: int, rows: list[dict]) -> None:
        if self.tb is not None:
            text = "\n\n".join("\n".join(f"**{k}**: `{v}`" for k, v in r.items() if k != "step") for r in rows)
            self.tb.add_text("samples", text, step)
        if self.wandb is not None:
            self.wandb.samples(step, rows)

    def rewind(self, rows: int, sample_rows: int = 0) -> None:
        """Keep the first ``rows`` metrics and ``sample_rows`` sample records (what a checkpoint saw), each file
        rewritten atomically, and TensorBoard's events rebuilt from them."""
        if not self.enabled:
            return
        kept = _truncate(self.path, rows)
        samples = _truncate(self.samples_path, sample_rows)
        self.rows, self.sample_rows = len(kept), len(samples)
        if self.tb is not None:
            self.tb.close()
            shutil.rmtree(self.tb_dir, ignore_errors=True)
            self.tb = self._open_tb()
            for line in kept:
                self._mirror(json.loads(line))
            by_step = {}
            for line in samples:
                r = json.loads(line)
                by_step.setdefault(r["step"], []).append(r)
            for step, rs in by_step.items():
                self._mirror_samples(step, rs)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


class WandbMirror:
    """The metrics and samples, mirrored to a Weights & Biases run (``logger.wandb``; the ``wandb`` extra).

    The run's id is derived from the run dir, so a resumed run continues its W&B run (``resume="allow"``).
    Each row goes to W&B's own step (``step=``). W&B cannot cut a run back: after a resume it ignores the
    steps the killed attempt had already sent (its steps must not decrease), so it holds each step once, and
    since a resume repeats those steps bit for bit, the values it keeps are the same. ``mode: offline``
    writes under ``<run_dir>/wandb`` with no network (``wandb sync`` uploads later).
    """

    def __init__(self, run_dir: Path, cfg, config: dict):
        try:
            import wandb
        except ImportError as e:
            raise ImportError("logger.wandb.enabled=true needs wandb: pip install -e '.[wandb]'") from e
        self._wandb = wandb
        run_id = hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:16]
        self.run = wandb.init(project=cfg.project, entity=cfg.entity, group=cfg.group, tags=list(cfg.tags),
                              name=cfg.name or f"{run_dir.parent.name}/{run_dir.name}", id=run_id, resume="allow",
                              dir=str(run_dir), mode=cfg.mode, config=_plain_config(config))

    def log(self, row: dict) -> None:
        scalars = {k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float)) and math.isfinite(v)}
        self.run.log(scalars, step=int(row["step"]))

    def samples(self, step: int, rows: list[dict]) -> None:
        columns = sorted({k for r in rows for k in r})
        table = self._wandb.Table(columns=columns, data=[[str(r.get(c, "")) for c in columns] for r in rows])
        self.run.log({"samples": table}, step=int(step))

    def finish(self) -> None:
        self.run.finish()


def _record(line: str) -> dict:
    """A logged line as its record; a line a kill cut short is kept as its text."""
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return {"unparsed": line}


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def _append(path: Path, rows: list[dict]) -> None:
    """``rows`` appended to ``path`` in one write; a failed write (a full disk) leaves the file as it was and raises
    :class:`core.writes.WriteError` naming it and the free space."""
    with appending(path), open(path, "a", encoding="utf-8") as fh:
        fh.write("".join(json.dumps(r, default=str) + "\n" for r in rows))


SUPERSEDED = "superseded"  # the run dir's folder of records a rewind cut (an attempt's steps that run again)


def _truncate(path: Path, n: int) -> list[str]:
    """``path``'s first ``n`` lines, written back atomically (a missing file stays missing); returns them. The lines
    cut are appended first to ``superseded/<name>`` beside it, each with the time it was cut: the steps after the
    checkpoint a run resumes from (or all of them, where a killed attempt left none) run again and are logged once in
    ``path``, and what the attempt had logged of them is kept, not lost (docs/reliability.md)."""
    lines = _lines(path)
    if len(lines) > n:
        aside = path.parent / SUPERSEDED / path.name
        aside.parent.mkdir(exist_ok=True)
        cut_at = time.time()
        with appending(aside), open(aside, "a", encoding="utf-8") as f:
            f.writelines(json.dumps({**_record(line), "superseded_at": cut_at}) + "\n" for line in lines[n:])
    if path.exists():
        replace_text(path, "".join(line + "\n" for line in lines[:n]))
    return lines[:n]


def _plain_config(cfg) -> dict:
    """The run config as plain JSON types (a DictConfig or the frozen config)."""
    from omegaconf import OmegaConf

    node = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else cfg
    return json.loads(json.dumps(node, default=str))


def _plain(v):
    if isinstance(v, torch.Tensor):
        return v.item()
    return v

