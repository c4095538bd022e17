"""Finished runs side by side: groups of runs that differ only in their seed, and the tables of their results.

A group is one (recipe, scale, values of the keys that tell its runs apart). Those keys are the overrides typed on
the runs' command lines (``overrides`` in each row) whose values differ between the runs shown, plus any key of the
saved ``config.yaml`` that still differs between runs of one group (a recipe file edited between them); keys a
scale changes count through the ``scale`` column, and the seed, paths, devices and logging never count. A group
holds one run per seed, its latest (file order): a rerun with the same config and seed replaces the earlier run
instead of posing as a second seed. A run's evaluations (``kind: eval`` rows, recipes/eval.py) join its group, one
value per evaluated run and evaluation settings (:data:`core.reporting.results.EVAL_SETTINGS`), so two evaluations
with different settings are two rows of the evaluation table, never one pooled cell.
"""
from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

import yaml

from core.reporting.results import latest_rows

# Config keys that never make two runs different experiments (the scale is its own column).
IGNORED = ("seed", "resume", "resume_allow_changes", "device", "cpu_threads", "paths.", "logger.", "hydra.",
           "recipe_name", "recipe", "loop", "scale", "scale.", "run_dir", "model.init_seed")
# Training results in this order (other numbers in the rows follow, by name).
RESULTS = ["eval_before", "eval_after", "eval_best", "best_step", "train_seconds", "steps"]
# Row fields that are not results.
NOT_RESULTS = {"seed", "finished"}
# The loops' names in titles.
LOOPS = {"rl": "RL runs", "rm": "reward-model runs"}


def _ignored(key: str) -> bool:
    return any(key == i or (i.endswith(".") and key.startswith(i)) for i in IGNORED)


def _flat(node, prefix: str = "") -> dict:
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: json.dumps(node, sort_keys=True) if isinstance(node, (list, dict)) else node}


def run_info(run_dir: str) -> dict:
    """What a run dir says of its run: ``config`` (its flat ``config.yaml`` less the keys that never count),
    ``choices`` (Hydra's group choices, ``.hydra/hydra.yaml``), ``loop`` (rl or rm), ``scale`` and ``sweep``
    (the multirun's dir for a job of one, else the run dir itself). Read once per version of ``config.yaml``."""
    config = Path(run_dir or ".") / "config.yaml"
    return _run_info(run_dir, config.stat().st_mtime_ns if config.exists() else 0)


@lru_cache(maxsize=None)
def _run_info(run_dir: str, _version: int) -> dict:
    path = Path(run_dir or ".")
    raw = yaml.safe_load((path / "config.yaml").read_text()) if (path / "config.yaml").exists() else {}
    hydra_file = path / ".hydra" / "hydra.yaml"
    hydra = (yaml.safe_load(hydra_file.read_text()) or {}).get("hydra", {}) if hydra_file.exists() else {}
    flat = _flat(raw or {})
    return {"config": {k: v for k, v in flat.items() if not _ignored(k)},
            "choices": dict((hydra.get("runtime") or {}).get("choices") or {}),
            "loop": flat.get("loop"), "scale": flat.get("scale.name"),
            "sweep": str(path.parent if hydra.get("mode") == "MULTIRUN" else path)}


def override_keys(row: dict) -> set[str]:
    """The keys set on a row's command line (``+``/``~`` prefixes dropped), less those that never count."""
    keys = set()
    for o in row.get("overrides") or []:
        if "=" in o:
            key = o.split("=", 1)[0].lstrip("+~")
            if not _ignored(key):
                keys.add(key)
    return keys


def _value(info: dict, key: str):
    return info["config"].get(key, info["choices"].get(key))


def _differing(keys, members) -> list[str]:
    return [k for k in sorted(keys) if len({json.dumps(_value(i, k), default=str) for _, i in members}) > 1]


def telling_keys(members: list[tuple[dict, dict]]) -> list[str]:
    """The keys that tell ``members`` (rows of one recipe, each with its :func:`run_info`) apart: the overrides
    whose values differ, then config keys every run has that still differ between runs of one scale alike in
    those (a recipe file edited between runs). Keys a scale changes count through the scale."""
    keys = _differing(set().union(*(override_keys(r) for r, _ in members)), members)
    buckets = defaultdict(list)
    for r, i in members:
        buckets[(_scale(r, i), *(json.dumps(_value(i, k), default=str) for k in keys))].append((r, i))
    common = set.intersection(*(set(i["config"]) for _, i in members)) - set(keys)
    extra = sorted({k for b in buckets.values() for k in _differing(common, b)})
    return keys + extra


def _scale(row: dict, info: dict):
    return row.get("scale") or info["scale"]


def group(rows: list[dict]) -> list[dict]:
    """The groups of the table's latest rows (:func:`core.reporting.results.latest_rows`), in order of first
    appearance: ``recipe``, ``loop``, ``scale``, ``config`` (the telling keys' values), ``runs`` (one training row
    per seed, the latest), ``reruns`` (earlier runs of a config and seed, not counted), ``evals`` (the runs'
    evaluation rows) and ``seeds``. Evaluations of a model outside any run form groups of their own."""
    rows = latest_rows(rows)
    groups = _training_groups([r for r in rows if r.get("kind") != "eval"])
    by_run = {r.get("run_dir"): g for g in groups.values() for r in g["by_seed"].values()}
    replaced = {r.get("run_dir") for g in groups.values() for r in g["reruns"]}
    for r in rows:
        if r.get("kind") == "eval" and r.get("run_dir") not in replaced:  # a replaced run's evaluations go with it
            g = by_run.get(r.get("run_dir")) or groups.setdefault(("eval", r.get("model")), {
                "recipe": r.get("recipe"), "loop": None, "scale": None, "config": {}, "by_seed": {},
                "reruns": [], "evals": []})
            g["evals"].append(r)
    out = []
    for g in groups.values():
        runs = list(g.pop("by_seed").values())
        out.append({**g, "runs": runs, "seeds": sorted((r.get("seed") for r in runs), key=str)})
    return out


def _training_groups(rows: list[dict]) -> dict:
    """Training rows by (recipe, scale, telling keys' values), each group's runs by seed (the latest wins)."""
    recipes = defaultdict(list)
    for r in rows:
        recipes[r.get("recipe")].append((r, run_info(r.get("run_dir", ""))))
    groups = {}
    for recipe, members in recipes.items():
        keys = telling_keys(members)
        for r, info in members:
            config, scale = {k: _value(info, k) for k in keys}, _scale(r, info)
            g = groups.setdefault((recipe, scale, json.dumps(config, default=str)), {
                "recipe": recipe, "loop": info["loop"], "scale": scale, "config": config, "by_seed": {},
                "reruns": [], "evals": []})
            if r.get("seed") in g["by_seed"]:
                g["reruns"].append(g["by_seed"][r.get("seed")])
            g["by_seed"][r.get("seed")] = r
    return groups


def stats(values: list[float]) -> dict:
    """``n``, ``mean``, ``std`` (sample std; None for one value), ``min`` and ``max`` of ``values``."""
    if not values:
        return {"n": 0, "mean": None, "std": None, "min": None, "max": None}
    return {"n": len(values), "mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else None, "min": min(values), "max": max(values)}


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def result_keys(groups: list[dict]) -> list[str]:
    have = {k for g in groups for r in g["runs"] for k, v in r.items() if _number(v) and k not in NOT_RESULTS}
    return [k for k in RESULTS if k in have] + sorted(have - set(RESULTS))


def sampling(r: dict) -> str:
    """An evaluation's sampling in a few words: ``greedy`` or temperature, top-p and samples per problem."""
    if r.get("greedy"):
        return "greedy"
    return f"T={r.get('temperature'):g} top_p={r.get('top_p'):g} x{r.get('samples')}"


def eval_results(g: dict) -> list[dict]:
    """A group's evaluation results: one per evaluation settings (preset, set, metric, problems, max tokens,
    sampling, verifier), each over the group's runs, one value per run (the run's latest such evaluation)."""
    by_settings = defaultdict(list)
    for r in g["evals"]:
        settings = {"preset": r.get("preset"), "set": r.get("set"), "result": r.get("metric"),
                    "problems": r.get("problems"), "max_new_tokens": r.get("max_new_tokens"),
                    "sampling": sampling(r), "verifier": r.get("verifier")}
        by_settings[json.dumps(settings, default=str)].append(r)
    return [{**json.loads(k), "seeds": " ".join(str(r.get("seed")) for r in rs if r.get("seed") is not None),
             **stats([float(r["value"]) for r in rs if _number(r.get("value"))])} for k, rs in by_settings.items()]


def records(groups: list[dict]) -> tuple[list[str], list[dict]]:
    """The comparison as tidy records, one per (group, result), every number its own column: ``loop``,
    ``recipe``, ``scale``, the telling keys, ``result`` (a training row's field, or an evaluation's metric),
    the evaluation's ``preset``, ``set``, ``problems``, ``max_new_tokens``, ``sampling`` (blank for a training
    result), then ``n``, ``seeds``, ``mean``, ``std``, ``min``, ``max``."""
    keys = sorted({k for g in groups for k in g["config"]})
    columns = ["loop", "recipe", "scale", *keys, "result", "preset", "set", "problems", "max_new_tokens", "sampling",
               "n", "seeds", "mean", "std", "min", "max"]
    out = []
    for g in groups:
        head = {"loop": g["loop"] or "", "recipe": g["recipe"], "scale": g["scale"] or "",
                **{k: g["config"].get(k, "") for k in keys}}
        for k in result_keys([g]):
            values = [float(r[k]) for r in g["runs"] if _number(r.get(k))]
            out.append({**head, "result": k, "seeds": " ".join(str(r.get("seed")) for r in g["runs"]
                                                                if _number(r.get(k))), **stats(values)})
        for e in eval_results(g):
            out.append({**head, **{c: e[c] for c in e if c != "verifier"}})
    return columns, out


def cell(s: dict, n: int) -> str:
    """``mean ± std`` of a :func:`stats` (the mean alone for one value), with its n where it is not ``n``."""
    if not s["n"]:
        return ""
    text = f"{s['mean']:.4g}" + (f" ± {s['std']:.2g}" if s["std"] is not None else "")
    return text + (f" (n={s['n']})" if s["n"] != n else "")


def markdown(groups: list[dict]) -> str:
    """The comparison as markdown: a table of training results per loop kind (one row per group: the telling
    keys, ``n`` runs and their seeds, then ``mean ± std`` over them), then one of evaluations (one row per group
    and evaluation settings)."""
    from core.reporting.results import markdown_table

    parts = []
    for loop in dict.fromkeys(g["loop"] for g in groups if g["runs"]):
        gs = [g for g in groups if g["runs"] and g["loop"] == loop]
        keys, results = sorted({k for g in gs for k in g["config"]}), result_keys(gs)
        body = []
        for g in gs:
            n = len(g["runs"])
            body.append({"recipe": g["recipe"], "scale": g["scale"], **g["config"], "n": n,
                         "seeds": " ".join(str(s) for s in g["seeds"]),
                         **{k: cell(stats([float(r[k]) for r in g["runs"] if _number(r.get(k))]), n)
                            for k in results}})
        parts.append(f"{LOOPS.get(loop, 'runs')}:\n\n" + markdown_table(body, ["recipe", "scale", *keys, "n", "seeds",
                                                                              *results]))
    evaluated = [g for g in groups if g["evals"]]
    if evaluated:
        keys = sorted({k for g in evaluated for k in g["config"]})
        body = [{"recipe": g["recipe"], "scale": g["scale"], **g["config"], **e, "metric": e["result"],
                 "max tokens": e["max_new_tokens"], "value": cell(e, e["n"])}
                for g in evaluated for e in eval_results(g)]
        parts.append("evaluations (one value per run and settings):\n\n" + markdown_table(
            body, ["recipe", "scale", *keys, "preset", "set", "metric", "problems", "max tokens", "sampling", "n",
                   "seeds", "value"]))
    return "\n\n".join(parts)
