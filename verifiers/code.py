"""Code-execution verifiers: a completion's last fenced Python block run against unit tests in ``verifiers.sandbox``.

* Code extraction: Open-R1 ``extract_code`` (huggingface/open-r1 src/open_r1/utils/code_providers / rewards.py
  @ c1e1192): the last match of ```` ```python\\n(.*?)``` ````, else "".
* ``code`` -- stdin/stdout test cases, Open-R1 ``code_reward``: each case runs the program with the input on stdin
  (default 5 s each); the stripped stdout and the expected output are split into lines and compared pairwise after
  ``strip`` over ``zip`` (the shorter side only); reward = fraction of cases passed. Column ``verification_info``
  ({"test_cases": [{"input","output"}]}) or ``test_cases``. No code -> 0.0. ``timeout_fails_all=True``: a case
  that runs out of time scores the whole sample 0.0, as in Open-R1's evaluation script, where
  ``subprocess.TimeoutExpired`` escapes ``evaluate_code`` and the sandbox returns no number
  (docs/verifiers.md "Open-R1's code reward").
* ``code_binary`` -- Open-R1 ``binary_code``: 1 if ``code`` > 0.99 else 0 (None kept).
* ``code_mbpp`` -- assert tests, MBPP order (Austin et al. 2021): code, then ``test_setup_code``, then the
  ``test_list`` asserts, all-or-nothing in one process. ``code_mbpp_fraction``: one process per assert, fraction.
* ``code_humaneval`` -- HumanEval (Chen et al. 2021; openai/human-eval ``execution.py``): ``prompt + completion``
  (or the completion's fenced block, when it has one, in place of both), then ``test``, then
  ``check(entry_point)``.
Options (keyword columns): ``timeout`` per process (s), ``batch_size`` (tests per process; stop at the first
failing batch, as Open-R1's ``code_eval_test_batch_size``), ``workers`` (parallel sandboxes).

Pass signal: every run goes through ``verifiers/_harness.py`` (``run_signed``), and counts as passed only if it exits
0 *and* prints a per-run random token as its last stdout line, which the harness does only after the last test (or,
for stdin/stdout cases, the program) has run without raising. An exit status alone could be forged with
``os._exit(0)`` before the asserts; the harness docstring gives the design and what it does not cover.
"""
from __future__ import annotations

import json
import re
import secrets
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

from verifiers._common import column, texts
from verifiers.pool import default_workers
from verifiers.sandbox import RunResult, run_python

HARNESS = Path(__file__).with_name("_harness.py").read_text(encoding="utf-8")


def extract_code(completion: str, language: str = "python") -> str:
    matches = re.findall(rf"```{language}\n(.*?)```", completion, re.DOTALL)
    return matches[-1] if matches else ""


def io_case_passed(stdout: str, expected: str) -> bool:
    """Open-R1's comparison: all(zip of stripped lines equal) -- extra lines on either side are not checked. The
    output is stripped before the split, the expected output is not (a leading blank expected line is compared)."""
    out_lines, exp_lines = stdout.strip().split("\n"), str(expected).split("\n")
    return all(o.strip() == e.strip() for o, e in zip(out_lines, exp_lines))


def _batches(items: Sequence, batch_size: int) -> list[list]:
    if batch_size is None or batch_size <= 0:
        return [list(items)]
    return [list(items[i:i + batch_size]) for i in range(0, len(items), batch_size)]


def run_signed(program: str, tests: str | None = None, stdin: str = "", timeout: float = 10.0) -> RunResult:
    """``program`` as ``__main__``, then ``tests`` (if given) in its namespace, under the pass-signal harness: the
    result is ``ok`` only if the run exits 0 and ends its stdout with this run's ``secrets.token_hex(16)`` (which
    ``run_python`` strips from ``stdout``). Without ``tests``, ``sys.exit(0)`` counts as finishing the program."""
    files = {"program.py": program} if tests is None else {"program.py": program, "tests.py": tests}
    return run_python(HARNESS, stdin=stdin, timeout=timeout, files=files, token=secrets.token_hex(16),
                      args=("program",) if tests is None else ("tests",))


def run_asserts(program: str, setup: str, asserts: Sequence[str], timeout: float = 10.0, batch_size: int = -1,
                fraction: bool = False) -> float:
    """Run ``program``, ``setup``, then asserts in batches (one process each); stop at the first failing batch.

    Returns the fraction of asserts in passing batches (``fraction=True``) or 1.0/0.0 for all passed.
    """
    if not asserts:
        raise ValueError("no tests to run")
    passed = 0
    for batch in _batches(asserts, 1 if fraction and batch_size == -1 else batch_size):
        res = run_signed(program, setup + "\n" + "\n".join(batch) + "\n", timeout=timeout)
        if not res.ok:
            break
        passed += len(batch)
    return passed / len(asserts) if fraction else float(passed == len(asserts))


def run_io_cases(program: str, cases: Sequence[dict], timeout: float = 5.0, batch_size: int = 1,
                 timeout_fails_all: bool = False) -> float:
    """Fraction of stdin/stdout cases passed; with ``batch_size`` > 0 stop after the first batch with a failure;
    with ``timeout_fails_all`` a case that times out makes the result 0.0 (Open-R1's script)."""
    passed = 0
    for batch in _batches(cases, batch_size):
        ok = [run_signed(program, stdin=str(c["input"]), timeout=timeout) for c in batch]
        if timeout_fails_all and any(r.status == "timeout" for r in ok):
            return 0.0
        good = [r.ok and io_case_passed(r.stdout, c["output"]) for r, c in zip(ok, batch)]
        passed += sum(good)
        if not all(good):
            break
    return passed / len(cases)


def _parallel(fn, jobs: list, workers: int | None) -> list:
    # Each job spends its time in a sandbox subprocess, so threads are enough to keep the cores busy.
    with ThreadPoolExecutor(max_workers=workers or default_workers()) as ex:
        return list(ex.map(lambda j: fn(*j), jobs))


def _test_cases(info) -> list[dict]:
    if isinstance(info, str):
        info = json.loads(info)
    cases = info.get("test_cases", info) if isinstance(info, dict) else info
    if not isinstance(cases, list) or not all(isinstance(c, dict) and {"input", "output"} <= set(c) for c in cases):
        raise ValueError("test cases must be a list of {'input': ..., 'output': ...}")
    return cases


def code_reward(completions, **columns) -> list[float | None]:
    comps = texts(completions)
    infos = column(columns, ("verification_info", "test_cases"), len(comps), "code")
    timeout, bs = float(columns.get("timeout", 5.0)), int(columns.get("batch_size", -1))
    all_or_nothing = bool(columns.get("timeout_fails_all", False))

    def one(text, info):
        cases, code = _test_cases(info), extract_code(text)
        if not cases:
            return None
        return 0.0 if not code.strip() else run_io_cases(code, cases, timeout, bs, all_or_nothing)
    return _parallel(one, list(zip(comps, infos)), columns.get("workers"))


def code_binary_reward(completions, **columns) -> list[float | None]:
    return [None if r is None else float(r > 0.99) for r in code_reward(completions, **columns)]


def _mbpp(completions, columns: dict, fraction: bool, name: str) -> list[float | None]:
    comps = texts(completions)
    tests = column(columns, ("test_list",), len(comps), name)
    setups = columns.get("test_setup_code") or [""] * len(comps)
    timeout, bs = float(columns.get("timeout", 15.0)), int(columns.get("batch_size", -1))

    def one(text, setup, asserts):
        code = extract_code(text) or (text if columns.get("raw_code") else "")
        return 0.0 if not code.strip() else run_asserts(code, setup or "", list(asserts), timeout, bs, fraction)
    return _parallel(one, list(zip(comps, setups, tests)), columns.get("workers"))


def code_mbpp_reward(completions, **columns) -> list[float | None]:
    """MBPP all-or-nothing. ``raw_code=True`` treats a completion with no fenced block as code."""
    return _mbpp(completions, columns, False, "code_mbpp")


def code_mbpp_fraction_reward(completions, **columns) -> list[float | None]:
    return _mbpp(completions, columns, True, "code_mbpp_fraction")


def code_humaneval_reward(completions, **columns) -> list[float | None]:
    comps = texts(completions)
    n = len(comps)
    prompts, tests = column(columns, ("prompt",), n, "code_humaneval"), column(columns, ("test",), n, "code_humaneval")
    entries = column(columns, ("entry_point",), n, "code_humaneval")
    timeout = float(columns.get("timeout", 10.0))

    def one(text, prompt, test, entry):
        program = extract_code(text) or (prompt + text)
        return run_asserts(program, test, [f"check({entry})"], timeout)
    return _parallel(one, list(zip(comps, prompts, tests, entries)), columns.get("workers"))
