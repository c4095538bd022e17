"""Generation one step ahead on 2 CPU ranks under torchrun (gloo), as tests/test_data_parallel.py runs them: the
same global batch split over ranks trains like one process, through a kill after a checkpoint and a resume
(each rank's batch generated ahead is in its own checkpoint file)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from core.paths import PROJECT_ROOT
from tests.helpers import CLI_ENV, cli_command, results, run_cli
from tests.test_data_parallel import SAME, STAGE3

# ZeRO-3 with layer-by-layer generation: the generation started ahead is a collective every rank enters
AHEAD = [*SAME, *STAGE3.split(), "rollout.gather_for_generation=false", "rollout.generate_ahead=1",
         "train.total_steps=3", "train.checkpoint_every=1"]


def _steps(tmp) -> list[dict]:
    rows = [json.loads(line) for line in (tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "grad_norm" in r]


@pytest.mark.distributed
@pytest.mark.slow
def test_two_ranks_ahead_killed_and_resumed_train_like_one_process(tmp_path):
    one = run_cli(tmp_path / "one", *AHEAD)
    assert one.returncode == 0, one.stderr[-4000:]
    ckpt = tmp_path / "two" / "run" / "checkpoint-1"  # the first
    proc = subprocess.Popen(cli_command(tmp_path / "two", *AHEAD, nproc=2), cwd=PROJECT_ROOT, env=CLI_ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    while proc.poll() is None and not (ckpt / "local.rank1.pt").exists():  # the folder appears complete
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)  # torchrun and both ranks, right after the first checkpoint
    proc.wait()
    assert json.loads((ckpt / "trainer.json").read_text())["step"] < 3 and (ckpt / "local.pt").exists()
    two = run_cli(tmp_path / "two", *AHEAD, "resume=true", nproc=2)
    assert two.returncode == 0, two.stderr[-4000:]
    want, got = _steps(tmp_path / "one"), _steps(tmp_path / "two")
    assert [r["step"] for r in got] == [1, 2, 3] and [r["rollout/policy_lag"] for r in got] == [0, 1, 1]
    assert 0 < want[0]["reward/mean"] < 1 and want[0]["grad_norm"] > 0  # rewards differ: a real gradient
    for g, w in zip(got, want):
        assert g["grad_norm"] == pytest.approx(w["grad_norm"], rel=1e-4)
        assert g["reward/mean"] == w["reward/mean"] and g["rollout/policy_lag"] == w["rollout/policy_lag"]
    assert len(results(tmp_path / "two")) == 1
