"""Report figures of training curves: one loop kind per figure, one panel per metric, one line per group of runs
(the mean over its seeds at each step) with a band over the seeds (± one std, or min to max), ``n`` in the legend.

Curves come from each run's ``metrics.jsonl`` (every row, so the held-out ``eval/accuracy`` rows at step 0, every
``train.eval_every`` steps and after the last step are drawn too, as points joined by a line). Smoothing is an
exponential moving average with TensorBoard's debiasing (s_t = w s_{t-1} + (1 - w) x_t, divided by 1 - w^t),
applied to each run before the mean; held-out curves (``eval/`` keys) are never smoothed.
"""
from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

from core.errors import InputError

# (panel title, y-axis label) per loop kind and metric; other metrics are named by their key (see :func:`label`).
LABELS = {
    "rl": {
        "eval/accuracy": ("held-out accuracy", "fraction correct (greedy)"),
        "accuracy": ("training accuracy", "fraction of completions correct"),
        "reward/mean": ("reward", "mean reward per completion"),
        "reward/std": ("reward spread", "std of reward per completion"),
        "length/mean": ("completion length", "tokens (mean)"),
        "length/truncated_frac": ("truncated completions", "fraction hitting max tokens"),
        "kl": ("KL to the reference", "KL estimate (nats per token)"),
        "kl/beta": ("KL coefficient", "beta"),
        "entropy": ("policy entropy", "nats per token"),
        "clip_frac": ("clipped ratios", "fraction of tokens"),
        "grad_norm": ("gradient norm", "L2 norm (before clipping)"),
        "loss": ("policy loss", "loss"),
        "lr": ("learning rate", "lr"),
    },
    "rm": {
        "eval/accuracy": ("held-out pair accuracy", "fraction of pairs ranked right"),
        "accuracy": ("training pair accuracy", "fraction of pairs ranked right"),
        "loss": ("training loss", "pairwise loss (nats)"),
        "eval/loss": ("held-out loss", "pairwise loss (nats)"),
        "margin": ("reward margin", "r(chosen) - r(rejected)"),
        "eval/margin": ("held-out reward margin", "r(chosen) - r(rejected)"),
        "grad_norm": ("gradient norm", "L2 norm (before clipping)"),
        "lr": ("learning rate", "lr"),
    },
}
# The metrics a figure draws unless ``--metrics`` names others.
DEFAULT_METRICS = {"rl": ["eval/accuracy", "accuracy", "reward/mean", "length/mean", "kl", "entropy"],
                   "rm": ["eval/accuracy", "accuracy", "loss", "eval/loss", "margin", "eval/margin"]}
# Fractions: their bands are cut to [0, 1] (mean ± std of values near 0 or 1 would leave the range).
FRACTIONS = {"eval/accuracy", "accuracy", "length/truncated_frac", "clip_frac"}
STEP_LABEL = {"rl": "RL step", "rm": "optimizer step"}
BANDS = ("std", "minmax", "none")


def label(loop: str, metric: str) -> tuple[str, str]:
    """A metric's panel title and y-axis label: :data:`LABELS`, else read from its key (``time/<phase>``
    seconds, ``rewards/<term>/mean`` a reward term's mean score, ``memory/*`` MiB), else the key itself."""
    if metric in LABELS.get(loop, {}):
        return LABELS[loop][metric]
    parts = metric.split("/")
    if parts[0] == "time":
        return f"time in {parts[-1]}", "seconds per step"
    if parts[0] == "rewards" and len(parts) == 3:
        return f"reward term {parts[1]}", f"{parts[2]} score per completion"
    if parts[0] == "memory":
        return "peak memory", "MiB"
    return metric, metric


def read_curves(run_dir: str) -> dict[str, dict[int, float]]:
    """``{metric: {step: value}}`` from every row of a run's ``metrics.jsonl`` (a later row of a step wins)."""
    out = defaultdict(dict)
    path = Path(run_dir) / "metrics.jsonl"
    for line in (path.read_text().splitlines() if path.exists() else []):
        row = json.loads(line)
        for k, v in row.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step":
                out[k][int(row["step"])] = float(v)
    return out


def ema(values: list[float], weight: float) -> list[float]:
    """Debiased exponential moving average (TensorBoard's scalar smoothing): weight 0 returns ``values``."""
    out, s = [], 0.0
    for t, x in enumerate(values, 1):
        s = weight * s + (1 - weight) * x
        out.append(s / (1 - weight ** t) if weight else x)
    return out


def seed_band(curves: list[dict[int, float]], band: str, smooth: float = 0.0):
    """Steps every curve has, the mean over the curves at each, and the band's low and high edges (mean ± std, or
    min and max; the mean itself for one curve or ``band='none'``), each curve smoothed by :func:`ema` first."""
    steps = sorted(set.intersection(*(set(c) for c in curves))) if curves and all(curves) else []
    runs = [ema([c[s] for s in steps], smooth) for c in curves]
    mean = [statistics.fmean(v) for v in zip(*runs)]
    if band == "none" or len(runs) < 2:
        return steps, mean, mean, mean
    if band == "minmax":
        return steps, mean, [min(v) for v in zip(*runs)], [max(v) for v in zip(*runs)]
    std = [statistics.stdev(v) for v in zip(*runs)]
    return steps, mean, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)]


def check_metrics(metrics: list[str], available: set[str], loop: str) -> None:
    """Refuse metrics no run of the figure logged, naming the ones they did."""
    missing = [m for m in metrics if m not in available]
    if missing:
        raise InputError(f"--metrics {','.join(missing)}: not logged by the {loop} runs shown; they log "
                         f"{', '.join(sorted(available))}")


def legend_keys(groups: list[dict], most: int = 3) -> list[str]:
    """Up to ``most`` telling keys that tell the groups apart: chosen greedily, each the key that separates the
    most pairs of groups not yet told apart (ties: fewer dots, then name)."""
    keys = sorted({k for g in groups for k in g["config"]}, key=lambda k: (k.count("."), k))
    apart: set[tuple[int, int]] = set()
    pairs = {(i, j) for i in range(len(groups)) for j in range(i + 1, len(groups))
             if (groups[i]["recipe"], groups[i].get("scale")) == (groups[j]["recipe"], groups[j].get("scale"))}

    def splits(k):
        return {(i, j) for i, j in pairs - apart if groups[i]["config"].get(k) != groups[j]["config"].get(k)}

    chosen = []
    while keys and len(chosen) < most and pairs - apart:
        best = max(keys, key=lambda k: len(splits(k)))
        if not splits(best):
            break
        apart |= splits(best)
        chosen.append(best)
        keys.remove(best)
    return chosen


def group_labels(groups: list[dict]) -> list[str]:
    """Each group's legend label: its recipe and scale where the groups' differ, the values of
    :func:`legend_keys`, and its number of seeds."""
    keys = legend_keys(groups)
    recipes, scales = len({g["recipe"] for g in groups}) > 1, len({g.get("scale") for g in groups}) > 1
    out = []
    for g in groups:
        parts = [g["recipe"]] * recipes + [f"scale={g.get('scale')}"] * scales
        parts += [f"{k}={g['config'][k]}" for k in keys if k in g["config"]]
        n = len(g["runs"])
        out.append(f"{' '.join(parts) or g['recipe']}  (n={n} seed{'s' * (n != 1)})")
    return out


def _panel(ax, groups: list[dict], curves: list[list[dict]], metric: str, band: str, smooth: float) -> list[int]:
    """Draw one metric's lines and bands; the indices of the groups that did not log it."""
    held = metric.startswith("eval/")
    missing = []
    for i, (g, runs) in enumerate(zip(groups, curves)):
        steps, mean, lo, hi = seed_band([c.get(metric, {}) for c in runs], band, 0.0 if held else smooth)
        if not steps:
            missing.append(i)
            continue
        color = f"C{i % 10}"
        if smooth and not held:  # the unsmoothed mean, faint, under its smoothed line
            ax.plot(steps, seed_band([c.get(metric, {}) for c in runs], "none")[1], color=color, lw=0.6, alpha=0.25)
        ax.plot(steps, mean, color=color, lw=1.6, marker="o" if held or len(steps) < 12 else None, ms=3.5)
        if lo != mean:
            if metric in FRACTIONS:
                lo, hi = [max(0.0, v) for v in lo], [min(1.0, v) for v in hi]
            ax.fill_between(steps, lo, hi, color=color, alpha=0.18, lw=0)
    return missing


def figure(groups: list[dict], loop: str, metrics: list[str] | None = None, band: str = "std",
           smooth: float = 0.0, title: str = ""):
    """A matplotlib figure of ``groups`` (all of loop kind ``loop``): one panel per metric (default
    :data:`DEFAULT_METRICS`; metrics no run logged are left out unless named), one line per group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    if band not in BANDS:
        raise InputError(f"--band {band}: expected one of {', '.join(BANDS)}")
    if not 0.0 <= smooth < 1.0:
        raise InputError(f"--smooth {smooth}: expected an EMA weight in [0, 1), e.g. 0.6")
    curves = [[read_curves(r["run_dir"]) for r in g["runs"]] for g in groups]
    logged = {k for runs in curves for c in runs for k in c}
    if metrics:
        check_metrics(metrics, logged, loop)
    metrics = metrics or [m for m in DEFAULT_METRICS.get(loop, []) if m in logged]
    if not metrics:
        raise InputError(f"the {loop} runs shown logged none of the default metrics; name some with --metrics "
                         f"(they log {', '.join(sorted(logged)) or 'nothing: no metrics.jsonl'})")
    ncols = {1: 1, 2: 2, 4: 2}.get(len(metrics), 3)  # no empty panel for 4
    nrows = -(-len(metrics) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.1 * nrows + 0.9), constrained_layout=True,
                             squeeze=False)
    labels = group_labels(groups)
    for k, (ax, metric) in enumerate(zip(axes.flat, metrics)):
        missing = _panel(ax, groups, curves, metric, band, smooth)
        if missing:  # say so, rather than leave a reader to look for the line (kl with kl.coef=0: no reference)
            ax.text(0.98, 0.02, "not logged: " + "; ".join(labels[i].split("  (n=")[0] for i in missing),
                    transform=ax.transAxes, ha="right", va="bottom", fontsize=7, color="0.35")
        name, ylabel = label(loop, metric)
        ax.set_title(name, fontsize=10)
        ax.set_ylabel(ylabel, fontsize=9)
        if k + ncols >= len(metrics):  # the lowest panel of its column
            ax.set_xlabel(STEP_LABEL.get(loop, "step"), fontsize=9)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(metrics):]:
        ax.set_visible(False)
    handles = [Line2D([], [], color=f"C{i % 10}", lw=2) for i in range(len(groups))]
    if band != "none" and any(len(g["runs"]) > 1 for g in groups):
        handles.append(Patch(color="0.5", alpha=0.3))
        labels.append("mean ± 1 std over seeds" if band == "std" else "min to max over seeds")
    if smooth:
        handles.append(Line2D([], [], color="0.5", lw=0.7, alpha=0.5))
        labels.append(f"unsmoothed mean (bold: EMA {smooth:g}; held-out never smoothed)")
    fig.legend(handles, labels, loc="outside lower center", ncols=min(3, len(labels)), fontsize=8.5, frameon=False)
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


def save_figure(fig, out: Path) -> Path:
    """Write ``fig`` as a PNG (200 dpi) and close it."""
    import matplotlib.pyplot as plt

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=200)
    plt.close(fig)
    return out
