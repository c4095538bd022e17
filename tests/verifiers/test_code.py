"""Code sandbox and code verifiers: HumanEval / MBPP reference solutions, io cases, batching."""
from __future__ import annotations

import gzip
import json

import pytest

from verifiers import get_verifier
from verifiers.code import extract_code, io_case_passed, run_asserts
from verifiers.sandbox import isolation, run_python


def test_isolation_level_is_reported():
    iso = isolation()
    assert iso["level"] in {"unshare+uid", "unshare", "guard"}
    assert run_python("print(6*7)").stdout.strip() == "42"


def test_extract_code_takes_last_python_block():
    text = "```python\nprint(1)\n```\nthen\n```python\nprint(2)\n```"
    assert extract_code(text) == "print(2)\n"
    assert extract_code("no code") == ""


def test_io_cases_fraction_and_open_r1_zip_rule():
    assert io_case_passed("1\n2\nextra", "1\n2")  # zip: extra output lines are not compared (Open-R1)
    code = "```python\nn = int(input())\nprint(n * 2 if n < 3 else n)\n```"
    cases = [{"input": str(i), "output": str(i * 2)} for i in range(1, 5)]
    assert get_verifier("code")([code], verification_info=[{"test_cases": cases}]) == [0.5]
    # early stop at the first failing batch: cases 1,2 pass, batch [3,4] fails, so 2/4 and nothing after
    assert get_verifier("code")([code], test_cases=[cases], batch_size=2) == [0.5]
    assert get_verifier("code_binary")([code], test_cases=[cases]) == [0.0]
    assert get_verifier("code")(["no code"], test_cases=[cases]) == [0.0]


def test_io_comparison_strips_the_output_not_the_expected_text():
    """Open-R1 code_reward's script: ``process.stdout.strip().split('\\n')`` against ``case['output'].split('\\n')``,
    each pair stripped, over zip."""
    assert io_case_passed("  5  \n", "5\n") and io_case_passed("1\n2", "1 \n 2\n\n")
    assert not io_case_passed("5", "\n5")  # a leading blank expected line is compared with the output's first line


def test_a_timeout_fails_the_whole_sample_when_asked():
    """``timeout_fails_all``: Open-R1's uncaught ``TimeoutExpired`` makes the sandbox return no number -> 0.0."""
    code = "```python\nimport time\nn = int(input())\nif n == 2:\n    time.sleep(60)\nprint(n)\n```"
    cases = [{"input": "1", "output": "1"}, {"input": "2", "output": "2"}]
    fn = get_verifier("code")
    assert fn([code], test_cases=[cases], timeout=1.0) == [0.5]
    assert fn([code], test_cases=[cases], timeout=1.0, timeout_fails_all=True) == [0.0]


def test_assert_batches_stop_early():
    asserts = ["assert f(1) == 1", "assert f(2) == 5", "assert f(3) == 3"]
    assert run_asserts("def f(x): return x", "", asserts, fraction=True) == pytest.approx(1 / 3)
    assert run_asserts("def f(x): return x", "", asserts) == 0.0


def _humaneval(shared_data):
    with gzip.open(shared_data / "humaneval" / "HumanEval.jsonl.gz", "rt") as f:
        return [json.loads(line) for line in f]


def test_humaneval_canonical_solutions_all_pass_and_wrong_fails(shared_data):
    rows = _humaneval(shared_data)
    assert len(rows) == 164
    fn = get_verifier("code_humaneval")
    cols = {k: [r[k] for r in rows] for k in ("prompt", "test", "entry_point")}
    out = fn([r["canonical_solution"] for r in rows], **cols)
    assert sum(v == 1.0 for v in out) == 164
    wrong = fn(["    return None\n"] * 3, **{k: v[:3] for k, v in cols.items()})
    assert wrong == [0.0, 0.0, 0.0]


def _mbpp(shared_data):
    with open(shared_data / "mbpp" / "mbpp.jsonl") as f:
        return [json.loads(line) for line in f]


def _score_mbpp(rows):
    return get_verifier("code_mbpp")([r["code"] for r in rows], raw_code=True, timeout=20.0,
                                     test_list=[r["test_list"] for r in rows],
                                     test_setup_code=[r["test_setup_code"] for r in rows])


def test_mbpp_subset_reference_solutions_pass(shared_data):
    rows = _mbpp(shared_data)
    assert len(rows) == 974
    subset = [r for r in rows if r["task_id"] <= 100 or r["task_id"] in (123, 367, 927)]
    out = _score_mbpp(subset)
    assert len(out) == 103 and sum(v == 1.0 for v in out) == 103  # 123: ~4 s; 367/927: setup after code


@pytest.mark.slow
def test_mbpp_all_974_reference_solutions_pass(shared_data):
    rows = _mbpp(shared_data)
    out = _score_mbpp(rows)
    assert sum(v == 1.0 for v in out) == 974


def test_mbpp_wrong_solution_fails(shared_data):
    row = _mbpp(shared_data)[10]
    wrong = "```python\n" + row["code"].replace("return", "return None and") + "\n```"
    assert get_verifier("code_mbpp")([wrong], test_list=[row["test_list"]]) == [0.0]


def test_mbpp_fraction_scores_the_share_of_asserts_passed():
    """``code_mbpp_fraction``: one process per assert, the fraction that pass; ``code_mbpp`` all or nothing."""
    code, asserts = "```python\ndef add(a, b):\n    return a + b\n```", ["assert add(1, 2) == 3", "assert add(1, 1) == 3"]
    assert get_verifier("code_mbpp_fraction")([code, "no code"], test_list=[asserts, asserts]) == [0.5, 0.0]
    assert get_verifier("code_mbpp")([code], test_list=[asserts]) == [0.0]
