"""The TRL side-by-side benchmark runs end to end (3 steps, 1 repetition), in lockstep and sequentially, and
reports both sides."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from core.paths import PROJECT_ROOT


@pytest.mark.slow
@pytest.mark.parametrize("lockstep", ["1", "0"])
def test_trl_bench_runs_both_sides(lockstep):
    env = {**os.environ, "BENCH_STEPS": "3", "BENCH_REPS": "1", "OMP_NUM_THREADS": "1", "BENCH_LOCKSTEP": lockstep}
    out = subprocess.run([sys.executable, "-m", "bench", "trl"], cwd=PROJECT_ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ratio ours/TRL" in out.stdout and out.stdout.count("peak RSS") == 3
    pair = re.search(r"per repetition: ratio ([\d.]+)-([\d.]+), median ([\d.]+)", out.stdout)
    ratio = re.search(r"ratio ours/TRL ([\d.]+)", out.stdout)
    # one repetition: its pair is the whole run
    assert pair and ratio and float(pair[1]) == float(pair[2]) == float(pair[3]) == float(ratio[1]), out.stdout[-2000:]
    steps = re.search(r"per pair of steps \((\d+)\): ratio median ([\d.]+)", out.stdout)
    assert (steps is not None) == (lockstep == "1"), out.stdout[-2000:]
    if steps:
        assert int(steps[1]) == 2 and 0 < float(steps[2])  # steps 2 and 3 of each side, paired
    # the counted matmul work: both sides do some, ours less (shared prompt, response-only logits)
    m = re.search(r"matmul work per step: ours ([\d.]+) GFLOP, TRL ([\d.]+) GFLOP.*rate\): ([\d.]+)", out.stdout)
    assert m, out.stdout[-2000:]
    ours, trl, floor = map(float, m.groups())
    assert 0 < ours < trl and 0 < floor < 1
