"""``make gpu-smoke`` (bench/gpu_smoke.py): on a CUDA machine it runs with a real-shaped model (the ``gpu``
test); here its code runs on the CPU with a tiny model, so the script a GPU session relies on works."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from core.paths import PROJECT_ROOT


def _smoke(**env) -> str:
    out = subprocess.run([sys.executable, "-m", "bench.gpu_smoke"], cwd=PROJECT_ROOT, capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=1800)
    assert out.returncode == 0, out.stderr[-4000:]
    return out.stdout


def _check(stdout: str) -> None:
    check = re.search(r"packed vs padded \((\S+), (\d+) tokens\): log-prob \|diff\| max ([\d.]+)", stdout)
    assert check and int(check[2]) > 20, stdout[-2000:]
    runs = re.findall(r"zero=(\w+): generation (\d+) tok/s, update (\d+) tok/s, update MFU (\S+)", stdout)
    assert [r[0] for r in runs] == ["none", "stage2", "stage3"], stdout[-2000:]
    assert all(int(r[1]) > 0 and int(r[2]) > 0 for r in runs)


@pytest.mark.slow
def test_the_smoke_script_runs_on_the_cpu_with_a_tiny_model():
    _check(_smoke(GPU_SMOKE_DEVICE="cpu", GPU_SMOKE_SHAPES="tiny", GPU_SMOKE_STEPS="2", GPU_SMOKE_MAX_NEW="16"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_smoke():
    out = _smoke()
    _check(out)
    assert "packed vs padded (torch.bfloat16" in out
    assert all(float(m) > 0 for m in re.findall(r"update MFU ([\d.]+)", out))
