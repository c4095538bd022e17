"""Preemption and time limits (core/training/preemption.py, docs/reliability.md): a running job that gets SIGUSR1 or
SIGTERM finishes its step, checkpoints, records why in ``requeue.json`` and exits with the requeue code; every rank
stops after the same step; ``resume=auto`` finishes the run with each step recorded once and one results row."""
from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from core.paths import PROJECT_ROOT
from core.training import preemption
from tests.helpers import CLI_ENV, FAST, cli_command, results, run_cli

# 6 steps, no periodic checkpoint (the signal's checkpoint is the only one), no warm start; the verifier sends the
# signal once step 2 is recorded (tests/stub_rewards.py), so it lands inside step 3.
RUN = [*FAST, "train.total_steps=6", "train.checkpoint_every=0", "train.warm_start.steps=0", "kl.coef=0",
       "verifier.name=tests.stub_rewards:math_signalled_after"]
# What launch/slurm.sbatch gives torchrun: SIGUSR1 forwarded to the workers (torch's default list leaves it out, and
# its default action would end the agent), and time for them to finish the step and checkpoint before SIGKILL.
FORWARD = ["--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1", "--shutdown-timeout=240"]


def _run(tmp: Path, signal_spec: str, nproc: int) -> subprocess.CompletedProcess:
    cmd = cli_command(tmp, *RUN, nproc=nproc)
    if nproc > 1:
        at = cmd.index("torch.distributed.run") + 1
        cmd[at:at] = FORWARD
    env = {**CLI_ENV, "RLR_TEST_SIGNAL": f"{tmp}/run/metrics.jsonl:2:{signal_spec}"}
    return subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=600)


def _steps(run_dir: Path) -> list[int]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if "reward/mean" in r]


def _stopped_then_resumed(tmp: Path, proc: subprocess.CompletedProcess, signame: str, nproc: int) -> None:
    run_dir = tmp / "run"
    assert json.loads((run_dir / preemption.MARKER).read_text()) == {
        "signal": signame, "step": 3, "exit_code": preemption.REQUEUE_EXIT}, proc.stderr[-3000:]
    assert json.loads((run_dir / "checkpoint-3" / "trainer.json").read_text())["step"] == 3
    assert _steps(run_dir) == [1, 2, 3] and results(tmp) == [] and not (run_dir / "summary.json").exists()
    assert f"stopped after step 3 on {signame}" in proc.stdout + proc.stderr
    resumed = run_cli(tmp, "resume=auto", nproc=nproc, timeout=600)
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out[-3000:]
    assert f"resuming {run_dir} from step 3 of 6" in out
    assert _steps(run_dir) == [1, 2, 3, 4, 5, 6]  # each step once
    assert [r["steps"] for r in results(tmp)] == [6] and not (run_dir / preemption.MARKER).exists()


@pytest.mark.slow
def test_one_process_stops_on_sigterm_with_the_requeue_code_and_resumes(tmp_path):
    proc = _run(tmp_path, "SIGTERM:0", nproc=1)
    assert proc.returncode == preemption.REQUEUE_EXIT, proc.stderr[-3000:]
    _stopped_then_resumed(tmp_path, proc, "SIGTERM", nproc=1)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("spec, signame", [("SIGUSR1:agent", "SIGUSR1"), ("SIGTERM:1", "SIGTERM")])
def test_two_ranks_stop_after_the_same_step_and_resume(tmp_path, spec, signame):
    """SIGUSR1 to the torchrun agent (forwarded to both ranks, as Slurm's warning reaches a job step), or SIGTERM to
    rank 1 alone (rank 0 learns it in the step's all-reduce): both ranks checkpoint step 3 and exit; torchrun's own
    status is 1 (it re-raises the signal it forwarded; a rank's own exit is the requeue code)."""
    proc = _run(tmp_path, spec, nproc=2)
    assert proc.returncode != 0, proc.stderr[-3000:]
    assert f"exitcode  : {preemption.REQUEUE_EXIT}" in proc.stderr or spec.endswith("agent"), proc.stderr[-3000:]
    _stopped_then_resumed(tmp_path, proc, signame, nproc=2)


def test_every_rank_agrees_on_one_ranks_signal(tmp_path):
    """The all-reduce in a world of one is the rank's own flag; a handler records the first signal only; install
    removes a previous attempt's marker; exit records the marker and leaves with the requeue code."""
    (tmp_path / preemption.MARKER).write_text("{}")
    before = signal.getsignal(signal.SIGUSR1)
    stop = preemption.install(tmp_path)
    try:
        assert not (tmp_path / preemption.MARKER).exists() and stop.agreed() == 0
        signal.raise_signal(signal.SIGUSR1)
        signal.raise_signal(signal.SIGTERM)  # recorded, not fatal; the first one is kept
        assert stop.agreed() == signal.SIGUSR1
        with pytest.raises(SystemExit) as out:
            stop.exit(stop.agreed(), 7)
        assert out.value.code == preemption.REQUEUE_EXIT
        assert json.loads((tmp_path / preemption.MARKER).read_text())["step"] == 7
    finally:
        for sig, handler in stop.previous.items():
            signal.signal(sig, handler)
    assert signal.getsignal(signal.SIGUSR1) == before


def test_submitits_signal_is_deferred_to_the_step_end_then_handed_to_submitits_handler(tmp_path, monkeypatch):
    """In a submitit task, submitit's USR2 handler (its checkpoint-and-requeue) does not run when the signal lands:
    the loop records it, and after the step's checkpoint the handler runs once, then the rank exits."""
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    calls = []
    before = signal.signal(signal.SIGUSR2, lambda signum, frame: calls.append(signum))  # stands for submitit's
    stop = preemption.install(tmp_path)
    try:
        signal.raise_signal(signal.SIGUSR2)
        assert calls == [] and stop.agreed() == signal.SIGUSR2  # recorded only: the step goes on
        with pytest.raises(SystemExit) as out:
            stop.exit(stop.agreed(), 4)
        assert calls == [signal.SIGUSR2] and out.value.code == preemption.REQUEUE_EXIT
    finally:
        for sig, handler in stop.previous.items():
            signal.signal(sig, handler)
        signal.signal(signal.SIGUSR2, before)


def test_the_sbatch_script_requeues_a_stopped_run_and_the_requeued_job_resumes_it(tmp_path, monkeypatch):
    """launch/slurm.sbatch with test doubles (tests/test_launch.py): the ranks stopped on SIGUSR1 (the srun double
    leaves requeue.json and fails, as torchrun does) -> ``scontrol requeue <job>``; the requeued attempt
    (SLURM_RESTART_COUNT=1) plans and runs the same run dir with resume=auto, after removing the old marker."""
    from tests.test_launch import _sbatch, _stubs

    run_dir = tmp_path / "run"
    plan = {"NODES": 1, "GPUS_PER_NODE": 8, "LEARNER_NODES": 1, "NPROC_PER_NODE": 8, "LEARNER_DEVICES": "",
            "ROLLOUT_GPUS": 0, "TP": 1, "ENGINES": 0, "SERVERS": "", "SERVE_ARGS": "", "SERVER_TIMEOUT": 0,
            "MODEL": "", "RUN_DIR": str(run_dir)}
    bin_dir = _stubs(tmp_path, monkeypatch, **plan)
    python = (bin_dir / "python").read_text()
    (bin_dir / "python").write_text(python.replace("#!/bin/bash\n", '#!/bin/bash\necho "plan $*" >> "$STUB_LOG"\n', 1))
    (bin_dir / "srun").write_text('#!/bin/bash\nprintf "%s\\n" "$*" >> "$STUB_LOG"\n'
                                  '[[ -n "${STUB_STOP:-}" ]] && mkdir -p "$STUB_STOP" && echo "{}" > "$STUB_STOP/requeue.json"'
                                  ' && exit 1\nexit 0\n')
    (bin_dir / "scontrol").write_text('#!/bin/bash\n[[ "$1" == requeue ]] && echo "scontrol $*" >> "$STUB_LOG"\n'
                                      'printf "%s\\n" $STUB_HOSTS\n')
    job = {"SLURM_JOB_ID": "9130", "SLURM_JOB_NUM_NODES": "1", "STUB_HOSTS": "gpu-a"}
    first = _sbatch(tmp_path, str(bin_dir / "python"), "recipe=x", STUB_STOP=str(run_dir), **job)
    assert first.returncode == 1, first.stderr
    log = (tmp_path / "steps.log").read_text().splitlines()
    assert log[0] == "plan -m core.launch recipe=x" and "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 " \
        "--shutdown-timeout=600 -m recipes.run recipe=x" in log[1] and log[2] == "scontrol requeue 9130"
    (tmp_path / "steps.log").unlink()
    again = _sbatch(tmp_path, str(bin_dir / "python"), "recipe=x", SLURM_RESTART_COUNT="1", **job)
    assert again.returncode == 0, again.stderr
    log = (tmp_path / "steps.log").read_text().splitlines()
    assert log[0] == f"plan -m core.launch recipe=x hydra.run.dir={run_dir} resume=auto"
    assert log[1].endswith(f"-m recipes.run recipe=x hydra.run.dir={run_dir} resume=auto") and len(log) == 2
    assert not (run_dir / preemption.MARKER).exists()
