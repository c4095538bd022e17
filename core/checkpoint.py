"""Seeding, RNG state and atomic checkpoint folders (a killed run never leaves half a checkpoint)."""
from __future__ import annotations

import json
import os
import random
import shutil
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch; use deterministic kernels so a CPU run repeats bit for bit."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


@contextmanager
def atomic_dir(final: Path):
    """Yield a temporary sibling folder; on success it replaces ``final`` in one rename."""
    final = Path(final)
    tmp = final.with_name(f".{final.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = final.with_name(f".{final.name}.old{os.getpid()}")
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def save_training_state(ckpt_dir: Path, engine, extra: dict) -> None:
    """Engine state, RNG states and ``extra`` (step, sampler position) into ``ckpt_dir`` atomically."""
    with atomic_dir(ckpt_dir) as tmp:
        engine.save_state(tmp)
        torch.save(rng_state(), tmp / "rng.pt")
        (tmp / "trainer.json").write_text(json.dumps(extra))


def load_training_state(ckpt_dir: Path, engine) -> dict:
    engine.load_state(ckpt_dir)
    set_rng_state(torch.load(Path(ckpt_dir) / "rng.pt", weights_only=False))
    return json.loads((Path(ckpt_dir) / "trainer.json").read_text())
