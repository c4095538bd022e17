"""Stopping on a cluster's warning signal: finish the step, checkpoint, exit so the job is requeued.

Slurm warns a job before its time limit with the signal ``--signal`` asks for (launch/slurm.sbatch: SIGUSR1;
submitit: SIGUSR2, ``SUBMITIT_PREEMPT_SIGNAL``) and preempts or cancels it with SIGTERM, then SIGKILL after the
cluster's grace time (docs/reliability.md). The loops call :func:`install` on every rank before their first step;
the handler only records the signal, and once per step :meth:`StopRequest.agreed` all-reduces it (the largest
signal number of any rank, 0 for none), so every rank sees the same answer after the same step and no rank leaves
a collective that the others enter. The loop then writes its checkpoint (collective) and calls
:meth:`StopRequest.exit`: rank 0 records why in ``<run dir>/requeue.json`` and every rank exits with
:data:`REQUEUE_EXIT`. ``resume=auto`` in the same run dir continues from that checkpoint, each step once.

Under submitit (``hydra/launcher=slurm``) the submitit signal is submitit's own checkpoint-and-requeue
(submitit/core/job_environment.py ``SignalHandler.checkpoint_and_try_requeue``: the Hydra launcher's
``checkpoint`` resubmits the same job, then ``scontrol requeue``); it is deferred, not replaced: rank 0 hands the
signal to submitit's handler after the step's checkpoint, instead of submitit requeuing in the middle of a step.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
from pathlib import Path

import torch

from core.training import distributed

log = logging.getLogger(__name__)

# EX_TEMPFAIL (sysexits.h, "temporary failure; the user is invited to retry"): a run that stopped on a signal after
# writing its checkpoint. Under torchrun the agent's own status is 1 (it re-raises the signal it forwarded), so the
# job script reads requeue.json, not the status (launch/slurm.sbatch).
REQUEUE_EXIT = 75
MARKER = "requeue.json"  # in the run dir: the signal and the step a stopped run checkpointed; removed by the next start
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


def submitit_signal() -> signal.Signals | None:
    """The signal submitit's job environment handles for timeouts and preemption, inside a submitit task."""
    if "SUBMITIT_EXECUTOR" not in os.environ:
        return None
    return signal.Signals[f"SIG{os.environ.get('SUBMITIT_PREEMPT_SIGNAL', 'USR2')}"]  # submitit's USR_SIG


class StopRequest:
    """The signal this rank received (``signum``, first one kept) and the handlers it replaced."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.signum = 0
        self.previous: dict[int, object] = {}

    def _record(self, signum: int, frame) -> None:  # a signal handler: it only records (the step finishes first)
        self.signum = self.signum or signum

    def agreed(self) -> int:
        """The stop signal any rank received (the largest number), 0 for none: the same on every rank. Collective:
        every rank calls it once per step, at the same point."""
        flag = torch.tensor([self.signum], dtype=torch.int64)  # [1], on the CPU: gloo under cpu:gloo,cuda:nccl
        return int(distributed.all_max(flag)[0])

    def exit(self, signum: int, step: int) -> None:
        """After the checkpoint of ``step``: record why (rank 0), hand a submitit signal to submitit's own handler
        (rank 0: it requeues and exits), then exit with :data:`REQUEUE_EXIT`."""
        name = signal.Signals(signum).name
        if distributed.is_main():
            tmp = self.run_dir / f".{MARKER}.tmp"
            tmp.write_text(json.dumps({"signal": name, "step": step, "exit_code": REQUEUE_EXIT}))
            os.replace(tmp, self.run_dir / MARKER)
            log.warning("stopped after step %d on %s: checkpoint written to %s/checkpoint-%d; exit %d so the job is "
                        "requeued; continue with hydra.run.dir=%s resume=auto", step, name, self.run_dir,
                        step, REQUEUE_EXIT, self.run_dir)
        distributed.barrier()  # the marker is written before any rank exits (srun --kill-on-bad-exit ends the rest)
        previous = self.previous.get(signum)
        if signum == submitit_signal() and callable(previous):
            signal.signal(signum, previous)
            previous(signum, None)  # rank 0: submitit resubmits the same job and requeues it; others: it returns
        sys.exit(REQUEUE_EXIT)


def install(run_dir: Path) -> StopRequest:
    """Record SIGUSR1, SIGTERM (and submitit's signal in a submitit task) on this rank from now on; rank 0 removes a
    previous attempt's ``requeue.json``. Call from the main thread (Python runs signal handlers there)."""
    stop = StopRequest(run_dir)
    extra = submitit_signal()
    for sig in (*STOP_SIGNALS, *([extra] if extra is not None else [])):
        stop.previous[sig] = signal.signal(sig, stop._record)
    if distributed.is_main():
        (stop.run_dir / MARKER).unlink(missing_ok=True)
    return stop
