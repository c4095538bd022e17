"""Entry-point process settings (core/runtime.py): glibc keeps freed memory (no page faults per step)
and ``cpu_threads`` sets torch's thread count."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from core.paths import PROJECT_ROOT
from core.runtime import set_cpu_threads

# A training step's allocation pattern in miniature: activations of mixed sizes kept until backward,
# then released oldest first; minor page faults per step once the heap has grown (10 warm-up steps).
_STEPS = """
import resource, sys, torch
if sys.argv[1] == "tuned":
    from core.runtime import keep_freed_memory
    assert keep_freed_memory()
def step(i):
    scale = 1 + (i * 7 % 5) / 4  # sizes change every step, as the batch's lengths do in RL
    keep = [torch.ones(int(mb * scale * 262144)) for mb in (1, 3, 2, 5, 1, 4, 2, 6)]
    while keep:
        keep.pop(0)
for i in range(10):
    step(i)
blocks = []  # three blocks of 10 steps; the median block (a block now and then faults off-pattern on a VM)
for b in range(3):
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for i in range(10 + 10 * b, 20 + 10 * b):
        step(i)
    blocks.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0) / 10)
print(sorted(blocks)[1])
"""


def _faults_per_step(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", _STEPS, mode], cwd=PROJECT_ROOT, capture_output=True, text=True,
                         timeout=120, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    return float(out.stdout.strip().splitlines()[-1])


def test_freed_memory_stays_mapped():
    """Measured here: ~1,376 faults per step with glibc's defaults, 0-100 with the thresholds raised."""
    default, tuned = _faults_per_step("default"), _faults_per_step("tuned")
    assert default > 200, f"glibc's defaults should page-fault this pattern every step: {default}/step"
    assert tuned < default / 4, (tuned, default)


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
