"""The code verifiers' pass signal (issue 17): a wrong program cannot score by exiting early, faking output,
patching what the harness uses, or looking for the token; right programs still score 1.0 on every path."""
from __future__ import annotations

import re

import pytest

from verifiers import get_verifier
from verifiers.code import HARNESS
from verifiers.sandbox import run_python

WRONG = "def add(a, b):\n    return 0\n"
RIGHT = "def add(a, b):\n    return a + b\n"
ASSERTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]
HE_PROMPT = 'def add(a, b):\n    """Sum of a and b."""\n'
HE_TEST = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n"
IO_WRONG = "n = int(input())\nprint(n + 1)\n"  # the task: print 2 n
IO_RIGHT = "n = int(input())\nprint(2 * n)\n"
IO_CASES = [{"input": "3", "output": "6"}, {"input": "5", "output": "10"}]

# Every finder prints any 32-hex-digit string it can reach, then ends the process with status 0 before the tests.
_PRINT_FOUND = ("import re as _re, os as _os\n"
                "for _t in sorted(set(_re.findall(r'[0-9a-f]{32}', _blob))): print('\\n' + _t)\n"
                "import sys as _sys; _sys.stdout.flush(); _os._exit(0)\n")
_READ_EVERYTHING = r"""
import os as _o
_blob = ''
for _p in (['/proc/self/cmdline', '/proc/self/environ', 'main.py', 'program.py', 'tests.py', 'stdin.txt']
           + ['/proc/self/fd/' + f for f in _o.listdir('/proc/self/fd')]):
    try:
        _fd = _o.open(_p, _o.O_RDONLY | _o.O_NONBLOCK)
        _blob += _o.read(_fd, 1 << 20).decode('latin-1')
        _o.close(_fd)
    except OSError:
        pass
for _n in range(64):  # every fd number, read directly (the token's pipe fd included, by its number in environ)
    try:
        _blob += _o.read(_n, 1 << 16).decode('latin-1')
    except OSError:
        pass
import sys as _s
_blob += repr(_s.argv) + repr(dict(_o.environ)) + repr(_s.orig_argv)
"""

# Wrong solution + a trick: each scored 1.0 or could have, with the exit status as the only signal.
ATTACKS = {
    "os_exit_before_tests": "import os\nos._exit(0)\n",
    "sys_exit_0": "import sys\nsys.exit(0)\n",
    "raise_system_exit": "raise SystemExit\n",
    "raise_system_exit_0": "raise SystemExit(0)\n",
    "site_exit": "exit()\n",
    "fake_token": "import os, sys\nprint('\\n' + 'ab' * 16)\nsys.stdout.flush()\nos._exit(0)\n",
    "fake_token_then_sys_exit": "print('0123456789abcdef' * 2)\nraise SystemExit(0)\n",
    "patch_print": "import builtins\nbuiltins.print = lambda *a, **k: None\nraise SystemExit(0)\n",
    "patch_exec_compile": ("import builtins\nbuiltins.exec = lambda *a, **k: None\n"
                           "builtins.compile = lambda *a, **k: None\n"),
    "patch_os_and_sys": ("import os, sys\nos._exit = lambda *a: None\nos.write = lambda fd, b: len(b)\n"
                         "sys.exit = lambda *a: None\nsys.excepthook = lambda *a: None\n"),
    "patch_stdout": ("import sys, io\nclass W(io.StringIO):\n    def write(self, s):\n"
                     "        return sys.__stdout__.write('\\n' + 'cd' * 16 + '\\n')\nsys.stdout = W()\n"),
    "assertion_error_rebound": "import builtins\nbuiltins.AssertionError = type('Nope', (Exception,), {})\n",
    "atexit_os_exit": "import atexit, os\natexit.register(os._exit, 0)\nraise SystemExit(0)\n",
    "atexit_fake_token": "import atexit\natexit.register(print, 'ef' * 16)\nimport os\nos._exit(0)\n",
    "timer_thread_exit": "import os, threading, time\nthreading.Timer(0.0, os._exit, [0]).start()\ntime.sleep(0.5)\n",
    "keyboard_interrupt": "raise KeyboardInterrupt\n",
    "read_everything": _READ_EVERYTHING + _PRINT_FOUND,
}


def _fence(code: str) -> str:
    return "```python\n" + code + "```"


def test_wrong_programs_with_tricks_score_zero_on_every_path():
    names = sorted(ATTACKS)
    assert len(names) == 17
    mbpp = get_verifier("code_mbpp")([_fence(WRONG + ATTACKS[n]) for n in names], test_list=[ASSERTS] * len(names),
                                     timeout=5.0)
    he = get_verifier("code_humaneval")([_fence(WRONG + ATTACKS[n]) for n in names], prompt=[HE_PROMPT] * len(names),
                                        test=[HE_TEST] * len(names), entry_point=["add"] * len(names), timeout=5.0)
    io = get_verifier("code")([_fence(IO_WRONG + ATTACKS[n]) for n in names], test_cases=[IO_CASES] * len(names),
                              timeout=5.0)
    assert dict(zip(names, mbpp)) == dict.fromkeys(names, 0.0)
    assert dict(zip(names, he)) == dict.fromkeys(names, 0.0)
    assert dict(zip(names, io)) == dict.fromkeys(names, 0.0)


# The attacks that forge a pass when the exit status is the only signal (checked below, so none is vacuous).
FORGED_BY_EXIT_STATUS = {"os_exit_before_tests", "sys_exit_0", "raise_system_exit", "raise_system_exit_0", "site_exit",
                         "fake_token", "fake_token_then_sys_exit", "patch_print", "atexit_os_exit", "atexit_fake_token",
                         "timer_thread_exit", "read_everything"}


def test_attacks_are_real_programs_and_exit_status_alone_is_forged():
    # Each attack compiles (a syntax error would score 0.0 for the wrong reason), and run the old way -- program and
    # asserts as one script, pass = exit status 0 -- exactly the expected ones exit 0 although every assert fails.
    for name, trick in ATTACKS.items():
        compile(WRONG + trick, name, "exec")
    script = {n: WRONG + t + "\n" + "\n".join(ASSERTS) + "\n" for n, t in ATTACKS.items()}
    forged = {n for n, code in script.items() if run_python(code, timeout=5.0).returncode == 0}
    assert forged == FORGED_BY_EXIT_STATUS


RIGHT_VARIANTS = {
    "plain": "",
    "patched_print": "import builtins\nbuiltins.print = lambda *a, **k: None\n",
    "main_guard": "if __name__ == '__main__':\n    import sys\n    sys.stdout.write('self-test\\n')\n",
    "atexit_output": "import atexit\natexit.register(print, 'bye')\n",
    "pickles_own_class": "import pickle\nclass P:\n    pass\nassert type(pickle.loads(pickle.dumps(P()))) is P\n",
    "thread_left_running": "import threading, time\nthreading.Thread(target=time.sleep, args=(0.2,)).start()\n",
}


def test_right_programs_still_score_one():
    names = sorted(RIGHT_VARIANTS)
    mbpp = get_verifier("code_mbpp")([_fence(RIGHT + RIGHT_VARIANTS[n]) for n in names],
                                     test_list=[ASSERTS] * len(names), timeout=5.0)
    he = get_verifier("code_humaneval")(["    return a + b\n"] + [_fence(RIGHT + RIGHT_VARIANTS[n]) for n in names],
                                        prompt=[HE_PROMPT] * (len(names) + 1), test=[HE_TEST] * (len(names) + 1),
                                        entry_point=["add"] * (len(names) + 1), timeout=5.0)
    assert dict(zip(names, mbpp)) == dict.fromkeys(names, 1.0)
    assert he == [1.0] * (len(names) + 1)


IO_RIGHT_VARIANTS = {
    "plain": IO_RIGHT,
    "sys_exit_after_output": IO_RIGHT + "import sys\nsys.exit(0)\n",
    "exit_none": IO_RIGHT + "raise SystemExit\n",
    "no_trailing_newline": "print(2 * int(input()), end='')\n",
    "buffered_atexit_writer": ("import atexit, io, sys\nbuf = io.StringIO()\n"
                               "atexit.register(lambda: sys.__stdout__.write(buf.getvalue()))\n"
                               "buf.write(str(2 * int(input())) + '\\n')\n"),
    "reads_fd_0": "import os\nprint(2 * int(open(0).read()))\n",
    "main_function": "def main():\n    print(2 * int(input()))\n\nif __name__ == '__main__':\n    main()\n",
    "prints_hex_line": IO_RIGHT + "import sys\nprint('ab' * 16, file=sys.stderr)\n",
}


def test_right_stdin_programs_still_score_one_and_exit_codes_count():
    names = sorted(IO_RIGHT_VARIANTS)
    out = get_verifier("code")([_fence(IO_RIGHT_VARIANTS[n]) for n in names], test_cases=[IO_CASES] * len(names),
                               timeout=5.0)
    assert dict(zip(names, out)) == dict.fromkeys(names, 1.0)
    failing = [IO_RIGHT + "import sys\nsys.exit(3)\n", IO_RIGHT + "raise ValueError\n", IO_RIGHT + "sys.exit('bye')\n"]
    assert get_verifier("code")([_fence(c) for c in failing], test_cases=[IO_CASES] * 3, timeout=5.0) == [0.0] * 3


def test_token_is_nowhere_the_program_can_read():
    """Run the harness directly with a known token: a program that dumps argv, environ, /proc/self/cmdline and
    /proc/self/environ, every file in its directory and every fd it holds never sees the token; the harness's own
    last line is the only copy, and the parent strips it."""
    token = "5e" * 16
    dump = _READ_EVERYTHING + "print(_blob)\n"
    res = run_python(HARNESS, files={"program.py": dump}, args=("program",), token=token, timeout=10.0)
    assert res.status == "ok", (res.status, res.stderr[-500:])
    assert "RLR_TOKEN_FD" in res.stdout and "main.py" in res.stdout  # it did read environ and the files
    assert token not in res.stdout and token.upper() not in res.stdout


@pytest.mark.parametrize("tail,status", [
    ("", "ok"),
    ("import os\nos._exit(0)\n", "unsigned"),
    ("import os, sys\nsys.stdout.write('\\n' + '5e' * 16 + '\\n')\nsys.stdout.flush()\nos._exit(0)\n", "unsigned"),
])
def test_run_python_status_follows_the_token(tail, status):
    res = run_python(HARNESS, files={"program.py": "print('hi')\n" + tail}, args=("program",), token="7f" * 16,
                     timeout=10.0)
    assert res.status == status, (res.status, res.returncode, res.stdout, res.stderr[-300:])
    if status == "ok":
        assert res.stdout == "hi\n" and res.returncode == 0


def test_harness_source_holds_no_token_and_fresh_tokens_per_run(monkeypatch):
    import verifiers.code as code_mod

    seen = []
    real = code_mod.run_python

    def spy(*a, **kw):
        seen.append(kw["token"])
        return real(*a, **kw)
    monkeypatch.setattr(code_mod, "run_python", spy)
    assert get_verifier("code_mbpp")([_fence(RIGHT)] * 3, test_list=[ASSERTS] * 3, timeout=5.0) == [1.0] * 3
    assert len(seen) == 3 and len(set(seen)) == 3 and all(re.fullmatch("[0-9a-f]{32}", t) for t in seen)
    assert not re.search("[0-9a-f]{32}", HARNESS)
