"""Print the results table of finished runs as markdown: ``python -m recipes.compare [--recipe NAME]``.

Rows come from ``results/runs.jsonl`` (one per finished run, appended atomically by the loops).
Columns are the union of the rows' scalar fields in a fixed, readable order.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from core.paths import PROJECT_ROOT
from core.reporting.results import markdown_table, read_rows

_FIRST = ["recipe", "scale", "seed", "steps", "eval_before", "eval_after", "train_seconds", "finished"]
_LAST = ["overrides", "run_dir"]


def columns(rows: list[dict]) -> list[str]:
    keys = {k for r in rows for k, v in r.items() if not isinstance(v, (dict, list)) or k in _LAST}
    middle = sorted(keys - set(_FIRST) - set(_LAST))
    return [k for k in _FIRST if k in keys] + middle + [k for k in _LAST if k in keys]


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results-dir", default=str(PROJECT_ROOT / "results"), help="folder holding runs.jsonl")
    ap.add_argument("--recipe", default=None, help="only rows of this recipe")
    ap.add_argument("--last", type=int, default=0, help="only the last N rows (0 = all)")
    args = ap.parse_args(argv)
    rows = read_rows(Path(args.results_dir))
    if args.recipe:
        rows = [r for r in rows if r.get("recipe") == args.recipe]
    if args.last:
        rows = rows[-args.last:]
    for r in rows:
        if isinstance(r.get("overrides"), list):
            r["overrides"] = " ".join(r["overrides"])
    out = markdown_table(rows, columns(rows)) if rows else f"no finished runs in {args.results_dir}/runs.jsonl"
    print(out)
    return out


if __name__ == "__main__":
    main()
