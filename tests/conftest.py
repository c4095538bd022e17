"""Shared fixtures. Tests that need ../shared/data skip with the reason when it is absent."""
from __future__ import annotations

import hashlib
import os
import sys
import time
import warnings
from pathlib import Path

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# No test reads a hub (no network here or in CI): a hub name fails at once instead of retrying. Set before
# huggingface_hub and datasets are imported: both read these once, at import.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# Torch JIT-builds DeepSpeed's CPU ops (the shm comm op, CPU Adam) into one folder per op name under
# ~/.cache/torch_extensions, shared by every interpreter of the machine. Two venvs building an op with their own
# include paths (the project's, `make test-constraints`'s /tmp venv, the fidelity envs) rebuild it in turn: seen
# here, 177 s of CPU Adam build in one test's setup and 38 s of shm op in the first test's. This venv's own folder
# (inherited by every test subprocess and torchrun rank) keeps its builds; an explicit TORCH_EXTENSIONS_DIR wins.
_VENV_KEY = hashlib.sha1(os.path.realpath(sys.prefix).encode()).hexdigest()[:12]
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions" / f"venv-{_VENV_KEY}"))

from core import paths  # noqa: E402

try:  # property tests draw the same examples every run: CI never flakes on a new random case
    from hypothesis import settings

    settings.register_profile("repeatable", derandomize=True, print_blob=True)
    settings.load_profile("repeatable")
except ImportError:  # hypothesis is a dev extra
    pass


@pytest.fixture(autouse=True)
def own_process():
    """Each test ends the process group it started and puts back the launch variables it set, as a run's ``main``
    does (core/training/lifecycle.py ``own_process``): tests call a loop's ``setup`` without its ``main``, and what
    DeepSpeed's world of one leaves (``LOCAL_RANK``) would reach every later test's child processes."""
    from core.training.lifecycle import own_process

    with own_process():
        yield


@pytest.fixture(scope="session")
def shared_data():
    """Path of the real data folder (../shared/data or $RLR_DATA_DIR); skips when it is missing."""
    d = paths.data_dir()
    if not d.is_dir():
        pytest.skip(f"real data not found at {d} (set RLR_DATA_DIR to the shared data folder)")
    return d


STALE_LOCK_S = 900  # the build takes under a minute on 2 cores; a lock this old was left by a killed process


@pytest.fixture(scope="session", autouse=True)
def deepspeed_cpu_comm_op_built_once():
    """Build DeepSpeed's CPU shared-memory comm op here, once, before any test starts a process.

    DeepSpeed's CPU backend JIT-compiles ``deepspeed_shm_comm`` (about 40 s) in the first process that calls
    ``init_distributed``, under torch's FileBaton lock file. A test subprocess killed by its timeout in the middle
    of that build leaves the lock behind, and every later DeepSpeed process waits on it forever (seen in CI: each
    later tiny run timed out). The pytest process is killed by no test, so it builds the op safely; a lock older
    than any build is removed with a warning first.
    """
    try:
        from deepspeed.comm.torch import build_shm_op
    except ImportError:  # deepspeed is a core dependency; without it the DeepSpeed tests fail on their own
        return
    _build_once("deepspeed_shm_comm", build_shm_op)


@pytest.fixture(scope="session")
def deepspeed_cpu_adam_built():
    """DeepSpeed's CPU Adam op (``zero.offload_optimizer``), built here once for the tests that request it, for
    the reason above: it compiles for about 1.5-2.5 min on 2 cores, longer than the shm op, in the first process
    that builds a ``DeepSpeedCPUAdam``."""
    from deepspeed.ops.op_builder import CPUAdamBuilder

    _build_once("cpu_adam", lambda: CPUAdamBuilder().load())


def _build_once(name: str, build) -> None:
    """Run ``build`` (a torch JIT extension named ``name``) after removing its lock if a killed build left it."""
    from torch.utils.cpp_extension import _get_build_directory

    lock = Path(_get_build_directory(name, verbose=False)) / "lock"
    if lock.exists() and time.time() - lock.stat().st_mtime > STALE_LOCK_S:
        warnings.warn(f"removing the stale torch extension lock {lock} (older than {STALE_LOCK_S} s)")
        lock.unlink(missing_ok=True)
    try:
        build()
    except Exception as e:  # noqa: BLE001 (a failed build fails the DeepSpeed tests themselves, not every test)
        warnings.warn(f"DeepSpeed's CPU op {name} did not build: {type(e).__name__}: {e}")


@pytest.fixture(autouse=True)
def hydra_config_cleared_after_each_test():
    """An in-process compose with Hydra's own config (``core.config.composition.compose(with_hydra=True)``: the
    probe, explain, launch) sets this process's ``HydraConfig``, as a run does; a later test would then read that
    test's command line as its own (``core.config.scale.command_line_keys`` keeps those keys from the scale)."""
    yield
    from hydra.core.hydra_config import HydraConfig

    HydraConfig.instance().cfg = None
