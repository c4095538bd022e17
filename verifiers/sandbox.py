"""Run untrusted Python in a throw-away sandbox: fresh namespaces, its own uid, cgroup and seccomp filter.

Each run gets a fresh temporary directory for its files and output, its own session (killed as a group with
SIGKILL, children included), stdout/stderr sent to files (a flood is capped by the file-size limit, not by the
parent's memory) and read back truncated. The set-up inside the sandbox is done by ``verifiers/sandbox_prelude.py``
(one interpreter, before any program code exists); ``verifiers/cgroups.py`` makes the per-sample cgroup.

Isolation, strongest that works here, detected once by running a probe through it (``isolation()`` says which):

* ``unshare+uid`` (root with namespaces) -- ``unshare -m -n -p -i -u -f --kill-child --mount-proc``: no network
  (empty net namespace); own PID namespace with its own ``/proc`` (no host process is visible, and every process
  of the run dies with it); own System V IPC namespace (segments, semaphores and message queues die with it); own
  mount namespace where /work, /home, /root, /mnt, /srv and the repository are covered by empty tmpfs, the working
  dir ``/mnt/sbx`` is a tmpfs of ``quota_mb`` owned by the run, and /tmp, /var/tmp, /dev/shm and /run are private
  tmpfs of 16 MiB each. The program then runs as a uid of its own (``UID_BASE`` + a slot held by one run at a time
  across processes, so RLIMIT_NPROC and file ownership are per sample, never shared with another sample), with no
  supplementary groups, no capabilities, no_new_privs (setuid binaries run without their privileges) and the
  seccomp filter. Where cgroups are writable (``cgroups.detect()``), the run's processes share one memory limit
  (``mem_mb``, swap included) and one process limit (``nproc``); elsewhere each process has ``mem_mb`` of address
  space and the uid has ``nproc`` processes.
* ``unshare`` -- network, PID and IPC namespaces, as the caller (no mounts, no uid); rlimits and seccomp apply.
* ``guard`` -- no namespaces available: an in-process prelude replaces socket connect / DNS with errors. That is a
  speed bump, not a wall (ctypes can bypass it); documented in docs/verifiers.md.

``run_python(..., token=...)`` also carries the code verifiers' pass signal (design in ``verifiers/_harness.py``).
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

from verifiers import cgroups, sandbox_prelude

log = logging.getLogger(__name__)
UID_BASE, UID_SLOTS = 2_000_000_000, 4096  # far above system and subuid ranges (/etc/subuid starts at 100000)
UID_LOCK_DIR = "/run/rlr-sbx-uids"
PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run")
PRIVATE_SIZE = 16 << 20


@dataclass
class RunResult:
    # "ok" (exit 0, and the pass token when one was given), "unsigned" (exit 0 without the token: an early exit),
    # "error" (non-zero exit), "timeout" (killed at the wall clock)
    status: str
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    oom_killed: bool = False  # the cgroup's memory limit killed one of its processes

    @property
    def ok(self) -> bool:
        return self.status == "ok"


_HIDE = ["/work", "/home", "/root", "/mnt", "/srv", os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]


def _hidden_dirs(python: str) -> list[str]:
    """Caller directories to cover with an empty tmpfs, never one holding the temp dir or the interpreter."""
    keep = [os.path.realpath(tempfile.gettempdir()), os.path.realpath(python)]
    dirs = [os.path.realpath(d) for d in _HIDE if os.path.isdir(d)]
    dirs = {d for d in dirs if d != "/" and not any(k == d or k.startswith(d + "/") for k in keep)}
    return sorted(d for d in dirs if not any(d.startswith(p + "/") for p in dirs))  # a parent covers its children


_ISO_LOCK = threading.Lock()
_PROBE = """import os
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(os.getuid(), status["NoNewPrivs"].strip(), status["Seccomp"].strip())
"""


def isolation() -> dict:
    """Which isolation applies here: {"level", "python", "prefix", "hidden", "private", "seccomp", "bpf", "cgroup"};
    detected by running a probe through each candidate, strongest first, and logged once."""
    with _ISO_LOCK:
        return _isolation()


@functools.lru_cache(maxsize=1)
def _isolation() -> dict:
    unshare = shutil.which("unshare")
    bpf = sandbox_prelude.seccomp_bpf()
    pythons = [p for p in dict.fromkeys([sys.executable, shutil.which("python3"), "/usr/bin/python3"]) if p]
    candidates = []
    if unshare and os.geteuid() == 0 and os.path.isdir("/mnt"):
        ns = [unshare, "-m", "-n", "-p", "-i", "-u", "-f", "--kill-child", "--mount-proc", "--"]
        # The interpreter whose files leave the most caller dirs hidden first (a venv's or pyenv's interpreter keeps
        # /work or /root visible, since its standard library must stay readable).
        strong = [{"level": "unshare+uid", "python": py, "prefix": ns, "hidden": _hidden_dirs(py),
                   "cgroup": cgroups.detect()} for py in pythons]
        candidates += sorted(strong, key=lambda c: -len(c["hidden"]))
    if unshare:
        ns = [unshare, "-n", "-p", "-i", "-f", "--kill-child", "--"]
        candidates.append({"level": "unshare", "python": sys.executable, "prefix": ns, "hidden": [], "cgroup": None})
    candidates.append({"level": "guard", "python": sys.executable, "prefix": [], "hidden": [], "cgroup": None})
    private = [d for d in PRIVATE_DIRS if os.path.isdir(d)]
    for iso in candidates:
        for filt in ([bpf, None] if bpf is not None else [None]):
            iso = dict(iso, private=private, seccomp=filt is not None, bpf=filt)
            if _probe(iso):
                log.warning("code sandbox isolation: %s (python %s, seccomp %s, cgroup %s)", iso["level"],
                            iso["python"], "on" if filt else "OFF", iso["cgroup"] and f"v{iso['cgroup'].version}")
                return iso
    raise RuntimeError("no sandbox level works here, not even the in-process guard")  # pragma: no cover


def _probe(iso: dict) -> bool:
    try:
        res = _run(iso, _PROBE, "", 20.0, 256, 1, 64, 1 << 16, {}, (), None, 16)
    except OSError:
        return False
    fields = res.stdout.split()
    if res.status != "ok" or len(fields) != 3:
        return False
    uid, nnp, mode = fields
    strong = iso["level"] == "unshare+uid"
    return nnp == "1" and (mode == "2") == iso["seccomp"] and (int(uid) >= UID_BASE) == strong


@contextlib.contextmanager
def _uid_slot():
    """A uid no other run holds now, across threads and processes: an exclusive flock on one of ``UID_SLOTS``
    files, held for the run (the namespace's processes are all dead when it is released). The files sit at one
    fixed root-only place (this level runs as root), whatever a process's TMPDIR is."""
    d = UID_LOCK_DIR
    os.makedirs(d, mode=0o700, exist_ok=True)
    start = secrets.randbelow(UID_SLOTS)
    for k in range(UID_SLOTS):
        slot = (start + k) % UID_SLOTS
        fd = os.open(os.path.join(d, str(slot)), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            yield UID_BASE + slot
        finally:
            os.close(fd)
        return
    raise RuntimeError(f"all {UID_SLOTS} sandbox uid slots are in use")


def run_python(code: str, stdin: str = "", timeout: float = 10.0, mem_mb: int = 1024, fsize_mb: int = 16,
               nproc: int = 256, output_limit: int = 1 << 20, files: dict[str, str] | None = None,
               args: tuple[str, ...] = (), token: str | None = None, quota_mb: int = 64) -> RunResult:
    """Run ``code`` as ``main.py args...`` with ``stdin`` and ``files`` (name -> text) beside it, in the working dir;
    returns after at most ``timeout`` s (+ kill/cleanup time).

    Limits: ``mem_mb`` (the run's processes together where a cgroup applies, else each process's address space),
    ``nproc`` processes, ``fsize_mb`` per written file, ``quota_mb`` for the working dir (``unshare+uid``), CPU
    seconds = ``timeout`` + 1. ``token`` (the pass signal of ``verifiers/_harness.py``, whose docstring gives the
    design): written whole into a pipe that the child inherits as fd ``$RLR_TOKEN_FD`` (never argv, environment or
    a file); the run is "ok" only if it exits 0 and its stdout ends with ``"\\n" + token + "\\n"``, which is
    removed from the returned stdout.
    """
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    return _run(isolation(), code, stdin, timeout, mem_mb, fsize_mb, nproc, output_limit, files or {}, args, token,
                quota_mb)


def _run(iso: dict, code: str, stdin: str, timeout: float, mem_mb: int, fsize_mb: int, nproc: int,
         output_limit: int, files: dict[str, str], args: tuple[str, ...], token: str | None,
         quota_mb: int) -> RunResult:
    tmp = tempfile.mkdtemp(prefix="rlr-sbx-")
    token_fd = None
    try:
        fdir = os.path.join(tmp, "files")
        os.mkdir(fdir, 0o755)
        for name, text in {"main.py": code, **files}.items():
            with open(os.path.join(fdir, name), "w", encoding="utf-8", errors="surrogatepass") as f:
                f.write(text)
        with open(os.path.join(tmp, "stdin.txt"), "w", encoding="utf-8", errors="replace") as f:
            f.write(stdin)
        env = {"PATH": "/usr/bin:/bin", "HOME": fdir, "LANG": "C.UTF-8"}
        if token is not None:
            token_fd, w = os.pipe()
            try:
                os.write(w, token.encode())  # 32 bytes: far below the pipe buffer, so this never blocks
            finally:
                os.close(w)  # the child reads the token and then EOF: nothing more can be read from this pipe
            env["RLR_TOKEN_FD"] = str(token_fd)
        strong = iso["level"] == "unshare+uid"
        with (_uid_slot() if strong else contextlib.nullcontext()) as uid, \
                _cgroup(iso["cgroup"] if strong else None, mem_mb << 20, nproc) as cg:
            cfg = {"uid": uid, "hidden": iso["hidden"], "private": iso["private"],
                   "private_size": PRIVATE_SIZE, "quota": quota_mb << 20, "files": fdir,
                   "cgroup_procs": cg.procs_files if cg else [], "bpf": iso["bpf"],
                   "rlimits": {"RLIMIT_CPU": int(timeout) + 1, "RLIMIT_AS": mem_mb << 20,
                               "RLIMIT_FSIZE": fsize_mb << 20, "RLIMIT_NPROC": nproc, "RLIMIT_CORE": 0}}
            cmd = iso["prefix"] + [iso["python"], "-I", "-c", sandbox_prelude.source(cfg, iso["level"] == "guard"),
                                   "main.py", *args]
            res = _execute(cmd, tmp, fdir, env, timeout, output_limit, token, () if token_fd is None else (token_fd,))
            res.oom_killed = bool(cg and cg.oom_killed())
            return res
    finally:
        if token_fd is not None:
            os.close(token_fd)
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _cgroup(h: cgroups.Hierarchy | None, mem_bytes: int, nproc: int):
    if h is None:
        yield None
        return
    cg = cgroups.SampleCgroup(h, mem_bytes, nproc)
    try:
        yield cg
    finally:
        cg.close()


def _read_output(f, limit: int, suffix: bytes | None) -> tuple[str, bool]:
    """The first ``limit`` bytes of the open file ``f``, and whether it ends with ``suffix`` (then cut off)."""
    size = f.seek(0, os.SEEK_END)
    signed = False
    if suffix is not None and size >= len(suffix):
        f.seek(size - len(suffix))
        signed = f.read(len(suffix)) == suffix
        size -= len(suffix) if signed else 0
    f.seek(0)
    return f.read(min(size, limit)).decode("utf-8", errors="replace"), signed


def _execute(cmd: list[str], tmp: str, cwd: str, env: dict, timeout: float, output_limit: int, token: str | None,
             pass_fds: tuple[int, ...]) -> RunResult:
    t0 = time.monotonic()
    # stdout/stderr are read back through the parent's own handles, not by path: the program may replace the files
    # in its run dir, never the inodes its fds 1 and 2 point to.
    with open(os.path.join(tmp, "stdin.txt"), "rb") as fin, open(os.path.join(tmp, "stdout.txt"), "w+b") as fout, \
            open(os.path.join(tmp, "stderr.txt"), "w+b") as ferr:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=fin, stdout=fout, stderr=ferr,
                                start_new_session=True, close_fds=True, pass_fds=pass_fds)
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(proc)
        wall = time.monotonic() - t0
        stdout, signed = _read_output(fout, output_limit, None if token is None else f"\n{token}\n".encode())
        stderr, _ = _read_output(ferr, output_limit, None)
    rc = None if timed_out else proc.returncode
    if timed_out:
        status = "timeout"
    elif rc != 0:
        status = "error"
    else:
        status = "ok" if token is None or signed else "unsigned"
    return RunResult(status, rc, stdout, stderr, wall)


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the run: the namespace's init first, so that ``unshare`` reaps it and exits (killing both at once
    orphans the init to the host's pid 1, where it stays a zombie of the sample's uid until that reaps it), then
    the whole session: stragglers (background children) go too, even after a normal exit."""
    if proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
                kids = [int(k) for k in f.read().split()]
        except OSError:
            kids = []
        for kid in kids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(kid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1 if kids else 0)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
        log.error("sandbox process %d survived SIGKILL", proc.pid)
