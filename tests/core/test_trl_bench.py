"""The TRL side-by-side benchmark runs end to end (3 steps, 1 repetition) on this machine's device, reports
both sides, and guards against a regression: on a CPU our step must not be slower than TRL's."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from core.paths import PROJECT_ROOT


@pytest.mark.slow
def test_trl_bench_runs_both_sides():
    env = {**os.environ, "BENCH_STEPS": "3", "BENCH_REPS": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "bench", "trl"], cwd=PROJECT_ROOT, env=env, capture_output=True,
                         text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("peak memory") == 3, out.stdout[-2000:]  # one line per side, then the summary
    ratio = re.search(r"ratio ours/TRL ([\d.]+)", out.stdout)
    pair = re.search(r"per repetition: ratio ([\d.]+)-([\d.]+), median ([\d.]+)", out.stdout)
    assert ratio and pair and float(pair[1]) == float(pair[2]) == float(pair[3]) == float(ratio[1]), out.stdout[-2000:]
    assert 0 < float(ratio[1]) < 1.0, out.stdout[-2000:]
