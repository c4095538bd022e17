"""Compare finished runs: ``python -m recipes.compare [--recipe NAME] [--csv FILE] [--plot FILE]``.

Rows come from ``results/runs.jsonl`` (one per finished run, appended atomically by the loops, and one per
evaluated set and metric, ``python -m recipes.eval``, shown as ``<preset>/<set>/<metric>`` columns). Runs are
grouped by recipe and by the config keys whose values differ between that recipe's runs (read from each
run's ``config.yaml``; the seed, paths, devices and logging never count), and each group shows the mean ±
std over its seeds of the results (``eval_before``, ``eval_after``, ``train_seconds``, ...), as markdown
and, with ``--csv``, as CSV. ``--plot FILE.png`` draws the training curves of the runs shown (reward,
accuracy, response length, KL, entropy, seconds per phase), one line per group: the mean over its seeds.
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
from collections import defaultdict
from pathlib import Path

import yaml

from core.paths import DEFAULT_RESULTS_DIR
from core.reporting.results import latest_rows, markdown_table, read_rows

# Config keys that never make two runs different experiments (the scale's own settings count through its name:
# ``scale.name`` is kept, and what the scale changes shows in the keys it changed).
IGNORED = ("seed", "resume", "resume_allow_changes", "device", "cpu_threads", "paths.", "logger.", "hydra.",
           "recipe_name", "scale.prompts_per_step", "scale.max_group_size", "scale.total_steps",
           "scale.max_new_tokens", "scale.model.")
# Differing keys named in a curve's legend; the rest are counted (the table lists them all).
LEGEND_KEYS = 3
# Results averaged over seeds, in this order (others that are numbers follow).
RESULTS = ["eval_before", "eval_after", "steps", "train_seconds"]
# Training curves: (title, metrics.jsonl keys drawn in it).
CURVES = [("reward", ["reward/mean"]), ("accuracy", ["accuracy"]), ("response length", ["length/mean"]),
          ("KL", ["kl"]), ("entropy", ["entropy"]),
          ("seconds per phase", ["time/generate", "time/verify", "time/logprobs", "time/update"])]


def _flat(node, prefix: str = "") -> dict:
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: json.dumps(node, sort_keys=True) if isinstance(node, (list, dict)) else node}


def _config(run_dir: str) -> dict:
    path = Path(run_dir) / "config.yaml"
    flat = _flat(yaml.safe_load(path.read_text())) if path.exists() else {}
    return {k: v for k, v in flat.items() if not any(k == i or (i.endswith(".") and k.startswith(i)) for i in IGNORED)}


def group(rows: list[dict]) -> list[dict]:
    """One entry per (recipe, values of the keys that differ between the recipe's runs): the group's
    ``recipe``, ``config`` (those keys and values), ``runs`` and ``seeds``."""
    by_recipe = defaultdict(list)
    for r in rows:
        by_recipe[r.get("recipe")].append((r, _config(r.get("run_dir", ""))))
    groups = []
    for recipe, members in by_recipe.items():
        keys = sorted({k for _, c in members for k in c})
        differ = [k for k in keys if len({json.dumps(c.get(k), default=str) for _, c in members}) > 1]
        buckets = defaultdict(list)
        for r, c in members:
            buckets[tuple((k, c.get(k)) for k in differ)].append(r)
        for key, runs in buckets.items():
            groups.append({"recipe": recipe, "config": dict(key), "runs": runs,
                           "seeds": sorted(r.get("seed") for r in counted_runs(runs))})
    return groups


def _stat(values: list[float]) -> str:
    if not values:
        return ""
    mean = statistics.fmean(values)
    return f"{mean:.4g}" if len(values) == 1 else f"{mean:.4g} ± {statistics.stdev(values):.2g}"


def results_of(r: dict) -> dict:
    """A row's results: a training row's numbers (its seed aside); an evaluation row (``kind: eval``,
    recipes/eval.py) its one value, as ``<preset>/<set>/<metric>``."""
    if r.get("kind") == "eval":
        return {f"{r.get('preset')}/{r.get('set')}/{r.get('metric')}": r.get("value")}
    return {k: v for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "seed"}


def counted_runs(runs: list[dict]) -> list[dict]:
    """What a group counts: its training runs; a group of evaluations alone (a hub model), one per evaluation."""
    trained = [r for r in runs if r.get("kind") != "eval"]
    return trained or list({r.get("eval_dir"): r for r in runs}.values())


def table(groups: list[dict]) -> tuple[list[str], list[dict]]:
    """Columns and rows of the comparison: recipe, the differing keys, n and seeds, then mean ± std. A training
    run's evaluations (``python -m recipes.eval run_dir=...``) join its group as more result columns."""
    keys = sorted({k for g in groups for k in g["config"]})
    numeric = sorted({k for g in groups for r in g["runs"] for k, v in results_of(r).items()
                      if isinstance(v, (int, float)) and not isinstance(v, bool)})
    results = [k for k in RESULTS if k in numeric] + [k for k in numeric if k not in RESULTS]
    out = []
    for g in groups:
        counted = counted_runs(g["runs"])
        row = {"recipe": g["recipe"], **{k: g["config"].get(k, "") for k in keys}, "n": len(counted),
               "seeds": " ".join(str(s) for s in g["seeds"])}
        for k in results:
            row[k] = _stat([float(v) for r in g["runs"] if isinstance(v := results_of(r).get(k), (int, float))])
        out.append(row)
    return ["recipe", *keys, "n", "seeds", *results], out


def legend_keys(groups: list[dict]) -> list[str]:
    """Up to :data:`LEGEND_KEYS` differing keys that tell the groups apart: chosen greedily, each the key that
    separates the most pairs of groups not yet told apart (ties: fewer dots, then name)."""
    keys = sorted({k for g in groups for k in g["config"]}, key=lambda k: (k.count("."), k))
    apart: set[tuple[int, int]] = set()
    pairs = {(i, j) for i in range(len(groups)) for j in range(i + 1, len(groups))
             if groups[i]["recipe"] == groups[j]["recipe"]}

    def splits(k):
        return {(i, j) for i, j in pairs - apart if groups[i]["config"].get(k) != groups[j]["config"].get(k)}

    chosen = []
    while keys and len(chosen) < LEGEND_KEYS and pairs - apart:
        best = max(keys, key=lambda k: len(splits(k)))
        if not splits(best):
            break
        apart |= splits(best)
        chosen.append(best)
        keys.remove(best)
    return chosen


def _label(g: dict, keys: list[str]) -> str:
    """The recipe and the values of ``keys`` (:func:`legend_keys`); the table lists every differing key."""
    return " ".join([g["recipe"], *(f"{k}={g['config'][k]}" for k in keys if k in g["config"])])


def plot(groups: list[dict], out: Path) -> Path:
    """Training curves, one line per group (the mean over its seeds at each step), one panel per curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from matplotlib.lines import Line2D

    styles = ["-", "--", ":", "-."]
    shown = legend_keys(groups)
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5), constrained_layout=True)
    for ax, (title, keys) in zip(axes.flat, CURVES):
        for i, g in enumerate(groups):
            curves = [_curves(r["run_dir"]) for r in counted_runs(g["runs"])]
            for j, key in enumerate(keys):
                steps, mean = _mean_curve([c.get(key, {}) for c in curves])
                if steps:
                    ax.plot(steps, mean, styles[j % 4], color=f"C{i % 10}", lw=1.6)
        if len(keys) > 1:  # one line style per metric in the panel, named in its own small legend
            ax.legend([Line2D([], [], color="0.3", ls=styles[j % 4]) for j in range(len(keys))],
                      [k.split("/")[-1] for k in keys], fontsize=8, loc="best")
        ax.set_title(title)
        ax.set_xlabel("RL step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.grid(alpha=0.3)
    fig.legend([Line2D([], [], color=f"C{i % 10}", lw=2) for i in range(len(groups))],
               [f"{_label(g, shown)}  [n={len(counted_runs(g['runs']))}]" for g in groups],
               loc="outside lower center", ncols=1 if len(groups) > 4 else 2, fontsize=9)
    n = sum(len(counted_runs(g["runs"])) for g in groups)
    fig.suptitle(f"{n} run{'s' * (n > 1)} in {len(groups)} group{'s' * (len(groups) > 1)} (mean over seeds)")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _curves(run_dir: str) -> dict[str, dict[int, float]]:
    """``{metric: {step: value}}`` from a run's ``metrics.jsonl`` (the training steps' rows)."""
    out = defaultdict(dict)
    path = Path(run_dir) / "metrics.jsonl"
    for line in (path.read_text().splitlines() if path.exists() else []):
        row = json.loads(line)
        if "reward/mean" in row or "loss" in row:
            for k, v in row.items():
                if isinstance(v, (int, float)) and k != "step":
                    out[k][row["step"]] = float(v)
    return out


def _mean_curve(curves: list[dict[int, float]]) -> tuple[list[int], list[float]]:
    steps = sorted(set.intersection(*(set(c) for c in curves))) if curves and all(curves) else []
    return steps, [statistics.fmean(c[s] for c in curves) for s in steps]


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results-dir", default=DEFAULT_RESULTS_DIR,
                    help="folder holding runs.jsonl (default: $RLR_RESULTS_DIR, else results/ in the project)")
    ap.add_argument("--recipe", default=None, help="only rows of this recipe")
    ap.add_argument("--last", type=int, default=0, help="only the last N rows (0 = all)")
    ap.add_argument("--csv", default=None, help="also write the comparison as CSV to this file")
    ap.add_argument("--plot", default=None, help="also draw the runs' training curves into this PNG")
    args = ap.parse_args(argv)
    rows = latest_rows(read_rows(Path(args.results_dir)))  # an extended run once
    if args.recipe:
        rows = [r for r in rows if r.get("recipe") == args.recipe]
    if args.last:
        rows = rows[-args.last:]
    if not rows:
        out = f"no finished runs in {args.results_dir}/runs.jsonl"
        print(out)
        return out
    groups = group(rows)
    columns, body = table(groups)
    out = markdown_table(body, columns)
    print(out)
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=columns)
            writer.writeheader()
            writer.writerows(body)
        print(f"CSV: {args.csv}")
    if args.plot:
        print(f"curves: {plot(groups, Path(args.plot))}")
    return out


if __name__ == "__main__":
    main()
