"""The reward corpus check (docs/fidelity.md "Rewards"): every verifier a named recipe scores with, against its
source's own reward code, on the corpus of tests/fidelity/rewards/corpus.py. ``make fidelity`` builds the envs
(tests/fidelity/rewards/envs.sh) and runs it; by hand: ``pytest -m fidelity tests/fidelity/rewards``.

Each source runs in an env of its own (tests/fidelity/rewards/source_rewards.py); ours runs here
(tests/fidelity/rewards/ours.py), each verifier as its recipe configures it. A difference passes only when it is one
of the named ones (:data:`NAMED`), each shown to be what its name says on that very row; everything else must be
equal on every row.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from core.paths import PROJECT_ROOT
from tests.fidelity.rewards import compare, corpus, ours
from tests.fidelity.rewards.source_rewards import write

ENVS = Path(os.environ.get("FIDELITY_ENVS", "/tmp/rlr-fidelity-envs"))
DRIVER = Path(__file__).with_name("source_rewards.py")
# output name -> (env, source); ``*_mv090``: the same source code on math-verify 0.9.0, this project's.
RUNS = {"open_instruct_3dd7a07d": ("rewards-open-instruct-3dd7a07d", "open_instruct_3dd7a07d"),
        "open_r1": ("rewards-open-r1", "open_r1"), "simplerl": ("rewards-simplerl", "simplerl"),
        "open_instruct_c8b66a0e3": ("rewards-open-instruct-c8b66a0e3", "open_instruct_c8b66a0e3"),
        "open_r1_mv090": ("rewards-math-verify-0.9.0", "open_r1"),
        "simplerl_mv090": ("rewards-math-verify-0.9.0", "simplerl")}
LANES = (("open_instruct_3dd7a07d", "open_r1", "simplerl"),
         ("open_instruct_c8b66a0e3", "open_r1_mv090", "simplerl_mv090"))


def _math_verify_release(source, reward, d, report):
    """Ours gives what the same source code gives on math-verify 0.9.0 (the project's): the release differs."""
    twin = report.get(f"{source}_mv090", {}).get(reward, {})
    return bool(twin) and d["id"] not in {x["id"] for x in twin["differ"]}


def _latex_parser(source, reward, d, report):
    """With sympy's ``is_equiv`` off on both sides the row agrees: the LaTeX parser differs (sympy's ANTLR backend
    in the source, lark here) or sympy's release."""
    return d["id"] not in {x["id"] for x in report[source]["math_no_sympy"]["differ"]}


def _checker_raises(source, reward, d, report):
    """The source's checker raised (its trainer would stop); ours fails the constraint: 0.0."""
    return str(d["source"]).startswith("raise:") and d["ours"] == 0.0


# name -> (the (source, reward) pairs it may explain, the test that it explains a row)
NAMED = {"math_verify_release": ({("open_r1", "accuracy"), ("simplerl", "math")}, _math_verify_release),
         "latex_parser": ({("open_instruct_3dd7a07d", "math"), ("open_instruct_c8b66a0e3", "math")}, _latex_parser),
         "checker_raises": ({("open_instruct_3dd7a07d", "ifeval"), ("open_instruct_c8b66a0e3", "ifeval")},
                            _checker_raises)}


def test_corpus_is_deterministic_and_large_enough(shared_data, tmp_path):
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    corpus.main([str(first), "--data", str(shared_data)])
    corpus.main([str(second), "--data", str(shared_data)])
    assert first.read_bytes() == second.read_bytes()
    rows = [json.loads(line) for line in first.read_text().splitlines()]
    assert len(rows) >= 2000 and len({r["id"] for r in rows}) == len(rows)
    tasks = {t: sum(r["task"] == t for r in rows) for t in ("math", "gsm8k", "ifeval")}
    assert min(tasks.values()) >= 400, tasks


def _run_lane(names, corpus_path, out, failures):
    for name in names:
        env, source = RUNS[name]
        proc = subprocess.run([str(ENVS / env / "bin" / "python"), str(DRIVER), source, str(corpus_path),
                               str(out / f"{name}.json")], capture_output=True, text=True)
        if proc.returncode:
            failures.append(f"{name}: exit {proc.returncode}\n{proc.stderr[-3000:]}")


@pytest.fixture(scope="module")
def report(shared_data, tmp_path_factory):
    missing = sorted({env for env, _ in RUNS.values() if not (ENVS / env / ".ok").is_file()})
    if missing:
        pytest.fail(f"reward envs {missing} are not built in {ENVS}: run tests/fidelity/rewards/envs.sh")
    out = tmp_path_factory.mktemp("rewards")
    corpus_path = out / "corpus.jsonl"
    corpus.main([str(corpus_path), "--data", str(shared_data)])
    failures: list[str] = []
    lanes = [threading.Thread(target=_run_lane, args=(lane, corpus_path, out, failures)) for lane in LANES]
    for lane in lanes:
        lane.start()
    rows = ours.read_rows(corpus_path)
    write(out / "ours.json", {name: fn(rows) for name, fn in ours.PARTS.items()})
    for lane in lanes:
        lane.join()
    assert not failures, "\n".join(failures)
    return compare.compare(corpus_path, out)


def _explain(report) -> tuple[dict, list]:
    named = {name: 0 for name in NAMED}
    unexplained = []
    for source, per_reward in report.items():
        for reward, entry in per_reward.items():
            for d in entry["differ"]:
                why = [n for n, (pairs, test) in NAMED.items() if (source, reward) in pairs and test(
                    source, reward, d, report)]
                if why:
                    named[why[0]] += 1
                else:
                    unexplained.append((source, reward, d))
    return named, unexplained


@pytest.mark.fidelity
def test_every_reward_equals_its_source_or_a_named_difference(report):
    assert set(report) == set(RUNS)
    named, unexplained = _explain(report)
    summary = {s: {r: {"rows": e["rows"], "equal": e["equal"]} for r, e in pr.items()} for s, pr in report.items()}
    path = PROJECT_ROOT / "results" / "fidelity" / "rewards" / "rewards.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"per_reward": summary, "named": named}, indent=1, sort_keys=True))
    print(json.dumps(summary, indent=1), named, file=sys.stderr)
    assert not unexplained, "\n".join(f"{s} {r} {d}" for s, r, d in unexplained[:40])
    # the string rules (everything but sympy), the format rewards, GSM8K, and the same code on our math-verify:
    # equal on every row
    for source, reward in [(s, "math_no_sympy") for s in ("open_instruct_3dd7a07d", "open_instruct_c8b66a0e3")] + \
            [(s, r) for s in ("open_r1", "open_r1_mv090") for r in ("format", "tag_count")] + \
            [("open_instruct_3dd7a07d", "gsm8k"), ("open_instruct_c8b66a0e3", "gsm8k"), ("open_r1_mv090", "accuracy"),
             ("simplerl_mv090", "math")]:
        assert not report[source][reward]["differ"], (source, reward, report[source][reward]["differ"][:5])
    rows = sum(e["rows"] for pr in report.values() for e in pr.values())
    assert rows > 20000 and all(named.values()), (rows, named)  # every named difference was met at least once
