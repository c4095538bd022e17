"""``python -m recipes.plan recipe=NAME [hardware=NAME] [overrides] [--json] [--plot PATH]``: will a recipe fit, how
long will a step and the run take, and what to change, before a GPU-hour is spent (docs/planner.md).

Memory per GPU: the real-shape probe (``recipes.probe``: the project's own code on fake tensors at the recipe's
shapes) broken down into weights, gradients, optimiser states (ZeRO stage and offload), LoRA, critic, reference,
activations per phase, the vLLM reservation and the KV cache it leaves, framework overhead (core/planning/memory.py);
a verdict, and when the plan does not fit or is tight, each knob the recipe can take re-probed and ranked by the
memory it gives (core/planning/knobs.py). Time per step and for the run: core/planning/step_time.py. Every
assumption is printed with its value and where it comes from.

``hardware=NAME`` picks a profile of conf/hardware/ (default: the recipe's source's GPUs). ``--json``: the plan as
JSON (top level ``fits``, ``per_gpu_gib``, ``step_seconds``, ``run_hours``, ``memory``, ``knobs``, ``time``,
``probe``: the probe's per-GPU peak and per-phase peaks in bytes, ``assumptions``). ``--plot PATH``: a PNG of the per-GPU memory breakdown and the step-time breakdown.
Refused before any model is built, naming the key: an unknown recipe or hardware profile, a model whose config is
not known here, a layout the hardware cannot hold.
"""
from __future__ import annotations

import contextlib
import json
import sys

from core.errors import InputError, tool_main
from core.planning.states import GiB


def plan(overrides: list[str], knobs: bool | None = None) -> dict:
    """The plan of ``overrides`` (a recipe and any keys) as a JSON-ready dict. ``knobs``: measure the knobs
    (default: only when the plan does not fit or is tight)."""
    from core.planning import checks, memory
    from core.planning.knobs import ranked
    from core.planning.step_time import estimate

    prepared, report = measured(overrides)
    cfg, run = prepared.config, prepared.plan
    mem = memory.breakdown(cfg, run, report)
    t = estimate(cfg, run, report)
    out = {"recipe": cfg.recipe_name, "hardware": {**report["hardware"], "profile": checks.hardware_choice(cfg)},
           "model": cfg.model.name_or_path, "fits": mem["fits"], "verdict": mem["verdict"],
           "per_gpu_gib": mem["per_gpu_bytes"] / GiB, "step_seconds": t.step_seconds, "run_hours": t.run_hours,
           "probe_peak_bytes": report["per_gpu_bytes"],
           "memory": mem, "probe_seconds": report["probe_seconds"],
           # the probe's own figures: what torch's allocator reports at each phase's peak (no overheads added)
           "probe": {"per_gpu_bytes": report["per_gpu_bytes"],
                     "phases": {n: p["peak_bytes"] for n, p in report["phases"].items()}},
           "time": {"phases": t.phases, "steps": t.steps, "step_seconds": t.step_seconds, "run_hours": t.run_hours},
           "assumptions": memory.assumptions(cfg) + [list(a) for a in t.assumptions]}
    if knobs or (knobs is None and mem["verdict"] != "fits"):
        out["knobs"] = ranked(cfg, overrides, lambda o: _memory(*measured(o)))
    return out


def measured(overrides: list[str]):
    """``(prepared config, probe report)`` of ``overrides``, the plan's checks passed before any model is built."""
    from core.planning.checks import check
    from recipes.probe import prepared_config, probe_prepared

    prepared = prepared_config(overrides)
    check(prepared.config, prepared.plan)
    return prepared, probe_prepared(prepared)


def _memory(prepared, report) -> dict:
    from core.planning.memory import breakdown

    return breakdown(prepared.config, prepared.plan, report)


def main(argv: list[str]) -> None:
    tool_main(_report, argv, __doc__)


def _report(argv: list[str]) -> None:
    """The plan's text (``--json``: the plan as JSON) on stdout; ``--plot PATH`` writes the figure."""
    from core.planning.render import lines, plot

    args, path = list(argv), None
    if "--plot" in args:
        i = args.index("--plot")
        if i + 1 >= len(args) or "=" in args[i + 1]:
            raise InputError("--plot: expected a PNG path after it (--plot plan.png)")
        path = args.pop(i + 1)
        args.pop(i)
    as_json = "--json" in args
    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed logs to stdout on import; stdout is the plan's
        result = plan([a for a in args if a != "--json"])
        if path:
            plot(result, path)
    print(json.dumps(result, indent=1, default=str) if as_json else "\n".join(lines(result)))


if __name__ == "__main__":
    main(sys.argv[1:])
