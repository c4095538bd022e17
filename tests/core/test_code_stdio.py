"""MBPP / HumanEval as stdin/stdout problems in Open-R1's code-dataset shape (core/data/code_stdio.py): which asserts
convert and to what, the rows' columns, the ``code_stdio`` data source, and the references passing through the
``code`` reward."""
from __future__ import annotations

import ast
import gzip
import json

import pytest

from core.config import schema
from core.data import prompts as D
from core.data.code_stdio import assert_case, convert, humaneval_row, mbpp_row
from verifiers import get_verifier

# open-r1/verifiable-coding-problems-python's columns and its verification_info / test_cases fields (dataset card).
COLUMNS = {"source", "task_type", "in_source_id", "problem_statement", "gold_standard_solution", "problem_id",
           "metadata", "verification_info"}
CASE_FIELDS = {"fn_name", "input", "output", "type"}
MBPP_ROW = {"task_id": 7, "text": "Add two numbers.", "code": "def add(a, b):\r\n  return a + b",
            "test_setup_code": "", "challenge_test_list": [],
            "test_list": ["assert add(1, 2) == 3", "assert add(a=1, b=2) == 3", "assert add([1], [2]) == [1, 2]",
                          "assert math.isclose(add(0.1, 0.2), 0.3)", "assert add({1}, set()) == {1}"]}


def test_an_assert_becomes_one_stdin_case_only_in_its_plain_shape():
    assert assert_case("assert f(1, 'a', [2, (3,)]) == {'k': 1}") is None  # a dict's repr order is not the literal's
    name, case = assert_case("assert f(1, 'a', [2, (3,)]) == (True, None, -1.5)")
    assert name == "f" and case == {"fn_name": "f", "input": "(1, 'a', [2, (3,)])\n",
                                    "output": "(True, None, -1.5)\n", "type": "stdin_stdout"}
    assert ast.literal_eval(case["input"]) == (1, "a", [2, (3,)])
    assert assert_case("assert f(x=1) == 2") is None  # keyword arguments
    assert assert_case("assert f(g(1)) == 2") is None  # a computed argument
    assert assert_case("assert f(1) == 2 == 2") is None and assert_case("assert f(1) != 2") is None
    assert assert_case("assert abs(f(1) - 2) < 1e-6") is None and assert_case("x = 1") is None
    assert assert_case("assert candidate(1) == 2", "f") is None  # another function's name
    assert assert_case("assert f(5,) == 'five'")[1]["input"] == "(5,)\n"


def test_an_mbpp_row_in_open_r1s_shape():
    row = mbpp_row(MBPP_ROW)
    assert set(row) == COLUMNS and row["problem_id"] == "mbpp_7" and row["in_source_id"] == "7"
    info = row["verification_info"]
    assert info["language"] == "python" and all(set(c) == CASE_FIELDS for c in info["test_cases"])
    cases = [(c["input"], c["output"]) for c in info["test_cases"]]
    assert cases == [("(1, 2)\n", "3\n"), ("([1], [2])\n", "[1, 2]\n")]
    assert row["problem_statement"].startswith("Add two numbers.\n\n") and "`add`" in row["problem_statement"]
    assert row["gold_standard_solution"].startswith("```python\ndef add(a, b):\n  return a + b\n")
    assert mbpp_row(dict(MBPP_ROW, test_setup_code="import math")) is None  # setup code has no stdin form
    assert mbpp_row(dict(MBPP_ROW, test_list=MBPP_ROW["test_list"][3:])) is None  # nothing converts


def test_a_humaneval_row_reads_the_check_function():
    test = ("def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(2) == 3, 'msg'\n"
            "    for i in range(3):\n        assert candidate(i) == i + 1\n")
    row = humaneval_row({"task_id": "HumanEval/3", "entry_point": "inc", "prompt": "def inc(x):\n    \"\"\"x+1\"\"\"\n",
                         "canonical_solution": "    return x + 1\n", "test": test})
    assert row["problem_id"] == "humaneval_3"
    assert [(c["fn_name"], c["input"], c["output"]) for c in row["verification_info"]["test_cases"]] == [
        ("inc", "(1,)\n", "2\n"), ("inc", "(2,)\n", "3\n")]
    out = get_verifier("code")([row["gold_standard_solution"], "```python\nprint(0)\n```"],
                               verification_info=[row["verification_info"]] * 2)
    assert out == [1.0, 0.0]


def _data(shared_data, **kw):
    values = {"source": "code_stdio", "path": str(shared_data / "mbpp" / "mbpp.jsonl"),
              "eval_path": str(shared_data / "humaneval" / "HumanEval.jsonl.gz"), "prompt_key": "problem_statement",
              "answer_key": None}
    return schema.node(schema.PromptDataConfig, {**values, **kw})


def test_the_data_source_converts_the_shared_files(shared_data):
    """MBPP: 974 problems, 39 without a convertible assert (setup code, tolerances, sets and dicts); HumanEval: 164, 11
    without. Rows reach the verifier with their verification_info, the statement as the prompt."""
    train, evaluation = D.load_split(_data(shared_data), "train"), D.load_split(_data(shared_data), "eval")
    assert (len(train), len(evaluation)) == (935, 153)
    assert all(set(r) == COLUMNS - {"problem_statement"} | {"prompt"} for r in train + evaluation)
    assert {r["problem_id"].split("_")[0] for r in train} == {"mbpp"} and evaluation[0]["problem_id"] == "humaneval_0"
    with pytest.raises(D.DataError, match="no MBPP or HumanEval problem"):
        D.load_split(_data(shared_data, path=str(shared_data / "gsm8k" / "test.jsonl")), "train")


def test_the_references_print_what_the_cases_expect(shared_data):
    """The references of the first 20 MBPP and 10 HumanEval problems through the ``code`` reward: every case passes,
    or prints a value equal to the expected one in another type (MBPP's 240.0 for 240, 0 for False: the asserts
    compare with ==, a stdout comparison cannot; documented in core/data/code_stdio.py)."""
    with open(shared_data / "mbpp" / "mbpp.jsonl") as f:
        mbpp = convert([json.loads(line) for line in f])[:20]
    with gzip.open(shared_data / "humaneval" / "HumanEval.jsonl.gz", "rt") as f:
        humaneval = convert([json.loads(line) for line in f])[:10]
    rows = mbpp + humaneval
    scores = get_verifier("code")([r["gold_standard_solution"] for r in rows], timeout=20.0,
                                  verification_info=[r["verification_info"] for r in rows])
    assert scores[len(mbpp):] == [1.0] * 10
    failing = [r for r, s in zip(mbpp, scores) if s != 1.0]
    assert len(failing) < 5 and all(_equal_values(r) for r in failing), [r["problem_id"] for r in failing]


def _equal_values(row) -> bool:
    """Each case of ``row``: the reference's printed value == the expected value (by Python's ==)."""
    from verifiers.code import extract_code, run_signed

    code = extract_code(row["gold_standard_solution"])
    for case in row["verification_info"]["test_cases"]:
        out = run_signed(code, stdin=case["input"], timeout=20.0)
        if not out.ok or ast.literal_eval(out.stdout.strip()) != ast.literal_eval(case["output"]):
            return False
    return True
