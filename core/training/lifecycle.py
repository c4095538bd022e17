"""A run's hold on its run dir and on its process, from before its first write to its end: both loops' ``main`` run
inside :func:`run_lifecycle` (docs/reliability.md "Two jobs on one run dir", "A port of its own").

One job per run dir. Two jobs on one run dir (a Slurm requeue while the old job still runs, the same command started
twice) would both train and both append to ``metrics.jsonl``, TensorBoard and the checkpoints. So rank 0 takes an
exclusive lock on ``<run dir>/.lock`` before anything in the run dir is written, holds it for the run's life and lets
it go on any exit: ``flock(2)`` on an open file, which the kernel drops when the process dies however it dies, so a
killed job never leaves a stale lock. A second job is refused at once, naming the holder; a requeued job
(``SLURM_RESTART_COUNT`` or ``TORCHELASTIC_RESTART_COUNT`` above 0) waits up to :data:`REQUEUE_WAIT_S` for the old
one to let go, then is refused. The lock file also holds a lease (host, pid, start, a heartbeat every
:data:`HEARTBEAT_S`): on a shared file system whose locks do not reach across hosts (Lustre mounted ``localflock``,
NFS without its lock daemon, or where ``flock`` fails outright) a lease of another host whose heartbeat is fresh keeps
the run dir taken; one older than :data:`STALE_S` belonged to a job that is gone.

A process group of its own. A group this run started (torchrun's through ``distributed.init``, or DeepSpeed's world
of one: ``distributed.start_alone``, on an in-memory store, no port) is ended with the run, and the launch variables
set for it (``LOCAL_RANK`` for DeepSpeed, vLLM's in one process) are put back as they were, so a next run in the same
process (tests, a notebook, ``recipes.eval`` after ``recipes.run``) starts its own, and child processes inherit
nothing of it.
"""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import torch.distributed as dist

from core.errors import InputError
from core.training import distributed

log = logging.getLogger(__name__)

LOCK = ".lock"  # in the run dir, while a job runs there
HEARTBEAT_S = 30.0  # how often the holder renews its lease
STALE_S = 5 * HEARTBEAT_S  # a lease not renewed for this long: its job is gone
# A requeued job's wait for the old one: launch/slurm.sbatch gives a stopping job STOP_GRACE (600 s by default) to
# finish its step and checkpoint before torchrun kills it.
REQUEUE_WAIT_S = 600.0
POLL_S = 2.0
# what a launcher, DeepSpeed or vLLM read from the environment; a run puts them back as they were at its start
LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DS_ACCELERATOR")
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)  # flock(2) on a file system without locks


class RunDirBusy(InputError):
    """Another job holds the run dir."""


@contextmanager
def run_lifecycle(run_dir):
    """The run's hold on ``run_dir`` (rank 0: :class:`RunDirLock`) and on its process (:func:`own_process`), given
    back on any exit. Yields the run dir as a ``Path``."""
    run_dir = Path(run_dir)
    with own_process():
        lock = RunDirLock(run_dir).acquire(REQUEUE_WAIT_S if requeued() else 0.0) if _launch_rank() == 0 else None
        try:
            yield run_dir
        finally:
            if lock is not None:
                lock.release()


@contextmanager
def own_process():
    """Whatever process group starts inside is ended on leaving (one that was up before stays), and the launch
    variables (:data:`LAUNCH_VARS`) are put back as they were: a loop's ``setup`` leaves ``LOCAL_RANK`` for DeepSpeed,
    which a child process's accelerate would read as a distributed launch."""
    env = {k: os.environ.get(k) for k in LAUNCH_VARS}
    had_group = dist.is_available() and dist.is_initialized()
    try:
        yield
    finally:
        try:
            if not had_group:
                distributed.shutdown()
        finally:
            for k, v in env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def requeued() -> bool:
    """This job is a requeued or restarted one: Slurm's ``SLURM_RESTART_COUNT`` or torchrun's
    ``TORCHELASTIC_RESTART_COUNT`` above 0."""
    return any(int(os.environ.get(k) or 0) > 0 for k in ("SLURM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"))


def _launch_rank() -> int:
    """This process's rank as its launcher set it (before any process group exists); 0 outside a launcher."""
    return int(os.environ.get("RANK") or 0)


class RunDirLock:
    """The exclusive hold of one job on ``run_dir`` (module docstring): :meth:`acquire`, then :meth:`release`."""

    def __init__(self, run_dir: Path):
        self.run_dir, self.path = Path(run_dir), Path(run_dir) / LOCK
        self.fd: int | None = None
        self.made_dir = False
        self.locked = True  # flock(2) holds on this file system (else the lease alone)
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self.lease = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}

    def acquire(self, wait_s: float = 0.0) -> RunDirLock:
        """Hold the run dir, waiting up to ``wait_s`` for another holder to let go; :class:`RunDirBusy` naming the
        holder when it does not."""
        self.made_dir = not self.run_dir.exists()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        deadline, start = time.monotonic() + wait_s, time.monotonic()
        while (holder := self._try()) is not None:
            if time.monotonic() >= deadline:
                self._drop_dir()
                raise RunDirBusy(_busy(self.run_dir, self.path, holder, time.monotonic() - start if wait_s else None))
            time.sleep(POLL_S)
        self._write()
        self._beat = threading.Thread(target=self._heartbeat, name="run-dir-lease", daemon=True)
        self._beat.start()
        return self

    def _try(self) -> dict | None:
        """None once this process holds the lock file; else what the lock file says of its holder."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read(fd) or {}
                os.close(fd)
                return holder
            except OSError as e:
                if e.errno not in _NO_LOCKS:
                    os.close(fd)
                    raise
                if self.locked:
                    log.warning("%s: this file system refuses locks (%s); the lease alone keeps a second job out",
                                self.path, e.strerror)
                self.locked = False
            if not _same_file(fd, self.path):  # its holder let go and removed it after we opened it: again
                os.close(fd)
                continue
            lease = _read(fd)
            if lease and _held(lease, self.locked):
                os.close(fd)
                return lease
            self.fd = fd
            return None

    def _write(self) -> None:
        data = json.dumps({**self.lease, "heartbeat": time.time()}).encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self._write()
            except OSError as e:  # a full disk: the flock still holds; the lease ages
                log.debug("run dir lease not renewed: %s", e)

    def release(self) -> None:
        """Let the run dir go: the lease stops, the lock file is removed (while still held, so a waiting job finds
        it gone and takes a new one) and closed; a run dir this lock made and nothing else wrote goes too."""
        if self.fd is None:
            return
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        if _same_file(self.fd, self.path):
            self.path.unlink(missing_ok=True)
        os.close(self.fd)
        self.fd = None
        self._drop_dir()

    def _drop_dir(self) -> None:
        if self.made_dir and self.run_dir.is_dir() and not any(self.run_dir.iterdir()):
            self.run_dir.rmdir()


def _read(fd: int) -> dict | None:
    try:
        body = json.loads(os.pread(fd, 4096, 0) or b"null")
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _held(lease: dict, locked: bool) -> bool:
    """Whether a lease found in a lock file this process could lock keeps the run dir taken: one of another host
    renewed within :data:`STALE_S` (its job may run there, on a file system whose locks this host cannot see); on this
    host the lock itself answers, or where there are no locks, whether its process is alive and renewing."""
    fresh = time.time() - float(lease.get("heartbeat", 0)) < STALE_S
    if lease.get("host") != socket.gethostname():
        return fresh
    return not locked and fresh and _alive(int(lease.get("pid", 0)))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return pid > 0


def _busy(run_dir: Path, path: Path, holder: dict, waited: float | None) -> str:
    if holder.get("pid") is not None:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder.get("started", 0))))
        who = (f"pid {holder['pid']} on {holder.get('host')}, started {started}, lease renewed "
               f"{time.time() - float(holder.get('heartbeat', 0)):.0f} s ago")
    else:
        who = "a process that has not yet written who it is"
    return (f"{run_dir} is in use by another job ({who}; its lock {path}): one job per run dir, or both would train "
            f"and write the same records"
            + (f"; waited {waited:.0f} s for it to end (a requeued job)" if waited is not None else "")
            + ". Wait for it to end (or stop it), then rerun; or give a fresh hydra.run.dir")
