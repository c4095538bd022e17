"""Parallel scoring runner: a persistent pool of worker processes with per-sample wall-clock timeouts.

Why not ``concurrent.futures``: a hung task there blocks its worker forever and a crashed one breaks the whole
pool. Here a worker holds one sample at a time; when a sample overruns its deadline the worker is killed (SIGKILL)
and replaced, that sample gets ``on_timeout``; a worker that dies costs its current sample ``on_crash``. Results
come back in input order. Workers are fresh interpreters (see ``_Worker``) and get an address-space limit so a sympy
blow-up cannot eat the host.

Scheduling (one slow sample costs only itself): the input is cut into blocks of up to ``_CHUNK`` consecutive
samples; an idle worker claims the next block and is sent its samples one at a time, so a worker keeps the samples
that share a gold (``map_scores`` sorts them together) and its gold-parsing cache stays useful. A worker with no
block left takes the back half of the largest block held by a worker whose current sample has run ``STEAL_AFTER_S``,
so samples do not wait behind a slow one while a worker sits idle, and the unsent rest of a killed worker's block
goes back to the front of the queue for whichever worker is free first. A sample's clock starts when its worker has
loaded the scoring function (a fresh worker acknowledges the import first), so a replacement's start-up is not
charged to the sample it is given.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import pickle
import resource
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Sequence

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 10.0  # s per sample; SimpleRL-Zoo's hf_math_verify pool uses 10 s (reference simplerl_zoo.md §4)
DEFAULT_MEM_BYTES = 4 << 30  # per worker address space
_CHUNK = 16  # consecutive samples a worker claims at a time (its gold-parsing cache is reused within a block)
# A fresh worker imports the scoring function's module (sympy, math-verify: ~1-3 s on a loaded machine) before its
# first sample's clock starts; a worker that has not done so after this long is replaced and the sample scored
# ``on_crash``.
STARTUP_S = 60.0
# An idle worker takes samples from another worker's block only once that worker's current sample has run this long:
# below it a group stays on one worker, which parses its gold once; a stolen share makes the thief parse it again
# (bench group 1: gold "p - q" parses in ~86 ms, one answer verifies in ~170 ms; at 0.1 s its latency went from
# ~184 ms to ~240 ms on 2 cores). Samples stuck behind a slow one wait about this much per hand-over.
STEAL_AFTER_S = 0.5


def default_workers() -> int:
    """One worker per usable CPU core (sched_getaffinity respects cgroup/taskset pinning)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


class _Err:
    """An exception raised inside a worker, carried back as a value."""

    def __init__(self, text: str):
        self.text = text


class _Ready:
    """Sent by a worker once it has unpickled (imported) a scoring function it had not run before."""


def _worker_main(conn, mem_bytes: int) -> None:
    if mem_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
    loaded = None
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        fn, idx, args = msg
        if fn is not loaded:  # unpickling fn imported its module: the parent starts this sample's clock now
            loaded = fn
            conn.send((idx, _Ready()))
        try:
            res = fn(*args)
        except BaseException as e:  # noqa: BLE001 - MemoryError/RecursionError too: one sample, not the worker
            res = _Err(f"{type(e).__name__}: {str(e)[:200]}")
        conn.send((idx, res))


def _child(rfd: int, wfd: int, mem_bytes: int) -> None:
    """Entry point of a worker process (``python -c``): a duplex view over the two inherited pipe ends."""
    _worker_main(_Duplex(Connection(rfd, writable=False), Connection(wfd, readable=False)), mem_bytes)


class _Duplex:
    def __init__(self, r: Connection, w: Connection):
        self.r, self.w = r, w

    def recv(self):
        return self.r.recv()

    def send(self, obj) -> None:
        self.w.send(obj)


class _Worker:
    """A worker started with ``subprocess`` rather than ``multiprocessing``: spawn/forkserver re-import the
    caller's ``__main__`` (re-running an unguarded training script), and fork would copy a parent holding torch
    threads. Own session (process group) so terminal signals skip it and ``killpg`` takes its children too."""

    def __init__(self, mem_bytes: int):
        r1, w1 = os.pipe()  # parent -> child
        r2, w2 = os.pipe()  # child -> parent
        env = dict(os.environ, RLR_WORKER_SYSPATH=json.dumps([p for p in sys.path if p]))
        code = ("import json, os, sys; sys.path[:0] = json.loads(os.environ['RLR_WORKER_SYSPATH']); "
                f"from verifiers.pool import _child; _child({r1}, {w2}, {int(mem_bytes)})")
        self.proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(r1, w2), env=env,
                                     start_new_session=True, stdin=subprocess.DEVNULL)
        os.close(r1)
        os.close(w2)
        self.send_conn = Connection(w1, readable=False)
        self.conn = Connection(r2, writable=False)
        self.block: list[tuple[int, tuple]] = []  # claimed samples not sent yet
        self.current: tuple[int, tuple] | None = None  # the sample it is scoring
        self.fn: Callable | None = None  # the function of the current sample
        self.loaded: Callable | None = None  # the function it has acknowledged loading (see _Ready)
        self.sent_at = 0.0  # when its current sample was sent
        self.deadline = 0.0

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, obj) -> None:
        self.send_conn.send(obj)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL is not ignorable
            log.error("verifier worker %d did not exit after SIGKILL", self.proc.pid)
        self.send_conn.close()
        self.conn.close()


class WorkerPool:
    """Persistent process pool; ``map`` is thread-safe (one map at a time)."""

    def __init__(self, workers: int | None = None, mem_bytes: int = DEFAULT_MEM_BYTES):
        self.n = workers or default_workers()
        self.mem_bytes = mem_bytes
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self.stats = {"timeouts": 0, "crashes": 0, "errors": 0}

    def _ensure(self) -> None:
        self._workers = [w for w in self._workers if w.alive()] + [
            _Worker(self.mem_bytes) for _ in range(self.n - len(self._workers))
        ]

    def close(self) -> None:
        for w in self._workers:
            try:
                w.send(None)
            except Exception:  # noqa: BLE001
                pass
            w.kill()
        self._workers = []

    def map(self, fn: Callable, items: Sequence[tuple], timeout: float = DEFAULT_TIMEOUT,
            on_timeout: Any = 0.0, on_crash: Any = None, on_error: Any = None) -> list:
        with self._lock:
            return self._map(fn, list(items), timeout, on_timeout, on_crash, on_error)

    def _map(self, fn, items, timeout, on_timeout, on_crash, on_error) -> list:
        results: list[Any] = [None] * len(items)
        indexed = list(enumerate(items))
        queue = [indexed[i:i + _CHUNK] for i in range(0, len(indexed), _CHUNK)]  # unclaimed blocks, in order
        self._ensure()
        for w in self._workers:
            w.block, w.current = [], None
        idle, busy = list(self._workers), []
        while True:
            for w in list(idle):
                item = self._next_sample(w, queue)
                if item is not None:
                    self._send(w, fn, item, timeout)
                    idle.remove(w)
                    busy.append(w)
            if not busy:
                return results
            wake = min(w.deadline for w in busy)
            if idle:  # also wake when a block held behind a slow sample may be shared out
                wake = min([wake] + [w.sent_at + STEAL_AFTER_S for w in busy if w.block])
            ready = wait([w.conn for w in busy], timeout=max(0.0, wake - time.monotonic()))
            for w in list(busy):
                if w.conn in ready:
                    fate = self._collect(w, results, timeout, on_crash, on_error)
                elif time.monotonic() >= w.deadline:
                    started = w.loaded is w.fn
                    fate = self._fail(w, results, on_timeout if started else on_crash,
                                      "timeout" if started else "start-up", timeout if started else STARTUP_S)
                else:
                    continue
                if fate == "busy":
                    continue
                busy.remove(w)
                if fate == "idle":
                    idle.append(w)
                else:  # killed: its unsent samples go back first in line, a fresh worker takes its place
                    if w.block:
                        queue.insert(0, w.block)
                    nw = _Worker(self.mem_bytes)
                    self._workers[self._workers.index(w)] = nw
                    idle.append(nw)

    def _next_sample(self, w: _Worker, queue: list) -> tuple[int, tuple] | None:
        """The next sample for ``w``: from its block, else a new block, else half of the largest block held
        behind a sample that has run ``STEAL_AFTER_S``."""
        if not w.block:
            if queue:
                w.block = queue.pop(0)
            else:
                slow_since = time.monotonic() - STEAL_AFTER_S
                held = [v for v in self._workers if v.block and v.current is not None and v.sent_at <= slow_since]
                if not held:
                    return None
                victim = max(held, key=lambda v: len(v.block))
                k = (len(victim.block) + 1) // 2  # the back half: the victim keeps the samples next to its own
                w.block, victim.block = victim.block[-k:], victim.block[:-k]
        return w.block.pop(0)

    @staticmethod
    def _send(w: _Worker, fn, item: tuple[int, tuple], timeout: float) -> None:
        w.current, w.fn, w.sent_at = item, fn, time.monotonic()
        # A worker that has not loaded fn yet gets STARTUP_S more; its _Ready message starts the real clock.
        w.deadline = w.sent_at + timeout + (0.0 if w.loaded is fn else STARTUP_S)
        w.send((fn, item[0], item[1]))

    def _collect(self, w: _Worker, results: list, timeout: float, on_crash, on_error) -> str:
        try:
            idx, res = w.conn.recv()
        except (EOFError, OSError):
            return self._fail(w, results, on_crash, "crash", None)
        if isinstance(res, _Ready):
            w.loaded = w.fn
            w.deadline = time.monotonic() + timeout
            return "busy"
        if isinstance(res, _Err):
            self.stats["errors"] += 1
            log.warning("verifier sample %d raised in worker: %s", idx, res.text)
            res = on_error
        results[idx] = res
        w.current = None
        return "idle"

    def _fail(self, w: _Worker, results: list, value, kind: str, timeout) -> str:
        idx = w.current[0]
        w.current = None
        results[idx] = value
        self.stats["timeouts" if kind == "timeout" else "crashes"] += 1
        code = w.proc.poll()
        log.warning("verifier sample %d: worker %s (%s); scored %r", idx, kind,
                    f"over {timeout} s" if timeout else f"exit code {code}", value)
        w.kill()
        return "killed"


_POOL: WorkerPool | None = None
_POOL_LOCK = threading.Lock()


def get_pool(workers: int | None = None) -> WorkerPool:
    """The process-wide pool (created on first use, resized when ``workers`` differs)."""
    global _POOL
    with _POOL_LOCK:
        n = workers or default_workers()
        if _POOL is None or _POOL.n != n:
            if _POOL is not None:
                _POOL.close()
            _POOL = WorkerPool(n)
        return _POOL


def map_scores(fn: Callable, items: Sequence[tuple], fast: Callable | None = None, timeout: float = DEFAULT_TIMEOUT,
               workers: int | None = None, on_timeout: Any = 0.0, key: Callable | None = None) -> list:
    """Score ``fn(*item)`` for every item, in order.

    ``fast(*item)`` (optional) runs in-process first and settles a sample when it returns a value (cheap exact
    paths); the rest go to the process pool with a per-sample ``timeout`` (overrun -> ``on_timeout``, crash or
    exception -> None). ``key(*item)`` (optional): items with equal keys are known to score the same, so only the
    first of them is sent, in key order. ``workers=0``: no pool; each sample is scored in a forked child of the
    caller (``score_forked``: same timeout, exceptions re-raised in the caller; for debugging and the plain baseline).
    """
    if timeout is None or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    results: list[Any] = [None] * len(items)
    slow: dict[Any, list[int]] = {}
    for i, item in enumerate(items):
        r = fast(*item) if fast is not None else None
        if r is None:
            slow.setdefault(key(*item) if key is not None else i, []).append(i)
        else:
            results[i] = r
    if not slow:
        return results
    if key is not None:  # key order: items sharing a key prefix (e.g. the gold) land in the same worker block
        slow = dict(sorted(slow.items(), key=lambda kv: repr(kv[0])))
    firsts = [idx[0] for idx in slow.values()]
    if workers == 0:
        scored = [score_forked(fn, items[i], timeout, on_timeout) for i in firsts]
    else:
        scored = get_pool(workers).map(fn, [items[i] for i in firsts], timeout, on_timeout)
    for idx, r in zip(slow.values(), scored):
        for i in idx:
            results[i] = r
    return results


def score_forked(fn: Callable, args: tuple, timeout: float, on_timeout: Any = 0.0, on_crash: Any = None) -> Any:
    """``fn(*args)`` in a forked child of the caller, killed (SIGKILL) after ``timeout`` s -> ``on_timeout``.

    Why a child, not the calling thread: a hanging answer such as ``\\boxed{9^{9^{9^{9^{9}}}}}`` sits in one C-level
    sympy/gmp call that holds the GIL, so neither a signal handler (math-verify's ``signal.alarm``) nor a watchdog
    thread runs until it returns (issue 17 measured over 30 s in-process). A fork, unlike a pool worker, sees the
    caller's modules, caches and monkeypatches and needs no pickling of ``fn``; an exception in ``fn`` is re-raised
    here with the child's traceback as a note, and a child that dies without answering gives ``on_crash``. The child
    gets ``DEFAULT_MEM_BYTES`` of address space on top of the caller's.
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into the caller's code, never runs its atexit handlers
        status = 1
        try:
            os.close(r)
            _cap_address_space(DEFAULT_MEM_BYTES)
            try:
                out = ("ok", fn(*args))
            except BaseException as e:  # noqa: BLE001 - carried to the caller and raised there
                out = ("err", e, traceback.format_exc())
            try:
                data = pickle.dumps(out)
            except Exception:  # noqa: BLE001 - an unpicklable result or exception: send its text
                data = pickle.dumps(("err", RuntimeError(repr(out[1])[:500]), out[2] if len(out) > 2 else ""))
            view = memoryview(data)
            while view:
                view = view[os.write(w, view):]
            status = 0
        finally:
            os._exit(status)
    os.close(w)
    try:
        data = _read_all(r, time.monotonic() + timeout)
    finally:
        os.close(r)
    if data is None:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        log.warning("verifier sample in forked child: timeout (over %s s); scored %r", timeout, on_timeout)
        return on_timeout
    _, status = os.waitpid(pid, 0)
    if not data:
        log.warning("verifier sample in forked child: crash (wait status %d); scored %r", status, on_crash)
        return on_crash
    out = pickle.loads(data)
    if out[0] == "err":
        err, note = out[1], "raised in the forked scoring child:\n" + out[2]
        if hasattr(err, "add_note"):  # Python >= 3.11; on 3.10 the child's traceback goes to the log instead
            err.add_note(note)
        else:
            log.error(note)
        raise err
    return out[1]


def _cap_address_space(extra: int) -> None:
    # The child starts with the caller's whole address space (a trainer's can be tens of GiB), so cap growth.
    soft_hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        current = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = current + extra
    if soft_hard[1] != resource.RLIM_INFINITY:
        limit = min(limit, soft_hard[1])
    resource.setrlimit(resource.RLIMIT_AS, (limit, soft_hard[1]))


def _read_all(fd: int, deadline: float) -> bytes | None:
    """Everything written to ``fd`` until EOF, or None when ``deadline`` (monotonic) passes first."""
    chunks, poller = [], select.poll()  # poll, not select: a big caller can hold fds above FD_SETSIZE (1024)
    poller.register(fd, select.POLLIN)
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(left * 1000):
            return None
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


@atexit.register
def _shutdown() -> None:
    if _POOL is not None:
        _POOL.close()
