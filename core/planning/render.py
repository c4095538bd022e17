"""A plan (``recipes.plan``'s dict) as text and as a figure: the per-GPU memory breakdown per phase, the verdict, the
vLLM KV cache, the knobs ranked, the step-time breakdown and every assumption."""
from __future__ import annotations

from core.planning.memory import ORDER
from core.planning.states import GiB


def _gib(b: float) -> str:
    return f"{b / GiB:.1f}"


def lines(plan: dict) -> list[str]:
    """The plan as a short report: memory table, verdict, KV cache, overhead, knobs, time, assumptions."""
    hw, mem = plan["hardware"], plan["memory"]
    out = [f"plan {plan['recipe']}: {plan['model'] or 'tiny model'} on {hw['gpus']} x {hw['name']} "
           f"({hw['memory_gib']:.2f} GiB each; hardware={hw['profile']}), probed in {plan['probe_seconds']} s",
           "", "memory per GPU, GiB"]
    out += _memory_table(mem)
    out.append(_verdict(plan))
    out += _kv_lines(mem["kv_cache"])
    out += ["overhead, GiB per GPU:"] + [f"  {o['name']} {_gib(o['bytes'])}: {o['why']}" for o in mem["overhead"]]
    if "knobs" in plan:
        out += ["", "knobs, each re-probed alone (per GPU, lowest first):"] + [_knob(k) for k in plan["knobs"]]
    out += ["", *_time_lines(plan), "", "assumptions:"]
    out += [f"  {name} = {value}  ({where})" for name, value, where in plan["assumptions"]]
    return out


def _memory_table(mem: dict) -> list[str]:
    names = list(mem["phases"])
    out = [f"  {'part':<14}" + "".join(f"{n:>10}" for n in names)]
    for part in ORDER:
        row = [mem["phases"][n][part] for n in names]
        if any(row):
            out.append(f"  {part:<14}" + "".join(f"{_gib(b):>10}" for b in row))
    out.append(f"  {'total':<14}" + "".join(f"{_gib(mem['totals'][n]):>10}" for n in names))
    return out


def _verdict(plan: dict) -> str:
    mem, card = plan["memory"], plan["hardware"]["memory_gib"]
    where = f"{plan['per_gpu_gib']:.1f} GiB per GPU at {mem['peak_phase']} of {card:.2f}"
    if mem["verdict"] == "does not fit":
        kv = mem["kv_cache"]
        if mem["short_bytes"] == 0 and kv is not None:
            return f"verdict: does NOT fit: vLLM's reservation leaves {_gib(kv['kv_bytes'])} GiB for KV cache ({where})"
        return f"verdict: does NOT fit, short by {_gib(mem['short_bytes'])} GiB ({where})"
    return f"verdict: {mem['verdict']}, {_gib(mem['headroom_bytes'])} GiB free ({where})"


def _kv_lines(kv: dict | None) -> list[str]:
    if kv is None:
        return []
    wanted = kv["sequences_wanted"]
    out = [f"vLLM on the {kv['where']}, {kv['engines']} engine(s) of TP {kv['tp']}: reservation "
           f"{_gib(kv['reservation_bytes'])} GiB per GPU = weights {_gib(kv['weights_bytes'])} + profile activations "
           f"{_gib(kv['activation_bytes'])} + CUDA graphs {_gib(kv['cuda_graph_bytes'])} + KV cache "
           f"{_gib(kv['kv_bytes'])}",
           f"  KV {kv['kv_bytes_per_token'] / 1024:.0f} KiB per token (2 x layers x kv_heads x head_dim x dtype "
           f"bytes; {kv['kv_bytes_per_token_per_gpu'] / 1024:.0f} KiB per GPU): {kv['sequences']} sequences of "
           f"{kv['tokens_per_sequence']} tokens per engine; a step runs up to {wanted} at once"]
    if kv["fraction_of"] == "free":
        left = kv["free_at_start_bytes"] - kv["weights_bytes"] - kv["activation_bytes"]
        out.append(f"  KV cache = {kv['fraction']} x the {_gib(left)} GiB free once the trainer's states at the engine's "
                   f"start ({_gib(kv['free_at_start_bytes'])} GiB free then), its weights and its profile run are in "
                   f"(gpu_memory_utilization_of=free, veRL 0.2's worker)")
    if kv["sequences"] < wanted:
        out.append("  fewer than the step runs at once: vLLM queues or preempts the rest (slower, not out of memory)")
    return out


def _knob(k: dict) -> str:
    head = f"  {k['knob']:<22} {' '.join(k['overrides']):<60}"
    if "refused" in k:
        return f"{head} refused: {k['refused']}"
    kv = "" if k["kv_sequences"] is None else f", KV {k['kv_sequences']} seqs/engine"
    return f"{head} {_gib(k['per_gpu_bytes']):>6} GiB ({k['verdict']} at {k['peak_phase']}{kv})"


def _time_lines(plan: dict) -> list[str]:
    t = plan["time"]
    out = ["time per step, s: " + ", ".join(f"{n} {s:.1f}" for n, s in t["phases"].items() if s)
           + f"; step {t['step_seconds']:.1f} s"]
    if t["run_hours"] is None:
        out.append("run: steps unknown (no total_steps and no published row count)")
    else:
        out.append(f"run: {t['steps']} steps, {t['run_hours']:.1f} h")
    return out


def plot(plan: dict, path: str) -> None:
    """A PNG at ``path``: per phase, the per-GPU memory stacked by part against the card; the step's seconds by
    phase."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mem, t = plan["memory"], plan["time"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5))
    names = list(mem["phases"])
    bottom = [0.0] * len(names)
    for part in ORDER:
        values = [mem["phases"][n][part] / GiB for n in names]
        if any(values):
            left.bar(names, values, bottom=bottom, label=part)
            bottom = [b + v for b, v in zip(bottom, values)]
    left.axhline(plan["hardware"]["memory_gib"], color="k", ls="--", label=f"{plan['hardware']['name']}")
    left.set(ylabel="GiB per GPU", title=f"{plan['recipe']}: memory per GPU ({mem['verdict']})")
    left.legend(fontsize=7, loc="upper left")
    phases = {n: s for n, s in t["phases"].items() if s}
    right.barh(list(phases), list(phases.values()))
    right.set(xlabel="seconds per step", title=f"step {t['step_seconds']:.1f} s"
              + ("" if t["run_hours"] is None else f", run {t['run_hours']:.1f} h"))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
