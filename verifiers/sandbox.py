"""Run untrusted Python in a throw-away sandbox process.

Each run gets: a fresh temporary directory (its cwd and $HOME, removed afterwards); its own session/process group
(killed as a group with SIGKILL on timeout, children included); rlimits set by util-linux ``prlimit`` before exec
(CPU seconds, address space, file size, process count, no core dumps); stdout/stderr sent to files in the temp
directory (so a flood is capped by the file-size limit, not by the parent's memory) and read back truncated.

Isolation, strongest that works here, detected once (``isolation()`` says which applies):

* ``unshare+nobody`` -- ``unshare -m -n -p -f --kill-child``: no network (empty net namespace), own PID namespace
  (every process of the run dies with it), own mount namespace where /work, /home, /root, /mnt, /srv and the repo
  are covered by empty tmpfs (the caller's files are invisible), then ``setpriv`` to uid/gid 65534 (nobody) with
  no supplementary groups: no writes outside its temp dir, and RLIMIT_NPROC applies (fork bombs).
* ``unshare`` -- the same namespaces, running as the caller (no privilege drop).
* ``guard`` -- no namespaces available: an in-process prelude replaces socket connect / DNS with errors. That is a
  speed bump, not a wall (ctypes can bypass it); documented in docs/verifiers.md.

``run_python(..., token=...)`` also carries the code verifiers' pass signal (design in ``verifiers/_harness.py``).
"""
from __future__ import annotations

import functools
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)
NOBODY = 65534

_GUARD = '''import socket as _s
def _no_net(*a, **k):
    raise OSError("network access is disabled in the rlrecipes sandbox")
class _NoNetSocket(_s.socket):
    def connect(self, *a, **k): _no_net()
    def connect_ex(self, *a, **k): _no_net()
    def sendto(self, *a, **k): _no_net()
    def bind(self, *a, **k): _no_net()
_s.socket = _NoNetSocket
_s.create_connection = _no_net
_s.getaddrinfo = _no_net
del _s
'''


@dataclass
class RunResult:
    # "ok" (exit 0, and the pass token when one was given), "unsigned" (exit 0 without the token: an early exit),
    # "error" (non-zero exit), "timeout" (killed at the wall clock)
    status: str
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _probe(cmd: list[str]) -> bool:
    tmp = tempfile.mkdtemp(prefix="rlr-sbx-probe-")
    try:
        os.chmod(tmp, 0o755)
        env = dict(os.environ, RLR_SBX_DIR=tmp)
        return subprocess.run(cmd, capture_output=True, timeout=20, env=env, cwd=tmp).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


_HIDE = ["/work", "/home", "/root", "/mnt", "/srv", os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]


def _hidden_dirs(python: str) -> list[str]:
    """Caller directories to cover with an empty tmpfs, never one holding the temp dir or the interpreter."""
    keep = [os.path.realpath(tempfile.gettempdir()), os.path.realpath(python)]
    dirs = [os.path.realpath(d) for d in _HIDE if os.path.isdir(d)]
    dirs = {d for d in dirs if d != "/" and not any(k == d or k.startswith(d + "/") for k in keep)}
    return sorted(d for d in dirs if not any(d.startswith(p + "/") for p in dirs))  # a parent covers its children


def _nobody_prefix(unshare: str, python: str) -> list[str]:
    # Mount namespace: hide the caller's files, then drop to nobody (no supplementary groups) and exec.
    # The run dir (from $RLR_SBX_DIR) is bind-mounted at /mnt/sbx, then /tmp, /var/tmp, /dev/shm get private
    # tmpfs too, so the only shared place the code can write is its own run dir.
    hidden = _hidden_dirs(python)
    mounts = "".join(f"mount -t tmpfs -o size=1m,mode=755 none '{d}' && " for d in hidden)
    if "/mnt" in hidden:
        mounts += ('mkdir /mnt/sbx && mount --bind "$RLR_SBX_DIR" /mnt/sbx && cd /mnt/sbx && '
                   + "".join(f"mount -t tmpfs -o size=16m,mode=1777 none {d} && "
                             for d in ("/tmp", "/var/tmp", "/dev/shm") if os.path.isdir(d)))
    script = mounts + 'exec setpriv --reuid %d --regid %d --clear-groups -- "$@"' % (NOBODY, NOBODY)
    return [unshare, "-m", "-n", "-p", "-f", "--kill-child", "--", "/bin/sh", "-c", script, "sh"]


_ISO_LOCK = threading.Lock()


def isolation() -> dict:
    """Which isolation applies here: {"level", "python", "prefix", "hidden"}; detected and logged once."""
    with _ISO_LOCK:
        return _isolation()


@functools.lru_cache(maxsize=1)
def _isolation() -> dict:
    unshare = shutil.which("unshare")
    pythons = [p for p in dict.fromkeys([sys.executable, shutil.which("python3"), "/usr/bin/python3"]) if p]
    if unshare and shutil.which("setpriv") and os.geteuid() == 0:
        for py in pythons:
            prefix = _nobody_prefix(unshare, py)
            if _probe(prefix + [py, "-I", "-c", "pass"]):
                return _chosen({"level": "unshare+nobody", "python": py, "prefix": prefix,
                                "hidden": _hidden_dirs(py)})
    ns = [unshare, "-n", "-p", "-f", "--kill-child", "--"] if unshare else None
    if ns and _probe(ns + [sys.executable, "-I", "-c", "pass"]):
        return _chosen({"level": "unshare", "python": sys.executable, "prefix": ns, "hidden": []})
    return _chosen({"level": "guard", "python": sys.executable, "prefix": [], "hidden": []})


def _chosen(iso: dict) -> dict:
    log.warning("code sandbox isolation: %s (python %s)", iso["level"], iso["python"])
    return iso


def _limits(cpu_s: int, mem_bytes: int, fsize_bytes: int, nproc: int) -> list[str]:
    prlimit = shutil.which("prlimit")
    if prlimit is None:  # pragma: no cover - util-linux is present on our images
        raise RuntimeError("the code sandbox needs util-linux prlimit")
    return [prlimit, f"--cpu={cpu_s}", f"--as={mem_bytes}", f"--fsize={fsize_bytes}", f"--nproc={nproc}",
            "--core=0", "--"]


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


def run_python(code: str, stdin: str = "", timeout: float = 10.0, mem_mb: int = 1024, fsize_mb: int = 16,
               nproc: int = 512, output_limit: int = 1 << 20, files: dict[str, str] | None = None,
               args: tuple[str, ...] = (), token: str | None = None) -> RunResult:
    """Run ``code`` as ``main.py args...`` with ``stdin`` and ``files`` (name -> text) beside it; returns after at most
    ``timeout`` s (+ kill/cleanup time).

    ``token`` (the pass signal of ``verifiers/_harness.py``, whose docstring gives the design): written whole into a
    pipe that the child inherits as fd ``$RLR_TOKEN_FD`` (never argv, environment or a file); the run is "ok" only if
    it exits 0 and its stdout ends with ``"\\n" + token + "\\n"``, which is removed from the returned stdout.
    """
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    iso = isolation()
    tmp = tempfile.mkdtemp(prefix="rlr-sbx-")
    token_fd = None
    try:
        if iso["level"] == "unshare+nobody":
            os.chown(tmp, NOBODY, NOBODY)
        for name, text in {"main.py": (_GUARD if iso["level"] == "guard" else "") + code, **(files or {})}.items():
            with open(os.path.join(tmp, name), "w", encoding="utf-8", errors="surrogatepass") as f:
                f.write(text)
        with open(os.path.join(tmp, "stdin.txt"), "w", encoding="utf-8", errors="replace") as f:
            f.write(stdin)
        cmd = (_limits(int(timeout) + 1, mem_mb << 20, fsize_mb << 20, nproc) + iso["prefix"]
               + [iso["python"], "-I", "main.py", *args])
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
               "RLR_SBX_DIR": tmp}
        if token is not None:
            token_fd, w = os.pipe()
            try:
                os.write(w, token.encode())  # 32 bytes: far below the pipe buffer, so this never blocks
            finally:
                os.close(w)  # the child reads the token and then EOF: nothing more can be read from this pipe
            env["RLR_TOKEN_FD"] = str(token_fd)
        return _execute(cmd, tmp, env, timeout, output_limit, token, () if token_fd is None else (token_fd,))
    finally:
        if token_fd is not None:
            os.close(token_fd)
        shutil.rmtree(tmp, ignore_errors=True)


def _execute(cmd: list[str], tmp: str, env: dict, timeout: float, output_limit: int, token: str | None,
             pass_fds: tuple[int, ...]) -> RunResult:
    t0 = time.monotonic()
    # stdout/stderr are read back through the parent's own handles, not by path: the program may replace the files
    # in its run dir, never the inodes its fds 1 and 2 point to.
    with open(os.path.join(tmp, "stdin.txt"), "rb") as fin, open(os.path.join(tmp, "stdout.txt"), "w+b") as fout, \
            open(os.path.join(tmp, "stderr.txt"), "w+b") as ferr:
        proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdin=fin, stdout=fout, stderr=ferr,
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
    # The whole session: stragglers (background children) go too, even after a normal exit.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
        log.error("sandbox process %d survived SIGKILL", proc.pid)
