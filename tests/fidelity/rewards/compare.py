"""Compare the reward corpus's scores, ours against each source's (tests/fidelity/rewards/test_rewards.py):

    .venv/bin/python -m tests.fidelity.rewards.compare CORPUS.jsonl DIR

DIR holds ``ours.json`` (tests/fidelity/rewards/ours.py) and one ``<source>.json`` per source
(tests/fidelity/rewards/source_rewards.py). Prints, per source and reward, how many rows both scored and how many
agree, then each disagreement (row id, case, both values); ``--json`` writes the same as data.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

# source file -> the part of ours.json it is compared with
# (``*_mv090``: the same source code run on the math-verify release this project runs, 0.9.0).
SOURCES = {"open_r1": "open_r1", "simplerl": "simplerl", "open_instruct_3dd7a07d": "open_instruct_release",
           "open_instruct_c8b66a0e3": "open_instruct_grpo", "open_r1_mv090": "open_r1", "simplerl_mv090": "simplerl"}


def compare(corpus: Path, out_dir: Path) -> dict:
    """``{source: {reward: {"rows": n, "equal": n, "differ": [{id, case, source, ours}]}}}`` for every source
    file present in ``out_dir``."""
    rows = {r["id"]: r for r in map(json.loads, corpus.read_text().splitlines())}
    ours = json.loads((out_dir / "ours.json").read_text())
    report = {}
    for source, part in SOURCES.items():
        path = out_dir / f"{source}.json"
        if not path.exists():
            continue
        theirs, mine = json.loads(path.read_text()), ours[part]
        per_reward: dict = {}
        for rid, values in sorted(theirs.items()):
            for reward, value in sorted(values.items()):
                got = mine.get(rid, {}).get(reward, "missing")
                entry = per_reward.setdefault(reward, {"rows": 0, "equal": 0, "differ": []})
                entry["rows"] += 1
                if got == value:
                    entry["equal"] += 1
                else:
                    entry["differ"].append({"id": rid, "case": rows[rid]["case"], "source": value, "ours": got})
        report[source] = per_reward
    return report


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", type=Path)
    ap.add_argument("dir", type=Path)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    report = compare(args.corpus, args.dir)
    for source, per_reward in report.items():
        for reward, e in per_reward.items():
            print(f"{source:24s} {reward:10s} {e['equal']:5d} / {e['rows']:5d} equal")
            for d in e["differ"]:
                print(f"    {d['id']} {d['case']}: source {d['source']!r}, ours {d['ours']!r}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
