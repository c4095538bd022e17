"""Compare finished runs: ``python -m recipes.compare [--recipe NAME] [--sweep latest|all|DIR] [--csv FILE]
[--plot FILE.png [--metrics A,B] [--band std|minmax|none] [--smooth W]]``.

Rows come from ``results/runs.jsonl`` (one per finished run, appended by the loops, and one per evaluated set and
metric, ``python -m recipes.eval``). Runs are grouped by recipe, scale and the keys that tell them apart (the
overrides whose values differ between the runs shown: core/reporting/comparison.py), one run per seed (the latest:
a rerun with the same config and seed replaces the earlier run, and the output says so), and each group shows
``n``, its seeds and the mean ± std over them: a table per loop kind (RL, reward model) of the training results,
and a table of evaluations, one row per evaluation settings (preset, set, metric, problems, max tokens, sampling).
``--csv`` writes the same as tidy numeric records (``mean``, ``std``, ``n``, ``min``, ``max`` columns, one row per
group and result). ``--plot FILE.png`` draws the training curves of the latest sweep (``--sweep`` names another,
or ``all``): one figure per loop kind (``FILE.rl.png`` and ``FILE.rm.png`` when both are shown), one panel per
metric (``--metrics``), one line per group (the mean over its seeds) with a band over the seeds (``--band``),
optionally smoothed (``--smooth``, an EMA weight), and the held-out accuracy after every evaluation.
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from core.errors import InputError
from core.paths import DEFAULT_RESULTS_DIR
from core.reporting.comparison import LOOPS, group, markdown, records, run_info
from core.reporting.figures import BANDS, figure, save_figure
from core.reporting.results import latest_rows, read_rows


def select_sweep(rows: list[dict], sweep: str) -> tuple[list[dict], str]:
    """The rows of one sweep (a multirun's dir, or a single run's dir): ``latest`` is the sweep of the last
    training row, ``all`` keeps every row; a run's evaluation rows go with it. Also the sweep's name."""
    if sweep == "all":
        return rows, ""
    trained = [r for r in rows if r.get("kind") != "eval"]
    if sweep == "latest":
        if not trained:
            return [], ""
        chosen = run_info(trained[-1].get("run_dir", ""))["sweep"]
    else:
        chosen = str(Path(sweep).resolve())
    dirs = {r.get("run_dir") for r in trained if str(Path(run_info(r.get("run_dir", ""))["sweep"]).resolve()) == chosen
            or str(Path(r.get("run_dir", "")).resolve()) == chosen}
    if not dirs:
        known = sorted({run_info(r.get("run_dir", ""))["sweep"] for r in trained})
        raise InputError(f"--sweep {sweep}: no finished run in that sweep; the table's sweeps are "
                         f"{', '.join(known[-10:]) or 'none'} (or use latest, all)")
    return [r for r in rows if r.get("run_dir") in dirs], Path(chosen).name


def plot(groups: list[dict], out: Path, metrics: list[str] | None, band: str, smooth: float,
         sweep: str = "") -> list[Path]:
    """One figure per loop kind among ``groups`` (RL and reward-model runs never share a panel), written to
    ``out`` (to ``out``'s stem + ``.<loop>.png`` for each when there are several)."""
    loops = list(dict.fromkeys(g["loop"] for g in groups if g["runs"] and g["loop"]))
    if not loops:
        raise InputError("--plot: no run shown has a config.yaml saying its loop (rl or rm) to draw")
    paths = []
    for loop in loops:
        gs = [g for g in groups if g["runs"] and g["loop"] == loop]
        recipes = ", ".join(dict.fromkeys(g["recipe"] for g in gs))
        scales = ", ".join(dict.fromkeys(str(g["scale"]) for g in gs))
        title = f"{LOOPS.get(loop, 'runs')}: {recipes} (scale {scales})" + (f", sweep {sweep}" if sweep else "")
        fig = figure(gs, loop, metrics, band, smooth, title)
        path = Path(out) if len(loops) == 1 else Path(out).with_suffix(f".{loop}{Path(out).suffix or '.png'}")
        paths.append(save_figure(fig, path))
    return paths


def write_csv(groups: list[dict], path: str) -> None:
    columns, body = records(groups)
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(body)


def reruns_note(groups: list[dict]) -> str:
    """A line naming the runs a later run with the same config and seed replaced, if any."""
    old = [r.get("run_dir") for g in groups for r in g["reruns"]]
    if not old:
        return ""
    return (f"not counted: {len(old)} earlier run{'s' * (len(old) > 1)} of a config and seed that ran again "
            f"(the latest counts): {', '.join(old)}")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results-dir", default=DEFAULT_RESULTS_DIR,
                    help="folder holding runs.jsonl (default: $RLR_RESULTS_DIR, else results/ in the project)")
    ap.add_argument("--recipe", default=None, help="only rows of this recipe")
    ap.add_argument("--last", type=int, default=0, help="only the last N rows (0 = all)")
    ap.add_argument("--sweep", default=None, help="only the runs of this sweep: latest, all, or a multirun's (or "
                    "run's) dir (default: all for the table, latest for --plot)")
    ap.add_argument("--csv", default=None, help="also write the comparison as numeric CSV to this file")
    ap.add_argument("--plot", default=None, help="also draw the training curves into this PNG")
    ap.add_argument("--metrics", default=None, help="comma-separated metrics.jsonl keys, one panel each "
                    "(default: held-out and training accuracy, reward, length, KL, entropy; for reward models "
                    "accuracy, loss and margin)")
    ap.add_argument("--band", default="std", choices=BANDS, help="band over seeds: mean ± 1 std (default), "
                    "min to max, or none")
    ap.add_argument("--smooth", type=float, default=0.0, help="EMA weight in [0, 1) for the training curves "
                    "(0 = none; held-out curves are never smoothed)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> str:
    args = parse(argv)
    rows = read_rows(Path(args.results_dir))
    if args.recipe:
        rows = [r for r in rows if r.get("recipe") == args.recipe]
    if args.last:
        rows = rows[-args.last:]
    shown, _ = select_sweep(rows, args.sweep or "all")
    if not shown:
        out = f"no finished runs in {args.results_dir}/runs.jsonl"
        print(out)
        return out
    groups = group(shown)
    out = "\n\n".join(filter(None, [markdown(groups), reruns_note(groups)]))
    print(out)
    if args.csv:
        write_csv(groups, args.csv)
        print(f"CSV: {args.csv}")
    if args.plot:
        drawn, name = select_sweep(latest_rows(rows), args.sweep or "latest")
        metrics = [m.strip() for m in args.metrics.split(",") if m.strip()] if args.metrics else None
        drawn_groups = group(drawn)
        runs = sum(len(g["runs"]) for g in drawn_groups)
        for path in plot(drawn_groups, Path(args.plot), metrics, args.band, args.smooth, name):
            print(f"curves: {path} ({f'sweep {name}' if name else 'all sweeps'}, {runs} runs; --sweep picks others)")
    return out


def cli() -> None:
    try:
        main()
    except InputError as e:
        sys.exit(f"{type(e).__name__}: {e}")


if __name__ == "__main__":
    cli()
