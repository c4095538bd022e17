"""One cgroup per sandboxed sample: a memory limit for all of its processes together and a process-count limit.

Why: RLIMIT_AS caps each process (8 forks of 800 MB fit under a 1 GiB cap and need 6.4 GB), and RLIMIT_NPROC
counts every process of a uid on the host, so a limit set per process or per uid cannot bound one sample
(issue 17). A cgroup bounds the sample's process tree as a whole (kernel docs: admin-guide/cgroup-v2.rst
"memory.max", "pids.max"; cgroup-v1/memory.rst "memory.limit_in_bytes", pids.rst "pids.max").

Where: inside the caller's own cgroup (``/proc/self/cgroup``), so the caller's limits still cover its samples.
cgroup v1 needs the ``memory`` and ``pids`` hierarchies mounted and writable (containers often mount them
read-only: then ``detect()`` returns None and the sandbox says so). cgroup v2 needs the caller's cgroup to have
``memory`` and ``pids`` in its ``cgroup.subtree_control`` (delegation); we never move the caller to make that true.
The sandbox's first process joins the cgroup itself (``echo 0 > cgroup.procs``, before it drops privileges), so
every process of the sample is in it from the start.
"""
from __future__ import annotations

import errno
import functools
import itertools
import os
import time
from dataclasses import dataclass

_ROOT = "/sys/fs/cgroup"
_COUNTER = itertools.count()


@dataclass(frozen=True)
class Hierarchy:
    version: int
    memory: str  # the caller's cgroup dir holding per-sample memory cgroups (v2: the one dir for both)
    pids: str


def _mounts() -> list[tuple[str, str, set[str]]]:
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            fstype, _src, opts = right.split()[:3]
            out.append((left.split()[4], fstype, set(opts.split(","))))
    return out


def _own(controller: str) -> str | None:
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            if controller in ctrls.split(","):
                return path
    return None


def _usable(path: str) -> bool:
    probe = os.path.join(path, f"rlr-sbx-probe-{os.getpid()}")
    try:
        os.mkdir(probe)
        os.rmdir(probe)
        return True
    except OSError:
        return False


@functools.lru_cache(maxsize=1)
def detect() -> Hierarchy | None:
    """Where per-sample cgroups can be made, or None (not root, read-only cgroupfs, no delegation)."""
    if os.geteuid() != 0:
        return None
    try:
        mounts = _mounts()
        v1 = {c: m for m, fs, opts in mounts if fs == "cgroup" for c in ("memory", "pids") if c in opts}
        if len(v1) == 2:
            dirs = {c: os.path.join(v1[c], (_own(c) or "/").lstrip("/")) for c in v1}
            if all(_usable(d) for d in dirs.values()):
                return Hierarchy(1, dirs["memory"], dirs["pids"])
        v2 = [m for m, fs, _ in mounts if fs == "cgroup2"]
        own = _own("")  # v2 line: "0::/path"
        if v2 and own is not None:
            d = os.path.join(v2[0], own.lstrip("/"))
            with open(os.path.join(d, "cgroup.subtree_control")) as f:
                if {"memory", "pids"} <= set(f.read().split()) and _usable(d):
                    return Hierarchy(2, d, d)
    except (OSError, ValueError):
        return None
    return None


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


class SampleCgroup:
    """A fresh cgroup limited to ``mem_bytes`` (swap included) and ``max_procs`` processes; ``procs_files`` are the
    files a process writes ``0`` to in order to join; ``close()`` waits for it to empty and removes it."""

    def __init__(self, h: Hierarchy, mem_bytes: int, max_procs: int):
        name = f"rlr-sbx-{os.getpid()}-{next(_COUNTER)}"
        self.version = h.version
        self.dirs = list(dict.fromkeys([os.path.join(h.memory, name), os.path.join(h.pids, name)]))
        for d in self.dirs:
            os.mkdir(d)
        try:
            mem, pids = self.dirs[0], self.dirs[-1]
            if h.version == 1:
                _write(os.path.join(mem, "memory.limit_in_bytes"), str(mem_bytes))
                if os.path.exists(os.path.join(mem, "memory.memsw.limit_in_bytes")):  # no swapping past the cap
                    _write(os.path.join(mem, "memory.memsw.limit_in_bytes"), str(mem_bytes))
            else:
                _write(os.path.join(mem, "memory.max"), str(mem_bytes))
                if os.path.exists(os.path.join(mem, "memory.swap.max")):
                    _write(os.path.join(mem, "memory.swap.max"), "0")
            _write(os.path.join(pids, "pids.max"), str(max_procs))
        except OSError:
            self.close()
            raise
        self.procs_files = [os.path.join(d, "cgroup.procs") for d in self.dirs]

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of this sample for exceeding the memory limit."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        try:
            with open(os.path.join(self.dirs[0], name)) as f:
                fields = dict(line.split() for line in f if line.strip())
            return int(fields.get("oom_kill", 0)) > 0
        except (OSError, ValueError):
            return False

    def close(self, wait_s: float = 5.0) -> None:
        # rmdir fails with EBUSY while a killed process is still exiting; the namespace's processes are all SIGKILLed
        # by then, so this is a matter of milliseconds.
        deadline = time.monotonic() + wait_s
        for d in self.dirs:
            while True:
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError as e:
                    if e.errno != errno.EBUSY or time.monotonic() > deadline:
                        raise
                    time.sleep(0.002)
