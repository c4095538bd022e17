"""Seeding, RNG state and atomic checkpoint folders (a killed run never leaves half a checkpoint).

Data parallel: every rank writes its part (DeepSpeed shards, its own RNG state) into one temporary
folder that rank 0 created, and rank 0 renames it once all ranks are done (barriers between)."""
from __future__ import annotations

import json
import os
import random
import shutil
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from core.training import distributed


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (every device), and use deterministic kernels, so a run repeats bit for
    bit on the same machine: CPU kernels are deterministic as they are; on CUDA, cuBLAS needs its workspace
    fixed (``CUBLAS_WORKSPACE_CONFIG``, before its first call) and ops without a deterministic kernel warn."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)


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
        old = final.with_name(f".{final.name}.old{os.getpid()}")
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    distributed.barrier()


def _rng_file(ckpt_dir: Path) -> Path:
    """Each rank's RNG state (rank 0 keeps the single-process name)."""
    r = distributed.rank()
    return Path(ckpt_dir) / ("rng.pt" if r == 0 else f"rng.rank{r}.pt")


def save_training_state(ckpt_dir: Path, engine, extra: dict) -> None:
    """Engine state, RNG states and ``extra`` (step, sampler position) into ``ckpt_dir`` atomically."""
    with atomic_dir(ckpt_dir) as tmp:
        engine.save_state(tmp)
        torch.save(rng_state(), _rng_file(tmp))
        if distributed.is_main():
            (tmp / "trainer.json").write_text(json.dumps(extra))


def load_training_state(ckpt_dir: Path, engine) -> dict:
    engine.load_state(ckpt_dir)
    set_rng_state(torch.load(_rng_file(ckpt_dir), weights_only=False))
    return json.loads((Path(ckpt_dir) / "trainer.json").read_text())
