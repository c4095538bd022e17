"""Open-R1's ``cf_code`` on the local runner (``verifiers/codeforces.py``) with the tiny Codeforces problems
(``core/data/codeforces_tiny.py``, written on demand into the local cache): reference solutions, wrong / slow /
non-compiling programs, the checker problem, extraction edge cases and a row built in the open-r1/codeforces schema.
Real g++ and Python runs in the code sandbox; each reference is judged once and scored in every mode from that one
result."""
from __future__ import annotations

import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from core.data import codeforces_tiny as tiny
from core import paths
from core.paths import PROJECT_ROOT
from verifiers import get_verifier
from verifiers.code import extract_code
from verifiers.codeforces import (NO_COMPILE_REWARD, NO_SUBMISSION_REWARD, SCORING_MODES, cf_code_reward, judge,
                                  problem_tests, score_result, score_submission)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed: the C++ judge needs it")

TESTS_FOLDER = tiny.folder() / "generated_tests"  # written on first use (a few seconds), then read from the cache
PROBLEMS = {p.id: p for p in tiny.PROBLEMS}
# The columns of open-r1/codeforces `verifiable-prompts` (dataset card: the `verifiable` features + prompt, language).
SCHEMA = ("id", "aliases", "contest_id", "contest_name", "contest_type", "contest_start", "contest_start_year", "index",
          "time_limit", "memory_limit", "title", "description", "input_format", "output_format", "interaction_format",
          "note", "examples", "editorial", "rating", "tags", "testset_size", "official_tests",
          "official_tests_complete", "input_mode", "generated_checker", "executable", "generated_tests", "prompt",
          "language")
AB = '#include <cstdio>\nint main(){long long a,b;scanf("%lld %lld",&a,&b);printf("%lld\\n",a+b);}\n'
# 9001/A in 32 bits: right on the small official tests, wrong on every generated one (sums beyond 2^31).
SUMS_INT = ('#include <cstdio>\nint main(){int t,a,b;scanf("%d",&t);'
            'while(t--){scanf("%d %d",&a,&b);printf("%d\\n",a+b);}}\n')
# 9001/C by a loop up to n: right for the official n <= 90, out of time for every generated n ~ 10^18.
FIB_LOOP = ('#include <cstdio>\nint main(){int t;scanf("%d",&t);while(t--){unsigned long long n,a=0,b=1,c;'
            'scanf("%llu",&n);for(unsigned long long i=0;i<n;i++){c=(a+b)%1000000007ULL;a=b;b=c;}'
            'printf("%llu\\n",a);}}\n')
IDENTITY = '#include <cstdio>\nint main(){int n;scanf("%d",&n);for(int i=1;i<=n;i++)printf("%d ",i);}\n'
THIRDS_LOWER = ('#include <cstdio>\nchar s[1005];\nint main(){int t;scanf("%d",&t);while(t--){scanf("%1004s",s);'
                'int r=0;for(char*c=s;*c;c++)r=(r+*c-48)%3;puts(r?"no":"Yes");}}\n')
MIN_STDIO = ('#include <cstdio>\nint main(){int n;long long m=0,x;scanf("%d",&n);'
             'for(int i=0;i<n;i++){scanf("%lld",&x);if(!i||x<m)m=x;}printf("%lld\\n",m);}\n')


def _fence(code: str, language: str = "cpp") -> str:
    return f"<think>\n...\n</think>\n<answer>\n```{language}\n{code}```\n</answer>"


def _columns(rows: list[dict]) -> dict:
    return {key: [r[key] for r in rows] for key in rows[0]}


@pytest.fixture(scope="module")
def rows() -> dict:
    """The tiny dataset, by (problem id, language)."""
    with open(TESTS_FOLDER.parent / "train.jsonl", encoding="utf-8") as f:
        loaded = [json.loads(line) for line in f]
    return {(r["id"], r["language"]): r for r in loaded}


@pytest.fixture(scope="module")
def references(rows) -> dict:
    """Each reference solution judged once on its row's official + generated tests (batch -1: every test runs)."""
    def one(key):
        row = rows[key]
        code = getattr(PROBLEMS[key[0]], key[1])
        return key, judge(code, row, problem_tests(row, TESTS_FOLDER), key[1], test_batch_size=-1)
    with ThreadPoolExecutor(2) as ex:
        return dict(ex.map(one, sorted(rows)))


def test_the_written_data_is_this_modules_output(rows):
    """The cache folder holds every problem in both languages, in the dataset's columns, with the module's inputs (the
    outputs are checked by the references passing below); it is the module's one folder, under the cache dir."""
    assert TESTS_FOLDER.parent == tiny.folder() and TESTS_FOLDER.is_relative_to(paths.cache_dir())
    assert sorted(rows) == sorted((p.id, lang) for p in tiny.PROBLEMS for lang in tiny.LANGUAGES)
    assert 5 <= len(tiny.PROBLEMS) <= 8
    generated = tiny.generated_inputs()
    for (pid, language), row in rows.items():
        p = PROBLEMS[pid]
        assert set(row) == set(SCHEMA), pid
        assert [t["input"] for t in row["official_tests"]] == list(p.official_inputs)
        assert (row["time_limit"], row["memory_limit"], row["input_mode"]) == (p.time_limit, p.memory_limit,
                                                                                p.input_mode)
        assert row["generated_checker"] == p.checker and row["description"] == p.description
        assert f"```{language}\n" in row["prompt"] and p.description in row["prompt"]
        found = problem_tests(row, TESTS_FOLDER)[len(p.official_inputs):]
        assert [t["input"] for t in found] == generated[pid] and row["generated_tests"] == len(found) >= 3
    assert sum(bool(r["generated_checker"]) for r in rows.values()) == 2  # 9001/B, both languages
    assert {r["input_mode"] for r in rows.values()} == {"stdio", "file"}


def test_every_reference_scores_full_in_every_mode(references, rows):
    assert len(references) == 2 * len(tiny.PROBLEMS)
    for key, res in references.items():
        expected_total = len(rows[key]["official_tests"]) + rows[key]["generated_tests"]
        assert res.compile == "OK" and res.verdicts == ["OK"] * expected_total, (key, res.verdicts, res.compile_output)
        assert [score_result(res, mode) for mode in SCORING_MODES] == pytest.approx([1.0, 1.0, 1.1]), key


def test_the_verifier_end_to_end_on_the_rows(rows):
    """Through the registered verifier, as a trainer calls it: columns as lists, options as keywords."""
    picked = [rows["9001/A", "cpp"], rows["9002/C", "python"], rows["9001/A", "python"]]
    comps = [_fence(PROBLEMS["9001/A"].cpp), _fence(PROBLEMS["9002/C"].python, "python"), "I cannot solve this."]
    fn = get_verifier("cf_code")
    assert fn is cf_code_reward
    assert fn(comps, tests_folder=os.path.relpath(TESTS_FOLDER, PROJECT_ROOT), workers=2,
              **_columns(picked)) == pytest.approx([1.1, 1.1, NO_SUBMISSION_REWARD])


def test_wrong_answer_scores_by_mode(rows):
    row = rows["9001/A", "cpp"]
    cols, comp = _columns([row]), [_fence(SUMS_INT)]
    n_official, total = len(row["official_tests"]), len(row["official_tests"]) + row["generated_tests"]
    assert cf_code_reward(comp, scoring_mode="pass_fail", tests_folder=TESTS_FOLDER, **cols) == [0.0]
    assert cf_code_reward(comp, scoring_mode="partial", tests_folder=TESTS_FOLDER, **cols) == [n_official / total]
    weighted = cf_code_reward(comp, scoring_mode="weighted_sum", tests_folder=TESTS_FOLDER, **cols)
    assert weighted == pytest.approx([0.1 * n_official / total]) and n_official / total == pytest.approx(0.4)


def test_time_limit_exceeded_stops_pass_fail_at_the_first_failing_batch(rows):
    row = rows["9001/C", "cpp"]
    tests = problem_tests(row, TESTS_FOLDER)
    res = judge(FIB_LOOP, row, tests, scoring_mode="pass_fail", test_batch_size=1)
    n = len(row["official_tests"])
    assert res.verdicts == ["OK"] * n + ["TLE"] + ["SKIPPED"] * (len(tests) - n - 1)
    assert score_result(res, "pass_fail") == 0.0


def test_compile_error_is_minus_a_tenth_in_every_mode(rows):
    """Open-R1 `if not submission` is false for a block holding only a newline: it is compiled, and fails."""
    row = rows["9002/C", "cpp"]
    assert extract_code(_fence("\n"), "cpp") == "\n"
    res = judge("\n", row, problem_tests(row, TESTS_FOLDER))
    assert res.compile == "CE" and "main" in res.compile_output
    assert [score_result(res, mode) for mode in SCORING_MODES] == [NO_COMPILE_REWARD] * 3


def test_python_has_no_compile_step(rows):
    """Piston's cf_python3 skips compiling, so a syntax error is a runtime error on every test: 0, not -0.1."""
    row = rows["9002/C", "python"]
    assert score_submission(_fence("print(1\n", "python"), row, tests_folder=TESTS_FOLDER) == 0.0


def test_checker_accepts_two_different_valid_outputs(references, rows):
    """9001/B: the Python reference prints the rotation (the expected outputs), the C++ one swaps neighbours; both
    pass through the checker, the C++ one fails a plain comparison, and the identity permutation fails the checker."""
    row = rows["9001/B", "cpp"]
    tests = problem_tests(row, TESTS_FOLDER)
    assert references["9001/B", "python"].verdicts == references["9001/B", "cpp"].verdicts == ["OK"] * len(tests)
    plain = judge(PROBLEMS["9001/B"].cpp, dict(row, generated_checker=None), tests)
    assert plain.verdicts == ["OK"] * 3 + ["WA"] * (len(tests) - 3)  # n = 1, 2, 3: both print the same
    wrong = judge(IDENTITY, row, tests)
    assert wrong.verdicts == ["WA"] * len(tests) and score_result(wrong, "partial") == 0.0


def test_piston_comparison_and_file_input_mode(rows):
    """Without a checker the comparison is Piston's: yes/no in any case; a file-mode problem reads output.txt, so a
    program writing standard output fails every test."""
    thirds = judge(THIRDS_LOWER, rows["9002/A", "cpp"], problem_tests(rows["9002/A", "cpp"], TESTS_FOLDER))
    assert thirds.all_passed
    row = rows["9002/B", "cpp"]
    stdio = judge(MIN_STDIO, row, problem_tests(row, TESTS_FOLDER))
    assert stdio.compile == "OK" and set(stdio.verdicts) == {"WA"}


def test_extraction_edge_cases(rows):
    """Open-R1 `extract_code`: the last ```{language}\\n ... ``` block, else "" (which scores -1.0 without running)."""
    row = rows["9001/A", "cpp"]
    no_code = ["no block", "```python\nprint(1)\n```", "```c++\nint main(){}\n```", "```CPP\nint main(){}\n```",
               "```cpp int main(){}```", "```cpp\nint main(){}\n", "```\nint main(){}\n```"]
    assert all(extract_code(text, "cpp") == "" for text in no_code)
    assert [score_submission(t, row, tests_folder=TESTS_FOLDER) for t in no_code] == [NO_SUBMISSION_REWARD] * 7
    assert score_submission(_fence(AB), rows["9001/A", "python"], tests_folder=TESTS_FOLDER) == NO_SUBMISSION_REWARD
    two = "```cpp\nint main(){return 1;}\n```\ntext\n```cpp\nint main(){}\n```"
    assert extract_code(two, "cpp") == "int main(){}\n"
    no_tests = dict(row, official_tests=[], generated_tests=0)
    assert score_submission("no block", no_tests) is None  # no tests: None before the code is looked at


def test_a_row_in_the_open_r1_schema(tmp_path, monkeypatch):
    """A row built column by column like open-r1/codeforces `verifiable-prompts`, its generated tests in a contest
    parquet beside another problem's, found through $CF_TESTS_FOLDER as Open-R1 finds them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tests = [{"problem_id": "2/A", "test_case_i": 0, "input": "4 5\n", "output": "9\n"},
             {"problem_id": "2/B", "test_case_i": 0, "input": "1 1\n", "output": "0\n"},
             {"problem_id": "2/A", "test_case_i": 1, "input": "-3 10\r\n", "output": "7\r\n"}]
    pq.write_table(pa.Table.from_pylist(tests), tmp_path / "test_cases_0002.parquet")
    row = dict.fromkeys(SCHEMA)
    row.update(id="2/A", contest_id="2", index="A", time_limit=2.0, memory_limit=64.0, aliases=[], tags=["math"],
               examples=[{"input": "1 2\n", "output": "3\n"}], official_tests=[{"input": "1 2\n", "output": "3\n"}],
               official_tests_complete=True, input_mode="stdio", executable=True, generated_tests=2, language="cpp",
               prompt="...", generated_checker="")  # "" like None: no checker (Open-R1 tests its truthiness)
    monkeypatch.setenv("CF_TESTS_FOLDER", str(tmp_path))
    assert [t["input"] for t in problem_tests(row)] == ["1 2\n", "4 5\n", "-3 10\r\n"]
    assert cf_code_reward([_fence(AB), _fence("int main(){}\n")], scoring_mode="partial",
                          **_columns([row, row])) == [1.0, 0.0]
    with pytest.raises(ValueError, match="generated tests but .*does not exist"):
        problem_tests(dict(row, id="3/A"))
    monkeypatch.delenv("CF_TESTS_FOLDER")
    with pytest.raises(ValueError, match="no tests folder"):
        problem_tests(row)
    assert problem_tests(dict(row, generated_tests=0)) == row["official_tests"]


def test_bad_options_name_the_key(rows):
    row = rows["9001/A", "cpp"]
    with pytest.raises(ValueError, match="scoring_mode must be one of pass_fail, partial, weighted_sum; got 'all'"):
        cf_code_reward(["x"], scoring_mode="all", **_columns([row]))
    with pytest.raises(ValueError, match="language 'java'"):
        score_submission("x", dict(row, language="java"))
    with pytest.raises(ValueError, match="needs one of the columns time_limit"):
        cf_code_reward(["x"], **{k: v for k, v in _columns([row]).items() if k != "time_limit"})
