"""Cheap-first code scoring: pruned groups are not executed, expanded groups equal the plain verifier."""
from __future__ import annotations

import threading

import pytest

import verifiers.code as code_mod
from verifiers import get_verifier
from verifiers.cheap_first import CheapFirst, cheap_first

CASES = {"test_cases": [{"input": "3", "output": "6"}, {"input": "5", "output": "10"}]}
RIGHT = "```python\nprint(int(input()) * 2)\n```"
WRONG = "```python\nprint(int(input()) + 1)\n```"
HALF = "```python\nn = int(input())\nprint(6 if n == 3 else 0)\n```"  # passes 1 of 2 tests


@pytest.fixture
def sandbox_runs(monkeypatch):
    """Count sandbox executions made by the code verifier."""
    calls, lock, real = [0], threading.Lock(), code_mod.run_python

    def counting(*a, **kw):
        with lock:
            calls[0] += 1
        return real(*a, **kw)
    monkeypatch.setattr(code_mod, "run_python", counting)
    return calls


def test_pruned_group_is_not_run_and_expanded_group_matches_plain(sandbox_runs):
    # group 0: first two fail every test, a later one is right -> pruned (the documented budget trade-off)
    # group 1: the second candidate passes one test -> the whole group runs
    comps = [WRONG, WRONG, RIGHT, WRONG, WRONG, HALF, RIGHT, WRONG]
    info = [CASES] * 8
    cf = cheap_first("code", k=2)
    got = cf(comps, verification_info=info, group_size=4, workers=2)
    assert got == [0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 1.0, 0.0]
    assert cf.last_metrics == {"cheap_first/executed": 6.0, "cheap_first/skipped": 2.0,
                               "cheap_first/groups_pruned": 1.0, "cheap_first/skipped_frac": 0.25}
    assert sandbox_runs[0] == 6 * 2  # 6 candidates x 2 stdin cases; the 2 pruned candidates never ran
    plain = get_verifier("code")(comps[4:], verification_info=info[4:], workers=2)
    assert got[4:] == plain


def test_groups_from_test_column_and_none_expands():
    other = {"test_cases": [{"input": "1", "output": "1"}]}
    comps = [WRONG, RIGHT, RIGHT, "no code", "no code", RIGHT]
    info = [CASES, CASES, CASES, other, other, other]
    cf = CheapFirst("code", k=1)
    assert cf(comps, verification_info=info) == [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]  # both groups pruned after 1 each
    assert cf.last_metrics["cheap_first/executed"] == 2.0 and cf.last_metrics["cheap_first/groups_pruned"] == 2.0
    none_first = CheapFirst("code", k=1)
    # a candidate scored None (no tests) does not prune its group
    assert none_first(["x", RIGHT], test_cases=[[], []]) == [None, None]
    assert none_first.last_metrics["cheap_first/skipped"] == 0.0


def test_bad_arguments():
    with pytest.raises(ValueError):
        CheapFirst("code", k=0)
    with pytest.raises(ValueError, match="group_size"):
        CheapFirst("code")(["x"], timeout=1)
