"""Entry-point process settings (core/runtime.py): glibc keeps freed memory (no page faults per step)
and ``cpu_threads`` sets torch's thread count."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from core.paths import PROJECT_ROOT
from core.runtime import set_cpu_threads

# A step's activations in miniature: 64 MB in 2 MB tensors, freed newest first (as backward releases
# them), then the same again; minor page faults of the second round.
_STEPS = """
import resource, sys, torch
if sys.argv[1] == "tuned":
    from core.runtime import keep_freed_memory
    assert keep_freed_memory()
def work():
    keep = [torch.ones(524288) for _ in range(32)]
    while keep:
        keep.pop()
work()
r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
work()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0)
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _STEPS, mode], cwd=PROJECT_ROOT, capture_output=True, text=True,
                         timeout=120, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.strip().splitlines()[-1])


def test_freed_memory_stays_mapped():
    """glibc's defaults hand the freed 64 MB back and fault all of it in again (16,381 faults here, every
    run); with the thresholds raised it stays mapped (3,600-4,600 here: the VM still reclaims some)."""
    default, tuned = _faults("default"), _faults("tuned")
    assert default > 8000, f"glibc's defaults should re-fault most of the 64 MB: {default}"
    assert tuned < default / 2, (tuned, default)


def test_cpu_threads():
    before = torch.get_num_threads()
    try:
        set_cpu_threads(1)
        assert torch.get_num_threads() == 1
        set_cpu_threads(0)  # 0 leaves the count as it is
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="cpu_threads=-1"):
        set_cpu_threads(-1)


def test_demo_recipe_pins_one_thread(compose_cfg):
    assert int(compose_cfg().cpu_threads) == 1
    assert int(compose_cfg("recipe=tiny_rm").cpu_threads) == 0


def test_seed_everything_keeps_deterministic_kernels_without_the_nan_fill():
    """Deterministic kernels on, but new tensors are not NaN-filled first (torch's default in
    deterministic mode: one more memory pass per uninitialised allocation, 1.5-2.5% of a tiny GRPO step,
    docs/performance.md); the seeded stream still repeats."""
    from core.checkpoint import seed_everything

    fill = torch.utils.deterministic.fill_uninitialized_memory
    mode = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        torch.use_deterministic_algorithms(True)
        torch.utils.deterministic.fill_uninitialized_memory = True
        assert torch.empty(64).isnan().all()  # what the fill does: every new tensor NaN
        draws = []
        for _ in range(2):
            seed_everything(3)
            draws.append(torch.rand(5))
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.utils.deterministic.fill_uninitialized_memory
        assert torch.equal(draws[0], draws[1])
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = fill
        torch.use_deterministic_algorithms(mode[0], warn_only=mode[1])
