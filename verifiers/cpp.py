"""C++ judge in the code sandbox: ``run_cpp`` (compile once, run every test, time/memory limits, checkers) and the
``code_cpp`` verifier.

One ``verifiers.sandbox.run_python`` session per sample runs ``verifiers/_cpp_runner.py`` (its docstring gives the
limits, the verdicts and what is detectable), as Open-R1's ``cf_code`` sends one Piston job per test to the
``codeforces`` package (huggingface/open-r1 ``src/open_r1/utils/competitive_programming/cf_scoring.py`` @ 1416fa0;
guipenedo/piston ``packages/codeforces/1.0.0/{compile,run}`` @ 7a38da2). A result counts only if the session ends
with its pass token (``RunResult.ok``); otherwise every test gets the verdict ``SANDBOX``.

What follows Piston, and what differs:

* Compile: Piston runs ``g++ -DONLINE_JUDGE -O2 -std=c++17 -pipe -s`` (GCC 10.2); we run the machine's g++ with the
  same flags plus ``-static`` where it links here (half the start-up time per test, ~2 MB address space).
* Limits: Piston kills at the wall clock ``TIME_LIMIT`` (``timeout``) and sets ``ulimit -v/-m/-d`` to
  ``MEMORY_LIMIT``, under a hard job limit ``run_timeout = (time_limit + 10) * 1000`` ms. We judge CPU time
  (user+sys, from ``wait4``) against the time limit, with a wall limit of 2 x time limit + 1 s for programs that
  sleep or wait (so a loaded machine does not turn slow wall clocks into TLE), and RLIMIT_AS = memory limit.
* Default comparison: ``tokens`` = testlib ``wcmp`` (MikeMirzayanov/testlib ``checkers/wcmp.cpp`` @ 1ae2e59): the
  outputs split on space/tab/CR/LF must be the same token sequence. ``piston`` = Piston's ``normalize_output``
  (tokens, with whole words yes/no compared case-insensitively); ``lines`` = Open-R1 ``code`` (stripped lines over
  ``zip``; extra lines on either side are not compared).
* Checkers: C++ in testlib style, ``./checker input output answer`` (testlib.h exit codes: 0 OK, 1 WA, 2 PE -> WA,
  3 FAIL), compiled once per session (``testlib.h`` itself is not provided); Python exactly as Piston calls
  Open-R1's ``generated_checker``: ``python3 checker.py input correct_output output``, accepted iff it exits 0 and
  prints 1 (or 100).

``CppResult`` keeps every verdict; Open-R1's ``cf_code`` (its scoring modes, test sources and limits) is
``verifiers/codeforces.py`` on top of ``run_cpp``.
"""
from __future__ import annotations

import functools
import json
import math
import secrets
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from verifiers._common import column, texts
from verifiers.code import _parallel, _test_cases, extract_code
from verifiers.sandbox import run_python

RUNNER = Path(__file__).with_name("_cpp_runner.py").read_text(encoding="utf-8")
JOB = "cpp_job.json"
PISTON_FLAGS = ("-std=c++17", "-O2", "-pipe", "-DONLINE_JUDGE", "-s")
COMPILE_MEM_MB = 1024  # cc1plus on <bits/stdc++.h> at -O2 fails under a 200 MB address-space cap, passes at 250 MB
CHECKER_TIMEOUT_S = 10.0  # Piston's codeforces `run`: `run_with_timeout 10 python3 checker.py ...`
COMPARES = ("tokens", "piston", "lines")
LANGUAGES = ("cpp", "python")


@dataclass
class CppResult:
    """``compile``: "OK", "CE" (the program did not compile) or "SANDBOX" (no signed result from the session).
    Per test, in order: ``verdicts`` (OK WA TLE MLE RE OLE FAIL SKIPPED SANDBOX), CPU and wall seconds, peak RSS."""
    compile: str
    verdicts: list[str]
    cpu_s: list[float] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    rss_kb: list[int] = field(default_factory=list)
    compile_output: str = ""
    checker_error: str = ""  # the checker did not compile: the dataset's fault, not the program's

    @property
    def passed(self) -> int:
        return self.verdicts.count("OK")

    @property
    def total(self) -> int:
        return len(self.verdicts)

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0

    @property
    def all_passed(self) -> bool:
        return self.total > 0 and self.passed == self.total


@functools.lru_cache(maxsize=1)
def default_flags() -> tuple[str, ...]:
    """Piston's codeforces flags, plus ``-static`` when a static C++ program links on this machine."""
    if shutil.which("g++") is None:
        return PISTON_FLAGS
    with tempfile.TemporaryDirectory(prefix="rlr-cpp-probe-") as tmp:
        src = Path(tmp, "probe.cpp")
        src.write_text("#include <iostream>\nint main() { std::cout << 1; }\n")
        cmd = ["g++", *PISTON_FLAGS, "-static", str(src), "-o", str(Path(tmp, "probe"))]
        ok = subprocess.run(cmd, capture_output=True, timeout=60).returncode == 0
    return PISTON_FLAGS + (("-static",) if ok else ())


def run_cpp(source: str, tests: Sequence[dict], time_limit_s: float = 2.0, memory_mb: int = 256,
            checker: str | None = None, checker_lang: str = "python", batch_size: int = -1,
            compile_flags: Sequence[str] | None = None, compare: str = "tokens", input_mode: str = "stdio",
            wall_limit_s: float | None = None, compile_timeout_s: float = 30.0, output_mb: int = 64,
            language: str = "cpp") -> CppResult:
    """Compile ``source`` and run it on ``tests`` ([{"input", "output"}]) in one sandbox session; stop after the
    first batch of ``batch_size`` tests with a failure (-1: one batch, all tests run). ``checker``: source of a
    ``checker_lang`` ("python" or "cpp") checker, else the ``compare`` rule. ``input_mode`` "file": the program
    reads ``input.txt`` and writes ``output.txt`` (old Codeforces problems; Piston's ``INPUT_MODE``).
    ``language`` "python": ``source`` is Python 3, run as ``python3 prog.py`` under the same limits with no compile
    step (Piston's ``cf_python3``, which Open-R1's ``cf_code`` uses for the dataset's Python rows)."""
    _check_choice("language", language, LANGUAGES)
    if shutil.which("g++") is None and (language == "cpp" or checker_lang == "cpp"):
        raise RuntimeError("code_cpp needs g++ on this machine")
    _check_choice("compare", compare, COMPARES)
    _check_choice("checker_lang", checker_lang, ("python", "cpp"))
    _check_choice("input_mode", input_mode, ("stdio", "file"))
    tests = [{"input": str(t["input"]), "output": str(t["output"])} for t in tests]
    wall = 2 * time_limit_s + 1 if wall_limit_s is None else wall_limit_s
    job = {"source": source, "tests": tests, "time_limit_s": time_limit_s, "memory_mb": int(memory_mb),
           "wall_limit_s": wall, "output_mb": int(output_mb), "flags": list(compile_flags or default_flags()),
           "compile_timeout_s": compile_timeout_s, "checker": checker, "checker_lang": checker_lang,
           "checker_timeout_s": CHECKER_TIMEOUT_S, "batch_size": batch_size, "compare": compare,
           "input_mode": input_mode, "language": language}
    text = json.dumps(job)
    res = run_python(RUNNER, files={JOB: text}, token=secrets.token_hex(16), timeout=_budget(job),
                     mem_mb=max(COMPILE_MEM_MB, job["memory_mb"] + 64) + 4 * (len(text) >> 20),
                     fsize_mb=max(64, job["output_mb"], _largest_mb(tests) + 1),
                     # the working dir holds the binary, one test's input and its output (up to output_mb)
                     quota_mb=max(64, job["output_mb"]) + 2 * _largest_mb(tests) + 64,
                     output_limit=(1 << 20) + 128 * len(tests))
    if not res.ok:
        return CppResult("SANDBOX", ["SANDBOX"] * len(tests), compile_output=(res.stdout + res.stderr)[-4096:])
    return _parse(json.loads(res.stdout))


def _check_choice(name: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")


def _budget(job: dict) -> float:
    """Wall seconds for the whole session: every step's own limit, plus start-up, file writes and kills."""
    n_compiles = (job["language"] == "cpp") + bool(job["checker"] and job["checker_lang"] == "cpp")
    compiles = job["compile_timeout_s"] * n_compiles
    per_test = job["wall_limit_s"] + (job["checker_timeout_s"] if job["checker"] else 0.0) + 0.5
    return compiles + len(job["tests"]) * per_test + 10.0


def _largest_mb(tests: list[dict]) -> int:
    return math.ceil(max((max(len(t["input"]), len(t["output"])) for t in tests), default=0) * 4 / (1 << 20))


def _parse(out: dict) -> CppResult:
    tests = out["tests"]
    return CppResult(out["compile"], [t["verdict"] for t in tests], [t["cpu_s"] for t in tests],
                     [t["wall_s"] for t in tests], [t["rss_kb"] for t in tests], out.get("compile_output", ""),
                     out.get("checker_error", ""))


def _per_row(columns: dict, name: str, n: int) -> list:
    return [None] * n if columns.get(name) is None else column(columns, (name,), n, "code_cpp")


def code_cpp_reward(completions, **columns) -> list[float | None]:
    """Last ```` ```cpp ```` block (Open-R1 ``extract_code(completion, "cpp")``) against ``verification_info`` /
    ``test_cases`` ({"input", "output"} cases): the fraction of tests passed (tests after the first failing batch
    count as failed). Optional columns per row: ``time_limit`` (s, default 2), ``memory_limit`` (MB, default 256),
    ``checker`` (source), ``input_mode``. Options: ``checker_lang`` (default "python", Open-R1's Codeforces
    checkers), ``compare``, ``batch_size``, ``workers``. No code -> 0.0; no tests -> None; a checker that does not
    compile -> None (the dataset's fault).

    >>> ab = "#include <cstdio>\\nint main(){int a,b;scanf(\\"%d%d\\",&a,&b);printf(\\"%d\\",a+b);}\\n"
    >>> code_cpp_reward(["```cpp\\n" + ab + "```"], test_cases=[[{"input": "1 2", "output": "3"}]])
    [1.0]
    """
    comps = texts(completions)
    n = len(comps)
    infos = column(columns, ("verification_info", "test_cases"), n, "code_cpp")
    names = {"time_limit": "time_limit_s", "memory_limit": "memory_mb", "checker": "checker",
             "input_mode": "input_mode"}
    rows = [{names[k]: v for k, v in zip(names, vals) if v is not None}
            for vals in zip(*(_per_row(columns, k, n) for k in names))]
    opts = {"batch_size": int(columns.get("batch_size", -1)), "compare": columns.get("compare", "tokens"),
            "checker_lang": columns.get("checker_lang", "python")}

    def one(text, info, row):
        cases, code = _test_cases(info), extract_code(text, "cpp")
        if not cases:
            return None
        if not code.strip():
            return 0.0
        res = run_cpp(code, cases, **row, **opts)
        return None if res.checker_error else res.fraction
    return _parallel(one, list(zip(comps, infos, rows)), columns.get("workers"))
