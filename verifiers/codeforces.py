"""Open-R1's Codeforces reward ``cf_code``, judged by the local C++ runner (``verifiers.cpp.run_cpp``) instead of
Piston.

Source: huggingface/open-r1 @ 1416fa0 (these files last changed in c1e1192): ``src/open_r1/rewards.py``
(``cf_code_reward``, ``extract_code``), ``src/open_r1/utils/competitive_programming/cf_scoring.py``
(``score_submission``, ``score_single_test_case``, ``get_generated_tests``), ``src/open_r1/configs.py`` (script
defaults ``code_eval_test_batch_size=1``, ``code_eval_scoring_mode="weighted_sum"``) and the recipe
``recipes/Qwen2.5-Coder-7B-Instruct/grpo/config_codeforces.yaml`` (``code_eval_test_batch_size: -1``,
``code_eval_scoring_mode: weighted_sum``).

One row of ``open-r1/codeforces`` (config ``verifiable-prompts``) per completion, its columns read as they are:

* code: the last ```` ```{language}\\n ... ``` ```` block of the completion (Open-R1 ``extract_code``), ``language``
  from the row (``cpp`` or ``python``; ``cpp`` when the row has no such column); "" when there is none, so a
  ```` ```python ```` block in a cpp row, a ```` ```c++ ```` block or an unclosed fence is no code.
* tests: ``official_tests`` followed by the problem's generated tests, the rows of ``problem_id == id`` in
  ``{tests_folder}/test_cases_{contest:04d}.parquet`` in file order (the dataset's ``generated_tests/`` files; contest
  = ``id`` before the "/"); ``tests_folder`` defaults to ``$CF_TESTS_FOLDER`` as in Open-R1.
* limits: ``time_limit`` (s) and ``memory_limit`` (MB), Piston's ``TIME_LIMIT`` and ``MEMORY_LIMIT``;
  ``input_mode`` (``stdio`` or ``file``); ``generated_checker`` (Python) when the problem has one, run as Piston
  runs ``checker.py``. Without a checker, Piston's comparison (``compare="piston"``).
* score: no tests -> None; no code -> -1.0; compile error -> -0.1; else by ``scoring_mode``: ``pass_fail`` 1.0 iff
  every test passed, ``partial`` passed / total, ``weighted_sum`` pass_fail + 0.1 * passed / total (1.1 for a full
  pass). ``test_batch_size``: ``pass_fail`` stops after the first batch with a failed test; ``partial`` and
  ``weighted_sum`` run every test, since Open-R1's loop breaks only in ``pass_fail`` mode.

What differs from Open-R1, and why: docs/verifiers.md, "Codeforces reward (cf_code)".
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

from verifiers._common import column, texts
from verifiers.code import _parallel, extract_code
from verifiers.cpp import LANGUAGES, CppResult, run_cpp

SCORING_MODES = ("pass_fail", "partial", "weighted_sum")
NO_SUBMISSION_REWARD = -1.0  # score_submission(no_submission_reward=-1.0)
NO_COMPILE_REWARD = -0.1  # score_submission(no_compile_reward=-0.1)
DEFAULT_LANGUAGE = "cpp"  # rows without a `language` column (Open-R1 returns None for every such row)
ROOT = Path(__file__).resolve().parents[1]  # relative folders are taken from the project root, as core.paths does
REQUIRED = ("id", "official_tests", "time_limit", "memory_limit")
OPTIONAL = ("generated_tests", "generated_checker", "input_mode", "language")


def score_result(result: CppResult, scoring_mode: str = "weighted_sum") -> float:
    """Open-R1 ``score_submission``'s reward for a judged program (``result.total`` tests, at least one)."""
    _check_mode(scoring_mode)
    if result.compile == "CE":
        return NO_COMPILE_REWARD
    passed, total = result.passed, result.total
    pass_fail = 1.0 if passed == total else 0.0
    if scoring_mode == "pass_fail":
        return pass_fail
    if scoring_mode == "partial":
        return passed / total
    return pass_fail + 0.1 * (passed / total)


def problem_tests(row: dict, tests_folder: str | os.PathLike | None = None) -> list[dict]:
    """``official_tests`` + the generated tests of ``row["id"]`` (``cf_scoring.score_submission``'s test list)."""
    official = [{"input": t["input"], "output": t["output"]} for t in row.get("official_tests") or []]
    return official + generated_tests(row, tests_folder)


def generated_tests(row: dict, tests_folder: str | os.PathLike | None = None) -> list[dict]:
    """The problem's rows of ``test_cases_{contest:04d}.parquet`` in ``tests_folder`` (else ``$CF_TESTS_FOLDER``).

    Open-R1 returns no tests for a contest without a file, and None for the whole row when the folder is unset; here
    a row whose ``generated_tests`` count is above 0 raises instead when the folder is unset or has none of its
    tests, since training on the official tests alone would pass the brute-force programs the generated tests
    exist to fail (the README's download command puts the files in ``generated_tests/`` below the folder it
    names, which silently gives every problem no generated tests in Open-R1)."""
    expected = int(row.get("generated_tests") or 0)
    folder = tests_folder if tests_folder is not None else os.environ.get("CF_TESTS_FOLDER")
    if not folder:
        if expected:
            raise ValueError(f"cf_code: problem {row.get('id')!r} has {expected} generated tests but no tests folder "
                             f"is set: set the verifier option tests_folder (or CF_TESTS_FOLDER) to the folder of "
                             f"open-r1/codeforces generated_tests/test_cases_*.parquet")
        return []
    path = Path(folder).expanduser()
    path = path if path.is_absolute() else ROOT / path
    if not path.is_dir():
        raise ValueError(f"cf_code: tests_folder {str(folder)!r} is not a folder (resolved to {path})")
    problem_id = str(row["id"])
    file = path / f"test_cases_{int(problem_id.split('/')[0]):04d}.parquet"
    found = _contest_tests(str(file), *_stamp(file)).get(problem_id, []) if file.is_file() else []
    if expected and not found:
        raise ValueError(f"cf_code: problem {problem_id!r} has {expected} generated tests but {file} "
                         f"{'has none of them' if file.is_file() else 'does not exist'}")
    return [dict(t) for t in found]


def _stamp(file: Path) -> tuple[int, int]:
    st = file.stat()
    return st.st_mtime_ns, st.st_size


@functools.lru_cache(maxsize=32)  # Open-R1: @alru_cache(maxsize=32) on one contest's tests
def _contest_tests(file: str, mtime_ns: int, size: int) -> dict[str, list[dict]]:
    import pyarrow.parquet as pq

    table = pq.read_table(file, columns=["problem_id", "input", "output"])
    grouped: dict[str, list[dict]] = {}
    for pid, inp, out in zip(*(table.column(c).to_pylist() for c in ("problem_id", "input", "output"))):
        grouped.setdefault(str(pid), []).append({"input": inp, "output": out})
    return grouped


def judge(code: str, row: dict, tests: list[dict], language: str = DEFAULT_LANGUAGE, test_batch_size: int = 1,
          scoring_mode: str = "weighted_sum") -> CppResult:
    """Run ``code`` on ``tests`` with the row's limits, input mode and checker, as Piston's ``codeforces`` package
    does for one test: ``TIME_LIMIT = time_limit``, ``MEMORY_LIMIT = memory_limit``, ``INPUT_MODE = input_mode``
    (``cf_scoring.score_single_test_case``'s ``grader_config``)."""
    return run_cpp(code, tests, time_limit_s=float(row["time_limit"]), memory_mb=round(float(row["memory_limit"])),
                   checker=row.get("generated_checker") or None, checker_lang="python",
                   batch_size=test_batch_size if scoring_mode == "pass_fail" else -1, compare="piston",
                   input_mode=row.get("input_mode") or "stdio", language=language)


def score_submission(completion: str, row: dict, test_batch_size: int = 1, scoring_mode: str = "weighted_sum",
                     tests_folder: str | os.PathLike | None = None) -> float | None:
    """The ``cf_code`` reward of one completion text for one dataset row (a dict of its columns)."""
    _check_mode(scoring_mode)
    language = row.get("language") or DEFAULT_LANGUAGE
    if language not in LANGUAGES:
        raise ValueError(f"cf_code: problem {row.get('id')!r} has language {language!r}; expected one of "
                         f"{', '.join(LANGUAGES)}")
    tests = problem_tests(row, tests_folder)
    if not tests:
        return None
    code = extract_code(completion, language)
    if not code:  # Open-R1 `if not submission`: a block holding only a newline is code (and then a compile error)
        return NO_SUBMISSION_REWARD
    return score_result(judge(code, row, tests, language, test_batch_size, scoring_mode), scoring_mode)


def _check_mode(scoring_mode: str) -> None:
    if scoring_mode not in SCORING_MODES:
        raise ValueError(f"cf_code: scoring_mode must be one of {', '.join(SCORING_MODES)}; got {scoring_mode!r}")


def _rows(columns: dict, n: int) -> list[dict]:
    cols = {name: column(columns, (name,), n, "cf_code") for name in REQUIRED}
    cols.update({name: column(columns, (name,), n, "cf_code") for name in OPTIONAL if columns.get(name) is not None})
    return [dict(zip(cols, values)) for values in zip(*cols.values())]


def cf_code_reward(completions, test_batch_size: int = 1, scoring_mode: str = "weighted_sum",
                   tests_folder: str | None = None, workers: int | None = None, **columns) -> list[float | None]:
    """Open-R1 ``cf_code`` on open-r1/codeforces rows (columns ``id``, ``official_tests``, ``time_limit``,
    ``memory_limit``; optional ``generated_tests``, ``generated_checker``, ``input_mode``, ``language``). Options:
    ``test_batch_size`` (Open-R1 ``code_eval_test_batch_size``, default 1; -1 = one batch), ``scoring_mode``
    (``code_eval_scoring_mode``), ``tests_folder`` (``CF_TESTS_FOLDER``), ``workers`` (parallel sandboxes).

    >>> ab = "#include <cstdio>\\nint main(){int a,b;scanf(\\"%d%d\\",&a,&b);printf(\\"%d\\",a+b);}\\n"
    >>> row = {"id": "1/A", "official_tests": [{"input": "1 2", "output": "3"}], "time_limit": 1, "memory_limit": 256}
    >>> cf_code_reward(["```cpp\\n" + ab + "```", "no code"], **{k: [v, v] for k, v in row.items()})
    [1.1, -1.0]
    """
    _check_mode(scoring_mode)
    comps = texts(completions)
    rows = _rows(columns, len(comps))
    return _parallel(lambda text, row: score_submission(text, row, int(test_batch_size), scoring_mode, tests_folder),
                     list(zip(comps, rows)), workers)
