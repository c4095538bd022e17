"""Parallel scoring runner: a persistent pool of worker processes with per-sample wall-clock timeouts.

Why not ``concurrent.futures``: a hung task there blocks its worker forever and a crashed one breaks the whole
pool. Here each worker streams one result per sample; when a sample overruns its deadline the worker is killed
(SIGKILL) and replaced, that sample gets ``on_timeout`` and the rest of its chunk is re-queued; a worker that dies
costs its current sample ``on_crash``. Results come back in input order. Workers are fresh interpreters (see ``_Worker``) and get an address-space limit so a sympy blow-up cannot eat the host.
"""
from __future__ import annotations

import atexit
import logging
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Sequence

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 10.0  # s per sample; SimpleRL-Zoo's hf_math_verify pool uses 10 s (reference simplerl_zoo.md §4)
DEFAULT_MEM_BYTES = 4 << 30  # per worker address space
_CHUNK = 16


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


def _worker_main(conn, mem_bytes: int) -> None:
    if mem_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        fn, chunk = msg
        for idx, args in chunk:
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
        self.pending: list[tuple[int, tuple]] = []
        self.deadline = 0.0
        self.timeout = DEFAULT_TIMEOUT

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
        queue = list(enumerate(items))[::-1]  # pop() from the end keeps input order
        self._ensure()
        idle = list(self._workers)
        busy: list[_Worker] = []
        while queue or busy:
            while queue and idle:
                w = idle.pop()
                w.pending = [queue.pop() for _ in range(min(_CHUNK, len(queue)))]
                w.timeout = timeout
                w.deadline = time.monotonic() + timeout
                w.send((fn, w.pending))
                busy.append(w)
            ready = wait([w.conn for w in busy], timeout=max(0.0, min(w.deadline for w in busy) - time.monotonic()))
            for w in list(busy):
                if w.conn in ready:
                    fate = self._collect(w, results, on_crash, on_error)
                elif time.monotonic() >= w.deadline:
                    fate = self._fail(w, results, on_timeout, "timeout", timeout)
                else:
                    continue
                if fate == "idle" and w.pending:
                    continue
                busy.remove(w)
                if fate == "idle":
                    idle.append(w)
                else:  # the worker was killed: re-queue the rest of its chunk, start a replacement
                    queue.extend(w.pending[::-1])
                    w.pending = []
                    nw = _Worker(self.mem_bytes)
                    self._workers[self._workers.index(w)] = nw
                    idle.append(nw)
        return results

    def _collect(self, w: _Worker, results: list, on_crash, on_error) -> str:
        try:
            idx, res = w.conn.recv()
        except (EOFError, OSError):
            return self._fail(w, results, on_crash, "crash", None)
        if isinstance(res, _Err):
            self.stats["errors"] += 1
            log.warning("verifier sample %d raised in worker: %s", idx, res.text)
            res = on_error
        results[idx] = res
        w.pending = [p for p in w.pending if p[0] != idx]
        w.deadline = time.monotonic() + w.timeout
        return "idle"

    def _fail(self, w: _Worker, results: list, value, kind: str, timeout) -> str:
        idx = w.pending[0][0]
        w.pending = w.pending[1:]
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
    first of them is sent, in key order. ``workers=0`` scores in-process (no isolation; for debugging and the plain baseline).
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
    if key is not None:  # key order: items sharing a key prefix (e.g. the gold) land in the same worker chunk
        slow = dict(sorted(slow.items(), key=lambda kv: repr(kv[0])))
    firsts = [idx[0] for idx in slow.values()]
    if workers == 0:
        scored = [fn(*items[i]) for i in firsts]
    else:
        scored = get_pool(workers).map(fn, [items[i] for i in firsts], timeout, on_timeout)
    for idx, r in zip(slow.values(), scored):
        for i in idx:
            results[i] = r
    return results


@atexit.register
def _shutdown() -> None:
    if _POOL is not None:
        _POOL.close()
