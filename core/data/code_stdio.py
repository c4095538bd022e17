"""MBPP and HumanEval as stdin/stdout problems in the shape of ``open-r1/verifiable-coding-problems-python``: the
local stand-in for Open-R1's code recipe at ``scale=tiny`` (reference open_r1.md §1.1, §2 ``code``).

Open-R1's rows hold a ``problem_statement`` and a ``verification_info`` of ``{"language": "python", "test_cases":
[{"fn_name", "input", "output", "type": "stdin_stdout"}]}`` (the dataset card's features); its ``code`` reward runs the
completion's last fenced Python block with each input on stdin and compares stdout line by line. MBPP (Austin et al.
2021) and HumanEval (Chen et al. 2021) test functions with asserts instead, so each assert of the form
``assert f(<literal args>) == <literal>`` (HumanEval: ``assert candidate(...) == ...`` inside ``check``) becomes one
case: the input is the ``repr`` of the argument tuple on one line, the output the ``repr`` of the expected value, and
the statement asks for a program that reads that tuple, calls the function and prints the ``repr`` of its result.
Asserts of other shapes (tolerances, loops, keyword arguments, computed operands) are left out, and so are expected
values holding a set or a dict, whose ``repr`` order may differ from the literal's though they compare equal; a
problem with no case left is dropped. The statement text is ours; ``gold_standard_solution`` is the source's
reference solution wrapped the same way (tests/core/test_code_stdio.py runs them).
"""
from __future__ import annotations

import ast
from typing import Any

# The line that turns a solution into the stdin/stdout program the statement asks for.
MAIN = "\n\nimport ast\nimport sys\n\nprint(repr({fn}(*ast.literal_eval(sys.stdin.read()))))\n"


def _literal(node: ast.AST) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _has_unordered(value: Any) -> bool:
    if isinstance(value, (set, frozenset, dict)):
        return True
    if isinstance(value, (list, tuple)):
        return any(_has_unordered(v) for v in value)
    return False


def assert_case(source: str, fn: str | None = None) -> tuple[str, dict] | None:
    """``(function name, case)`` from one ``assert NAME(<literals>) == <literal>`` (``NAME`` must be ``fn`` when
    given), else None. The case is ``{"fn_name", "input", "output", "type": "stdin_stdout"}``."""
    try:
        tree = ast.parse(source.strip())
    except SyntaxError:
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        return None
    test = tree.body[0].test
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return None
    call, expected = test.left, test.comparators[0]
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and not call.keywords):
        return None
    if fn is not None and call.func.id != fn:
        return None
    parsed = [_literal(a) for a in call.args]
    ok, value = _literal(expected)
    if not ok or not all(good for good, _ in parsed) or _has_unordered(value):
        return None
    args = tuple(v for _, v in parsed)
    return call.func.id, {"fn_name": call.func.id, "input": repr(args) + "\n", "output": repr(value) + "\n",
                          "type": "stdin_stdout"}


def _statement(task: str, fn: str, case: dict) -> str:
    return (f"{task.strip()}\n\nWrite a Python program that defines `{fn}`, reads one line from standard input holding "
            f"a Python tuple literal of its arguments, calls `{fn}` with them and prints the `repr` of the result. "
            f"For example, for the input\n{case['input']}the program prints\n{case['output']}")


def _row(source: str, task_id, task: str, fn: str, cases: list[dict], solution: str) -> dict:
    return {"source": source, "task_type": "verifiable_code", "in_source_id": str(task_id),
            "problem_id": f"{source}_{task_id}", "problem_statement": _statement(task, fn, cases[0]),
            "gold_standard_solution": f"```python\n{solution.rstrip()}{MAIN.format(fn=fn)}```",
            "verification_info": {"language": "python", "test_cases": cases}, "metadata": {}}


def mbpp_row(row: dict) -> dict | None:
    """An MBPP row (``text``, ``code``, ``task_id``, ``test_setup_code``, ``test_list``) as an Open-R1 code row, or
    None when no assert converts (or the tests need setup code)."""
    if (row.get("test_setup_code") or "").strip():
        return None
    found = [c for c in (assert_case(t) for t in row.get("test_list") or []) if c is not None]
    if not found:
        return None
    fn = found[0][0]
    cases = [case for name, case in found if name == fn]
    return _row("mbpp", row["task_id"], row["text"], fn, cases, row["code"].replace("\r\n", "\n"))


def humaneval_row(row: dict) -> dict | None:
    """A HumanEval row (``task_id``, ``prompt``, ``canonical_solution``, ``test``, ``entry_point``) as an Open-R1
    code row: the asserts on ``candidate`` in ``check`` become cases on ``entry_point``; None when none converts."""
    fn = row["entry_point"]
    try:
        tree = ast.parse(row["test"])
    except SyntaxError:
        return None
    check = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None)
    if check is None:
        return None
    cases = []
    for node in check.body:
        found = assert_case(ast.unparse(node), "candidate") if isinstance(node, ast.Assert) else None
        if found is not None:
            cases.append(dict(found[1], fn_name=fn))
    if not cases:
        return None
    task = f"Complete this function:\n```python\n{row['prompt'].strip()}\n```"
    return _row("humaneval", row["task_id"].split("/")[-1], task, fn, cases, row["prompt"] + row["canonical_solution"])


def convert(rows: list[dict]) -> list[dict]:
    """MBPP or HumanEval rows (told apart by their columns) as Open-R1 code rows, those with no case dropped."""
    out = []
    for row in rows:
        converted = humaneval_row(row) if "entry_point" in row else mbpp_row(row)
        if converted is not None:
            out.append(converted)
    return out
