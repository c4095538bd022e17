"""Seeding, RNG state, atomic checkpoint folders, and what a run dir holds from an earlier run.

A folder is written as a temporary sibling, marked complete, then swapped in (:func:`atomic_dir`); a kill
at any instant leaves either the old or the new folder complete, and :func:`recover` puts the newest
complete one back in place and removes the rest. Data parallel: every rank writes its part (DeepSpeed shards,
its own RNG state) into one temporary folder that rank 0 created, and rank 0 renames it once all ranks are done
(barriers between).

Training checkpoints (:func:`save_training_state`) are ``checkpoint-<step>/`` folders in the run dir, the last
``train.keep_checkpoints`` of them kept (Hugging Face Trainer's ``checkpoint-<step>`` and ``save_total_limit``;
veRL's ``max_actor_ckpt_to_keep``). Each holds a manifest written last (core/training/manifest.py: every file's
size and SHA-256), and ``resume`` takes the newest one whose files match it (:func:`prior_run`): a newer one that
does not (truncated on a shared file system, a file gone) is moved to ``corrupt/`` with a warning and the one before
it resumes; with none that verifies the resume is refused and nothing is moved. Before a write, the free space is
checked against the newest checkpoint's size (before the first, the training state's); a write that fails in any way
removes its own partial copy and leaves the older checkpoints as they were (:class:`CheckpointWriteError`)."""
from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from core.errors import InputError
from core.training import distributed
from core.training.manifest import manifest_bytes, verify, write_manifest
from core.writes import WriteError, free_bytes, free_text, size_text

log = logging.getLogger(__name__)


def seed_everything(seed: int, deterministic: bool) -> None:
    """Seed python, numpy and torch (every device); ``deterministic`` (config key ``deterministic``) also turns
    on torch's deterministic algorithms for the whole process.

    On a CPU a seeded run repeats bit for bit either way (its kernels are deterministic as they are, for a
    fixed thread count); the switch adds only the NaN fill of uninitialised memory. On CUDA it picks the
    deterministic kernels, fixes cuBLAS's workspace (``CUBLAS_WORKSPACE_CONFIG``, before its first call),
    warns on ops without one, and fills every ``torch.empty`` with NaN
    (``torch.utils.deterministic.fill_uninitialized_memory``), ZeRO-3's gather buffers and a colocated vLLM's
    included: a cost none of the sources pays (none turns it on), hence off by default."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(deterministic, warn_only=True)


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


@contextmanager
def atomic_dir(final: Path):
    """Yield a temporary sibling folder; on success it replaces ``final`` in one rename. Collective under
    data parallelism: every rank gets the same folder, rank 0 creates and renames it."""
    final = Path(final)
    many = distributed.world() > 1
    tmp = final.with_name(f".{final.name}.tmp" if many else f".{final.name}.tmp{os.getpid()}")
    if distributed.is_main():
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    distributed.barrier()
    try:
        yield tmp
    except BaseException:
        if distributed.is_main():
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    distributed.barrier()  # every rank has written its part
    if distributed.is_main():
        (tmp / COMPLETE).write_text(str(time.time_ns()))  # from here on a complete copy, wherever it lies
        old = final.with_name(f".{final.name}.old{os.getpid()}")
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    distributed.barrier()


COMPLETE = "COMPLETE"  # written into a folder once all of it is written; holds the time in ns


def recover(final: Path) -> Path | None:
    """After an interrupted :func:`atomic_dir`: the newest complete copy among ``final`` and its siblings
    (``final`` itself and ``.old*`` were swapped-in copies, so complete; a ``.tmp*`` is complete once
    marked) takes ``final``'s place, every other sibling is removed. ``final`` if one was complete, else
    None. Call on rank 0 only, before anything writes there."""
    final = Path(final)
    siblings = [*final.parent.glob(f".{final.name}.tmp*"), *final.parent.glob(f".{final.name}.old*")]
    complete = [p for p in [final, *siblings] if p.is_dir() and (p is final or ".old" in p.name or
                                                                  (p / COMPLETE).exists())]

    def stamp(p: Path) -> int:
        return int((p / COMPLETE).read_text()) if (p / COMPLETE).exists() else 0

    newest = max(complete, key=stamp, default=None)
    if newest is not None and newest != final:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(newest, final)
        log.warning("recovered %s from an interrupted write (%s)", final, newest.name)
    for p in siblings:
        shutil.rmtree(p, ignore_errors=True)
    return final if newest is not None else None


class ResumeError(InputError):
    """``resume`` asks for something the run dir does not hold (or holds and was not asked about)."""


class AlreadyFinished(Exception):
    """The run dir holds a finished run; ``summary`` is its results row."""

    def __init__(self, summary: dict):
        super().__init__(f"{summary.get('run_dir')} holds a finished run")
        self.summary = summary


@dataclass
class PriorRun:
    checkpoint: Path | None  # the newest complete checkpoint, to resume from
    step: int = 0  # the step it saved
    finished: int | None = None  # the steps of the finished run this resume extends


RESUME_MODES = (False, True, "auto")
CORRUPT = "corrupt"  # in the run dir: checkpoints that did not verify, moved aside once an older one resumes


@dataclass
class Found:
    """What a run dir holds from an earlier run (rank 0 looked; every rank gets it)."""

    checkpoint: str | None  # the newest checkpoint that verifies
    step: int  # the step it saved (0 without one)
    unreadable: list[tuple[str, str]]  # newer checkpoints that do not verify: (folder, what is wrong)
    summary: dict | None  # summary.json: the run finished
    recorded: list[int]  # the training steps metrics.jsonl records (step >= 1)
    metrics: bool  # metrics.jsonl exists


def prior_run(run_dir: Path, resume, total_steps: int | None = None) -> PriorRun:
    """What ``run_dir`` holds from an earlier run, checked against ``resume`` (false: a fresh run, and the dir
    must hold none; true: continue from its newest verified checkpoint, which must exist; auto: continue if
    there is one, else start afresh). A finished run (``summary.json``) resumed with more ``total_steps`` than it
    ran continues from its newest checkpoint; with as many (or ``total_steps`` None) :class:`AlreadyFinished` is
    raised, :class:`ResumeError` for fewer, for an extension without a checkpoint and for the cases above.

    Nothing a refusal does not replace is removed: checkpoints that do not verify stay where they are when the resume
    is refused (``resume`` true or auto with no checkpoint that verifies: auto never starts afresh over them), and are
    moved to ``corrupt/`` only once an older one that verifies is resumed. Rank 0 looks and repairs interrupted writes
    (:func:`recover`), every rank checks its share of the files (:func:`verified`), every rank gets the answer, and the
    console says what resumes."""
    if resume not in RESUME_MODES:
        raise ResumeError(f"resume={resume!r}: expected false, true or auto")
    run_dir = Path(run_dir)
    ckpt, unreadable = verified(run_dir)
    found = None
    if distributed.is_main():
        recover(run_dir / "model")
        summary, metrics = run_dir / "summary.json", run_dir / "metrics.jsonl"
        found = Found(str(ckpt) if ckpt else None,
                      json.loads((ckpt / "trainer.json").read_text())["step"] if ckpt else 0,
                      [(str(p), why) for p, why in unreadable],
                      json.loads(summary.read_text()) if summary.exists() else None, recorded_steps(metrics),
                      metrics.exists())
    found = distributed.broadcast_object(found)
    if resume is False and (found.checkpoint or found.unreadable or found.summary or found.metrics):
        raise ResumeError(f"resume=false but {run_dir} already holds a run ({_holds(found)}); continue it with "
                          f"resume=true or resume=auto, or give a fresh hydra.run.dir")
    if found.summary is not None and resume is not False:
        _check_extension(run_dir, found, total_steps)
    if found.checkpoint is None and found.unreadable:
        raise ResumeError(f"resume={str(resume).lower()}: {run_dir} holds no checkpoint that verifies ({_holds(found)})"
                          f"; nothing was moved or removed, and resume=auto does not start afresh over them. Copy "
                          f"them back from a backup, or start over in a fresh hydra.run.dir (or move {run_dir} aside)")
    if resume is True and found.checkpoint is None:
        raise ResumeError(f"resume=true but {run_dir} holds no complete checkpoint: no checkpoint-<step> folder ("
                          f"{_holds(found)}); resume=auto starts the run afresh there"
                          + (", running the steps metrics.jsonl records again" if found.recorded else ""))
    prior = PriorRun(Path(found.checkpoint) if found.checkpoint else None, int(found.step),
                     int(found.summary["steps"]) if found.summary else None)
    _set_aside(run_dir, found)
    _announce(run_dir, prior, total_steps)
    return prior


def recorded_steps(metrics: Path) -> list[int]:
    """The training steps (>= 1) a ``metrics.jsonl`` records, in order (none when it is missing)."""
    if not metrics.exists():
        return []
    steps = []
    for line in metrics.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            step = json.loads(line).get("step")
        except (ValueError, AttributeError):
            continue  # a line cut by a kill: the resume cuts the file back anyway
        if isinstance(step, int) and step >= 1 and (not steps or steps[-1] != step):
            steps.append(step)
    return steps


def _holds(found: Found) -> str:
    """What a run dir holds, as found: its checkpoints (each unreadable one with what is wrong), its records."""
    parts = [f"{Path(p).name}: unreadable, {why}" for p, why in found.unreadable]
    parts += [f"{Path(found.checkpoint).name} verifies"] if found.checkpoint else []
    if found.recorded:
        parts.append(f"metrics.jsonl records {len(found.recorded)} steps, {found.recorded[0]}-{found.recorded[-1]}")
    elif found.metrics:
        parts.append("metrics.jsonl records no training step")
    parts += ["summary.json: finished"] if found.summary else []
    return "; ".join(parts) or "nothing of a run"


def _set_aside(run_dir: Path, found: Found) -> None:
    """Rank 0 moves the checkpoints newer than the one resumed that do not verify into ``corrupt/`` (their steps run
    again): kept for a look, out of the way of the new checkpoints of those steps."""
    if distributed.is_main():
        for path, why in found.unreadable:
            dest = run_dir / CORRUPT / Path(path).name
            n = 0
            while dest.exists():
                n += 1
                dest = run_dir / CORRUPT / f"{Path(path).name}.{n}"
            dest.parent.mkdir(exist_ok=True)
            os.replace(path, dest)
            log.warning("checkpoint %s is unreadable (%s): moved to %s (%s; remove it once looked at); resuming "
                        "from %s", path, why, dest, size_text(_du(dest)), Path(found.checkpoint).name)
    distributed.barrier()


def _du(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


PREFIX = "checkpoint-"  # checkpoint-<step>: Hugging Face Trainer's PREFIX_CHECKPOINT_DIR and naming
_NAMED = re.compile(rf"^\.?{PREFIX}(\d+)(\.(tmp|old)\d*)?$")  # a checkpoint, or a leftover of its atomic_dir


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """The run dir's ``checkpoint-<step>`` folders, newest step first (leftovers of a write not included)."""
    run_dir = Path(run_dir)
    found = [(int(m.group(1)), p) for p in run_dir.iterdir() if (m := _NAMED.match(p.name)) and p.name[0] != "."
             and not m.group(2) and p.is_dir()] if run_dir.is_dir() else []
    return [p for _, p in sorted(found, reverse=True)]


def verified(run_dir: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest ``checkpoint-<step>`` whose files match its manifest (None when none does), and each newer one that
    does not, with what is wrong; nothing is removed (collective: rank 0 repairs interrupted writes, every rank hashes
    its share of each candidate's files)."""
    run_dir = Path(run_dir)
    if distributed.is_main() and run_dir.is_dir():
        for step in sorted({int(m.group(1)) for p in run_dir.iterdir() if (m := _NAMED.match(p.name))}):
            recover(run_dir / f"{PREFIX}{step}")
    unreadable = []
    for path in map(Path, distributed.broadcast_object([str(p) for p in checkpoint_dirs(run_dir)])):
        problems = [p for p in distributed.gather_objects(verify(path, distributed.rank(), distributed.world()))
                    if p]
        if not problems:
            return path, unreadable
        unreadable.append((path, "; ".join(problems)))
    return None, unreadable


def _check_extension(run_dir: Path, found: Found, total_steps: int | None) -> None:
    """A finished run resumed: raise :class:`AlreadyFinished` when it asks for no more steps than it ran, a
    :class:`ResumeError` saying what to do when it cannot be extended; return when it can."""
    done = int(found.summary["steps"])
    if total_steps is None or total_steps == done:
        raise AlreadyFinished(found.summary)
    if total_steps < done:
        raise ResumeError(f"{run_dir} holds a run finished at step {done}; train.total_steps={total_steps} would "
                          f"not extend it: give more than {done} steps to continue it, or a fresh hydra.run.dir")
    if found.checkpoint is None and not found.unreadable:
        raise ResumeError(f"train.total_steps={total_steps} would extend {run_dir} (finished at step {done}), but "
                          f"it holds no checkpoint-<step> folder; start a new run from its final model: "
                          f"model.name_or_path={run_dir}/model hydra.run.dir=<a fresh dir>")


def _announce(run_dir: Path, prior: PriorRun, total_steps: int | None) -> None:
    """One line, before any model is built, when a checkpoint resumes: from which step (a fresh run's dir is in the
    loop's start summary, core/reporting/console.py)."""
    if not distributed.is_main() or prior.checkpoint is None:
        return
    of = f" of {total_steps}" if total_steps else ""
    if prior.finished is not None:
        log.info("extending %s (finished at step %d) to %d steps: resuming from step %d (checkpoint %s)",
                 run_dir, prior.finished, total_steps, prior.step, prior.checkpoint)
    else:
        log.info("resuming %s from step %d%s (checkpoint %s)", run_dir, prior.step, of, prior.checkpoint)


def _rank_file(ckpt_dir: Path, stem: str) -> Path:
    """This rank's own file (rank 0 keeps the single-process name)."""
    r = distributed.rank()
    return Path(ckpt_dir) / (f"{stem}.pt" if r == 0 else f"{stem}.rank{r}.pt")


class CheckpointWriteError(WriteError):
    """A checkpoint could not be written (no space for it before the write, or any failure of the write itself); its
    partial copy is removed and the older checkpoints are as they were."""


def save_training_state(run_dir: Path, engine, extra: dict, local=None, *, keep: int) -> Path:
    """``checkpoint-<extra["step"]>`` in ``run_dir``: engine state, RNG states and ``extra`` (step, sampler
    position: rank 0's, as JSON), atomically, its manifest written last; ``local``, when not None, is this rank's
    own state (the batch generated ahead), in its own file. Then only the newest ``keep`` checkpoints stay
    (``train.keep_checkpoints``). Collective. ``engine`` answers ``save_state(dir)`` and ``state_bytes()``.

    Raises :class:`CheckpointWriteError` when the file system lacks the space before the write (the newest
    checkpoint's size; before the first, ``engine.state_bytes()``), or when the write fails in any way: a full disk
    is ``OSError(ENOSPC)`` from Python's own writes but ``RuntimeError`` from torch's (core/writes.py), so the type of
    the error says nothing. The partial copy is removed first (:func:`atomic_dir`), every older checkpoint intact."""
    run_dir, step = Path(run_dir), int(extra["step"])
    final = run_dir / f"{PREFIX}{step}"
    _check_space(run_dir, final, engine)
    try:
        with atomic_dir(final) as tmp:
            engine.save_state(tmp)
            torch.save(rng_state(), _rank_file(tmp, "rng"))
            if local is not None:
                torch.save(local, _rank_file(tmp, "local"))
            if distributed.is_main():
                (tmp / "trainer.json").write_text(json.dumps(extra))
            write_manifest(tmp, step)  # collective: after every rank's files, before the folder is marked complete
    except Exception as e:
        raise CheckpointWriteError(f"writing {final} failed ({type(e).__name__}: {str(e).strip()[:300]}); its "
                                   f"partial copy is removed, leaving {free_text(final)}, and {_intact(run_dir)}: "
                                   f"free space on that file system (or lower train.keep_checkpoints) and rerun with "
                                   f"resume=auto") from e
    if distributed.is_main():
        for old in checkpoint_dirs(run_dir)[keep:]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _check_space(run_dir: Path, final: Path, engine) -> None:
    """Raise :class:`CheckpointWriteError` on every rank when the run dir's file system has less free space than the
    new checkpoint takes: the newest checkpoint's size (the new one is written beside it), or before the first, the
    engine's state size (``engine.state_bytes()``)."""
    problem = None
    if distributed.is_main():
        newest = next(iter(checkpoint_dirs(run_dir)), None)
        need, of = (manifest_bytes(newest), f"the size of {newest.name}") if newest is not None else \
            (int(engine.state_bytes()), "the size of the training state: weights, optimiser")
        free = free_bytes(run_dir)
        if need > free:
            problem = (f"not writing {final}: it needs about {size_text(need)} ({of}) and the file system of "
                       f"{run_dir} has {size_text(free)} free; {_intact(run_dir)}: free space"
                       f"{' (or lower train.keep_checkpoints)' if newest is not None else ''} and rerun with "
                       f"resume=auto")
    problem = distributed.broadcast_object(problem)
    if problem:
        raise CheckpointWriteError(problem)


def _intact(run_dir: Path) -> str:
    newest = checkpoint_dirs(run_dir)
    return f"{newest[0].name} is intact" if newest else "there was no earlier checkpoint (this was the first)"


def load_training_state(ckpt_dir: Path, engine) -> dict:
    """``extra`` as saved, with this rank's ``local`` state under ``"local"`` (None when it saved none)."""
    engine.load_state(ckpt_dir)
    set_rng_state(torch.load(_rank_file(ckpt_dir, "rng"), weights_only=False))
    local = _rank_file(ckpt_dir, "local")
    state = json.loads((Path(ckpt_dir) / "trainer.json").read_text())
    return {**state, "local": torch.load(local, map_location="cpu", weights_only=False) if local.exists() else None}
