"""A dead or hung rank (docs/reliability.md "A dead rank"): under ``torchrun --max-restarts 1`` with ``resume=auto``,
rank 1 killed with SIGKILL inside step 3, or stopped (SIGSTOP: alive, never entering the next collective), brings the
group down promptly (torchrun sees the dead worker; the hung one's peer fails its collective after
``collective_timeout_s``), and the restarted group resumes from the newest checkpoint: each step recorded once, one
results row."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from core.paths import PROJECT_ROOT
from tests.helpers import CLI_ENV, FAST, cli_command, results

RUN = [*FAST, "train.total_steps=5", "train.checkpoint_every=1", "train.warm_start.steps=0", "kl.coef=0",
       "resume=auto", "verifier.name=tests.stub_rewards:math_signalled_after"]


def _steps(run_dir: Path) -> list[int]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if "reward/mean" in r]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("signame, timeout", [("SIGKILL", 1800), ("SIGSTOP", 20)])
def test_a_lost_rank_restarts_the_group_from_the_newest_checkpoint(tmp_path, signame, timeout):
    cmd = cli_command(tmp_path, *RUN, f"collective_timeout_s={timeout}", nproc=2)
    at = cmd.index("torch.distributed.run") + 1
    cmd[at:at] = ["--max-restarts=1", "--monitor-interval=1"]
    env = {**CLI_ENV, "RLR_TEST_SIGNAL": f"{tmp_path}/run/metrics.jsonl:2:{signame}:1"}  # rank 1, inside step 3
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    run_dir = tmp_path / "run"
    lost = (run_dir / "metrics.jsonl.signalled1").stat().st_mtime  # touched as rank 1 signalled itself
    assert f"resuming {run_dir} from step 2 of 5" in out  # the newest checkpoint when rank 1 went
    assert _steps(run_dir) == [1, 2, 3, 4, 5]  # each step once
    assert [r["steps"] for r in results(tmp_path)] == [5]
    restarted = (run_dir / "config.yaml").stat().st_mtime  # rewritten by the restarted rank 0 as it resumed
    # torchrun sees a dead worker within its monitor interval; a hung one's peer fails its collective after
    # collective_timeout_s, then torchrun's shutdown timeout (30 s) ends the stopped worker; plus a restart's setup
    assert restarted - lost < (90 if signame == "SIGKILL" else timeout + 30 + 90), (restarted - lost, out[-3000:])
    assert time.time() > restarted
