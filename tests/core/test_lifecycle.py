"""A run's hold on its run dir and its process (core/training/lifecycle.py; docs/reliability.md "Two jobs on one run
dir", "A port of its own"): a second job on a run dir is refused naming the holder, with two real processes; a lock
dies with its process; a requeued job waits for the old one, for a bounded time; a fresh lease of another host keeps
the dir taken where locks do not reach across hosts; and DeepSpeed's world of one takes no port, writes nothing into
the environment and ends with its run, so runs in one process and the children they start never collide."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from core.paths import PROJECT_ROOT
from core.training import lifecycle
from core.training.lifecycle import LOCK, RunDirBusy, RunDirLock, run_lifecycle
from recipes import rl, rm
from tests.helpers import CLI_ENV

HOLD = ("import sys, time; from core.training.lifecycle import RunDirLock; RunDirLock(sys.argv[1]).acquire(); "
        "print('held', flush=True); time.sleep(float(sys.argv[2]))")


@pytest.fixture(autouse=True)
def rm_run_dir(monkeypatch, tmp_path):
    """The run dir a Hydra job of the reward-model loop would have."""
    monkeypatch.setattr(rm, "hydra_run_dir", lambda: tmp_path / "run")


@pytest.fixture
def holder(tmp_path):
    """``holder(run_dir, seconds)``: another process holding ``run_dir`` for ``seconds``, started and holding."""
    procs = []

    def start(run_dir, seconds: float = 300.0) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir), str(seconds)], cwd=PROJECT_ROOT,
                                env={**CLI_ENV, "PYTHONPATH": str(PROJECT_ROOT)}, stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "held"
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def test_a_second_job_is_refused_naming_the_holder_and_the_lock_dies_with_it(tmp_path, holder, compose_cfg):
    """Both loops refuse a run dir another process holds, before writing anything there; once that process is killed
    (SIGKILL: no clean-up ran) the dir is free and the lease names the new holder."""
    run_dir = tmp_path / "run"
    other = holder(run_dir)
    for main in (lambda: rl.main(compose_cfg("resume=auto"), run_dir=str(run_dir)),
                 lambda: rm.main(compose_cfg("recipe=tiny_rm", "resume=auto"))):
        with pytest.raises(RunDirBusy) as busy:
            main()
        msg = str(busy.value)
        assert f"{run_dir} is in use by another job (pid {other.pid} on {socket.gethostname()}, started " in msg
        assert f"its lock {run_dir / LOCK}): one job per run dir" in msg and "give a fresh hydra.run.dir" in msg
        assert os.listdir(run_dir) == [LOCK]  # nothing written
    other.send_signal(signal.SIGKILL)
    other.wait()
    lock = RunDirLock(run_dir).acquire()
    assert json.loads((run_dir / LOCK).read_text())["pid"] == os.getpid()
    lock.release()
    assert os.listdir(run_dir) == []  # the lock file goes with its holder


def test_a_requeued_job_waits_for_the_old_one_then_refuses(tmp_path, holder, monkeypatch):
    """A requeued job (SLURM_RESTART_COUNT > 0) waits for the old job's lock: it gets the dir once the old job ends
    (here 2 s later), and is refused, saying how long it waited, when the old job holds on past the wait."""
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    monkeypatch.setattr(lifecycle, "POLL_S", 0.1)
    run_dir = tmp_path / "run"
    holder(run_dir, 2.0)
    start = time.monotonic()
    with run_lifecycle(run_dir):
        assert json.loads((run_dir / LOCK).read_text())["pid"] == os.getpid()
    assert time.monotonic() - start > 1.0
    monkeypatch.setattr(lifecycle, "REQUEUE_WAIT_S", 1.0)
    holder(run_dir)
    with pytest.raises(RunDirBusy, match=r"waited 1 s for it to end \(a requeued job\)"):
        with run_lifecycle(run_dir):
            pass
    monkeypatch.delenv("SLURM_RESTART_COUNT")
    start = time.monotonic()
    with pytest.raises(RunDirBusy):  # not a requeue: refused at once
        with run_lifecycle(run_dir):
            pass
    assert time.monotonic() - start < 1.0


@pytest.mark.parametrize("age, held", [(10.0, True), (lifecycle.STALE_S + 10.0, False)])
def test_a_fresh_lease_of_another_host_keeps_the_dir_taken(tmp_path, age, held):
    """On a file system whose locks do not reach across hosts, this host gets the lock while a job on another host
    runs: its lease, renewed within STALE_S, keeps the dir taken; a stale one belonged to a job that is gone."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lease = {"host": "node-elsewhere", "pid": 4242, "started": time.time() - 3600, "heartbeat": time.time() - age}
    (run_dir / LOCK).write_text(json.dumps(lease))
    if held:
        with pytest.raises(RunDirBusy, match=r"pid 4242 on node-elsewhere, .* lease renewed 10 s ago"):
            RunDirLock(run_dir).acquire()
        assert json.loads((run_dir / LOCK).read_text()) == lease
    else:
        lock = RunDirLock(run_dir).acquire()
        assert json.loads((run_dir / LOCK).read_text())["host"] == socket.gethostname()
        lock.release()


CHILD = ("from core.training.engine import deepspeed_distributed; import torch.distributed as d; "
         "deepspeed_distributed(); print(d.get_world_size(), flush=True)")


def test_runs_in_one_process_and_their_children_take_no_port(tmp_path, monkeypatch):
    """Two DeepSpeed runs back to back in this process, each a world of one, and a child process started after them
    (inheriting this environment) that starts its own: each trains, none takes a TCP port or leaves a variable
    behind. Before, the first run wrote MASTER_PORT=29500 + pid % 1000 into the environment and kept its store
    listening there: the child failed with EADDRINUSE."""
    import torch
    import torch.distributed as dist

    from core.config import schema
    from core.training.engine import DeepSpeedEngine

    for key in lifecycle.LAUNCH_VARS:
        monkeypatch.delenv(key, raising=False)
    optim = schema.node(schema.OptimConfig, {"optimizer": {"_target_": "torch.optim.AdamW", "_partial_": True}})
    zero = schema.node(schema.ZeroConfig, stage=2)
    for n in range(2):
        with run_lifecycle(tmp_path / f"run{n}"):
            torch.manual_seed(n)
            engine = DeepSpeedEngine(torch.nn.Linear(4, 2), optim, 2, 1, zero, 1, partitioned=False)
            assert dist.get_world_size() == 1 and "MASTER_PORT" not in os.environ
            loss = engine.forward(lambda m, x: m(x).pow(2).mean(), torch.ones(1, 4))
            engine.backward(loss)
            assert engine.step()["grad_norm"] > 0
        assert not dist.is_initialized() and not set(lifecycle.LAUNCH_VARS) & set(os.environ)
    child = subprocess.run([sys.executable, "-c", CHILD], cwd=PROJECT_ROOT, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}, timeout=300)
    assert child.returncode == 0 and child.stdout.splitlines()[-1] == "1", child.stderr[-2000:]
