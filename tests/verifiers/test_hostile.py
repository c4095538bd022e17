"""Hostile completions: each comes back within its timeout plus a margin, with a valid reward, and leaves the
parent process, its memory and the file system intact."""
from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import pytest

from verifiers import get_verifier
from verifiers.pool import get_pool
from verifiers.sandbox import isolation

MATH_HOSTILE = {
    "huge_power_tower": r"\boxed{9^{9^{9^{9^{9}}}}}",
    "huge_factorial": r"\boxed{100000000!}",
    "enormous_number": "\\boxed{1" + "0" * 200_000 + "}",
    "deep_nesting": "\\boxed{" + "{" * 20_000 + "1" + "}" * 20_000 + "}",
    "deep_frac": "\\boxed{" + "\\frac{1}{" * 3000 + "2" + "}" * 3000 + "}",
    "one_megabyte": "x" * (1 << 20) + r"\boxed{68}",
    "unclosed_megabyte": "\\boxed{" + "(" * (1 << 20),
    "invalid_unicode": "\ud800\udfff\x00 \\boxed{\ud83d}",
    "division_by_zero": r"\boxed{\frac{1}{0}}",
    "huge_matrix": "\\boxed{\\begin{pmatrix}" + "&".join(["x^{99}"] * 3000) + "\\end{pmatrix}}",
}
TIMEOUT = 3.0
MARGIN = 4.0  # kill + respawn of a worker (a fresh interpreter importing sympy) on this 2-core machine


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.mark.parametrize("name", sorted(MATH_HOSTILE))
def test_math_hostile_returns_in_time(name):
    before = _rss_mb()
    t0 = time.monotonic()
    out = get_verifier("math")([MATH_HOSTILE[name]], answer=["68"], timeout=TIMEOUT)
    elapsed = time.monotonic() - t0
    assert elapsed < TIMEOUT + MARGIN, (name, elapsed)
    assert out in ([0.0], [1.0]) and (name != "one_megabyte" or out == [1.0])
    assert _rss_mb() - before < 200  # the parent's memory stays put (work happens in workers)


def test_math_hostile_batch_costs_only_hostile_samples():
    comps = list(MATH_HOSTILE.values()) + [r"\boxed{68}", r"\boxed{\frac{136}{2}}"]
    out = get_verifier("math")(comps, answer=["68"] * len(comps), timeout=TIMEOUT)
    assert out[-2:] == [1.0, 1.0] and all(v in (0.0, 1.0) for v in out)
    assert all(w.alive() for w in get_pool()._workers)


CODE_HOSTILE = {
    "infinite_loop": "while True:\n    pass",
    "sleep_forever": "import time\ntime.sleep(10**6)",
    "fork_bomb": "import os\nwhile True:\n    os.fork()",
    "memory_hog": "x = []\nwhile True:\n    x.append(bytearray(10**8))",
    "write_outside": "open('/work/main/PWNED_BY_SANDBOX', 'w').write('x')\nopen('/tmp/PWNED_BY_SANDBOX', 'w').write('x')",
    "read_caller_files": "print(open('/work/main/pyproject.toml').read())",
    "network": "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)",
    "kill_parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.killpg(0, signal.SIGKILL)",
    "kill_everything": "import os, signal\nos.kill(-1, signal.SIGKILL)",
    "output_flood": "while True:\n    print('a' * 10000)",
    "daemon_child": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(10**6)",
    "recursion": "def f(n): return f(n + 1)\nf(0)",
}


@pytest.mark.parametrize("name", sorted(CODE_HOSTILE))
def test_code_hostile_contained(name):
    parent = os.getpid()
    comp = "```python\n" + CODE_HOSTILE[name] + "\nprint(4)\n```"
    t0 = time.monotonic()
    out = get_verifier("code")([comp], test_cases=[[{"input": "", "output": "4"}]], timeout=2.0)
    assert time.monotonic() - t0 < 2.0 + 3.0, name
    assert out in ([0.0], [1.0])
    assert os.getpid() == parent
    assert not Path("/work/main/PWNED_BY_SANDBOX").exists() and not Path("/tmp/PWNED_BY_SANDBOX").exists()
    strong = isolation()["level"] == "unshare+uid"
    if name in ("write_outside", "network", "memory_hog") or (strong and name in ("read_caller_files", "fork_bomb")):
        assert out == [0.0], name
