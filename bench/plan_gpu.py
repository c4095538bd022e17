"""``python -m bench.plan_gpu [PATH] [--reports DIR [--write]]``: ``recipes.plan``'s seconds per phase and
``recipes.probe``'s per-GPU peak beside what a GPU measured for the same configs (``bench/gpu_measured.json``: the H200
run of issue 36; ``make gpu-check`` writes its successor in the same schema, docs/planner.md "Calibration on a GPU").

The probe's peak is what ``torch.cuda.max_memory_allocated`` reports (a run's ``memory/peak_mb``); the plan's total
adds what the allocator does not see (CUDA context, NCCL buffers, fragmentation: core/planning/memory.py
``overhead``). tests/planning/test_gpu_calibration.py holds every phase within 25% and the peak within 10%, never
under. ``--reports DIR`` reads the probe's reports of the runs from DIR (``--write``: probes and writes them; a run
whose stored report was probed with other overrides is probed again), as bench/plan_calibration.py does.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from core.errors import InputError

MEASURED = Path(__file__).with_name("gpu_measured.json")
MiB = 2 ** 20
KEYS = ("schema", "date", "device", "versions", "predict_overrides", "runs")
RUN_KEYS = ("name", "overrides", "seconds", "peak_allocated_mib")


def load(path: Path = MEASURED) -> dict:
    """The measurements at ``path``, their keys checked (the file and the key named when one is missing)."""
    data = json.loads(Path(path).read_text())
    missing = [k for k in KEYS if k not in data]
    missing += [f"runs[{i}].{k}" for i, r in enumerate(data.get("runs", [])) if isinstance(r, dict)
                for k in RUN_KEYS if k not in r]
    if missing or data.get("schema") != 1 or not data.get("runs"):
        raise InputError(f"{path}: expected schema 1 with {', '.join(KEYS)} and runs holding {', '.join(RUN_KEYS)}; "
                         f"missing {', '.join(missing) or 'none'}, schema {data.get('schema')!r}, "
                         f"{len(data.get('runs') or [])} runs")
    return data


def overrides(data: dict, run: dict) -> list[str]:
    """What the planner is given for ``run``: the file's ``predict_overrides``, then the run's own."""
    return [*data["predict_overrides"], *run["overrides"]]


def report_of(data: dict, run: dict, reports: Path | None = None, write: bool = False) -> dict:
    """The probe's report of ``run``: stored in ``reports`` when it was probed with the same overrides (and not
    ``write``), else probed (and stored when ``write``)."""
    from recipes.probe import probe

    path, given = None if reports is None else reports / f"{run['name']}.json", overrides(data, run)
    if path is not None and path.exists() and not write:
        stored = json.loads(path.read_text())
        if stored.get("overrides") == given:
            return stored
    report = {**probe(given), "overrides": given}
    report.pop("probe_seconds", None)  # varies run to run
    if path is not None and write:
        path.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    return report


def predict(data: dict, run: dict, reports: Path | None = None, write: bool = False) -> dict:
    """What ``recipes.plan`` says of ``run``: seconds per phase, the probe's per-GPU peak (allocated) and the plan's
    per-GPU total, in bytes (the same functions: core/planning/memory.py ``breakdown``, step_time.py ``estimate``)."""
    from core.planning.checks import check
    from core.planning.memory import breakdown
    from core.planning.step_time import estimate
    from recipes.probe import prepared_config

    prepared = prepared_config(overrides(data, run))
    check(prepared.config, prepared.plan)
    report = report_of(data, run, reports, write)
    t = estimate(prepared.config, prepared.plan, report)
    return {"seconds": t.phases, "probe_peak_bytes": report["per_gpu_bytes"],
            "plan_total_bytes": breakdown(prepared.config, prepared.plan, report)["per_gpu_bytes"]}


def rows(data: dict, reports: Path | None = None, write: bool = False) -> list[dict]:
    """One row per measured figure: the run, the figure (a phase, or ``peak``), measured, predicted, their ratio."""
    out = []
    for run in data["runs"]:
        p = predict(data, run, reports, write)
        for phase, seconds in run["seconds"].items():
            out.append({"run": run["name"], "figure": phase, "unit": "s", "measured": float(seconds),
                        "predicted": float(p["seconds"][phase])})
        out.append({"run": run["name"], "figure": "peak", "unit": "GiB",
                    "measured": run["peak_allocated_mib"] / 1024, "predicted": p["probe_peak_bytes"] / 2 ** 30,
                    "plan_total": p["plan_total_bytes"] / 2 ** 30})
    for r in out:
        r["ratio"] = r["predicted"] / r["measured"]
    return out


def table(data: dict, result: list[dict]) -> list[str]:
    """``rows`` as a markdown table under a line naming the device, date and versions."""
    v = ", ".join(f"{k} {val}" for k, val in data["versions"].items())
    out = [f"{data['device']['name']} x {data['device']['gpus']}, {data['date']} ({v})", "",
           "| run | figure | measured | predicted | predicted / measured | plan's total |", "|---|---|---|---|---|---|"]
    for r in result:
        total = f"{r['plan_total']:.2f} GiB" if "plan_total" in r else ""
        fmt = ".2f" if r["unit"] == "GiB" else ".3g"
        out.append(f"| {r['run']} | {r['figure']} | {r['measured']:{fmt}} {r['unit']} | {r['predicted']:{fmt}} "
                   f"{r['unit']} | {r['ratio']:.2f} | {total} |")
    return out


def main(argv: list[str]) -> None:
    from core.errors import tool_main

    tool_main(_report, argv, __doc__)


def _report(argv: list[str]) -> None:
    import contextlib

    args = list(argv)
    reports = None
    if "--reports" in args:
        i = args.index("--reports")
        if i + 1 >= len(args):
            raise InputError("--reports: expected a folder after it (--reports tests/planning/reports/gpu)")
        reports = Path(args.pop(i + 1))
        args.pop(i)
    write = "--write" in args
    paths = [a for a in args if a != "--write"]
    data = load(Path(paths[0]) if paths else MEASURED)
    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed logs to stdout on import
        result = rows(data, reports, write)
    print("\n".join(table(data, result)))


if __name__ == "__main__":
    main(sys.argv[1:])
