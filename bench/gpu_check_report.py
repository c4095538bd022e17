"""``make gpu-check``'s record (bench/gpu_check.py): the machine, the packages and the commit it ran on, then
``gpu_check.json`` and ``gpu_check.md``, both rewritten whole (write, then rename) after every part. The JSON's schema
is in docs/performance.md ("GPU check").
"""
from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path

from core.paths import PROJECT_ROOT

SCHEMA = "gpu_check/1"
PHASES = ("generate", "logprobs", "update", "score")  # the planner's names (core/planning/step_time.py)
# distributions whose versions decide what a GPU run measures; absent ones are recorded as null
PACKAGES = ("torch", "transformers", "trl", "deepspeed", "datasets", "accelerate", "peft", "vllm", "flash-attn")
COMMIT_STAMP = PROJECT_ROOT / ".gpu-kit" / "commit"  # where no git checkout travels (docs/performance.md)
GiB = 2 ** 30
CALIBRATION = "gpu_measured.json"  # the planner's calibration file (bench/plan_gpu.py), written beside the record


def environment(device: str) -> dict:
    """The device, the package versions, the commit and the date of this run."""
    import torch

    versions = {"python": platform.python_version(), "cuda": torch.version.cuda}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {"device": device_info(device), "versions": versions, "commit": commit(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def device_info(device: str) -> dict:
    """``nvidia-smi``'s name, total memory (MiB) and driver of the first GPU; torch's where it cannot be run;
    the CPU's model, cores and memory for ``device=cpu``."""
    if not device.startswith("cuda"):
        info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
        name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
                    platform.processor())
        return {"kind": "cpu", "name": name, "count": os.cpu_count(), "memory_mib": _meminfo_mib(), "driver": None}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=60, check=True)
        rows = [[x.strip() for x in line.split(",")] for line in out.stdout.strip().splitlines()]
        return {"kind": "cuda", "name": rows[0][0], "memory_mib": int(float(rows[0][1])), "driver": rows[0][2],
                "count": len(rows)}
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
        import torch

        props = torch.cuda.get_device_properties(0)
        return {"kind": "cuda", "name": props.name, "memory_mib": props.total_memory // 2 ** 20, "driver": None,
                "count": torch.cuda.device_count(), "note": f"nvidia-smi: {e}"}


def _meminfo_mib() -> int | None:
    path = Path("/proc/meminfo")
    if not path.exists():
        return None
    total = next(line for line in path.read_text().splitlines() if line.startswith("MemTotal:"))
    return int(total.split()[1]) // 1024  # kB


def commit() -> dict:
    """The checked-out commit (and whether tracked files differ from it); where there is no git checkout (the GPU
    machines get the working tree alone), the one ``.gpu-kit/commit`` names."""
    try:
        git = ["git", "-C", str(PROJECT_ROOT)]
        sha = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        status = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                text=True, check=True).stdout
        return {"sha": sha, "dirty": bool(status.strip()), "source": "git"}
    except (OSError, subprocess.SubprocessError):
        pass
    if COMMIT_STAMP.exists():
        return {"sha": COMMIT_STAMP.read_text().strip(), "dirty": None, "source": ".gpu-kit/commit"}
    return {"sha": None, "dirty": None, "source": "none: no git checkout and no .gpu-kit/commit"}


class Report:
    """The run's record: ``meta`` (environment, mode, sizes), each part's status and result, and per config its
    overrides, measured and predicted figures. :meth:`save` writes both files."""

    def __init__(self, out: Path, meta: dict, parts: dict[str, float], configs: dict[str, dict]):
        self.out = out
        self.data = {"schema": SCHEMA, **meta,
                     "parts": {name: {"status": "pending", "budget_s": budget} for name, budget in parts.items()},
                     "configs": {name: {**c, "measured": None, "predicted": None, "ratios": {}}
                                 for name, c in configs.items()}}

    @property
    def parts(self) -> dict:
        return self.data["parts"]

    @property
    def configs(self) -> dict:
        return self.data["configs"]

    def save(self) -> None:
        for c in self.configs.values():
            c["ratios"] = ratios(c)
        self.out.mkdir(parents=True, exist_ok=True)
        _write(self.out / "gpu_check.json", json.dumps(_finite(self.data), indent=1) + "\n")
        _write(self.out / "gpu_check.md", "\n".join(markdown(self.data)) + "\n")
        _write(self.out / CALIBRATION, json.dumps(_finite(calibration(self.data)), indent=1) + "\n")


def calibration(d: dict) -> dict:
    """The measured runs in the planner's calibration schema (bench/plan_gpu.py ``load``; docs/planner.md
    "Calibration on a GPU"): what replaces bench/gpu_measured.json after a GPU run, so
    tests/planning/test_gpu_calibration.py holds the planner to the newest measurements. Only the RL runs of
    ``recipes.run`` (the ZeRO modes, the long completions): bench trl's side times its own loop. Each run's overrides
    are what it ran with; ``predict_overrides`` what the planner needs beside them (the device's profile, the prompt
    cap), as the ``predictions`` part gave them."""
    runs = [{"name": name, "command": f"make gpu-check (bench/gpu_check.py), part {c['part']}",
             "overrides": c["overrides"], "steps": f"median of {m['steps']} step(s) from step {m['first_step']}",
             "seconds": {ph: round(sec, 4) for ph, sec in m["phase_seconds"].items()},
             "peak_allocated_mib": round(m["peak_bytes"] / 2 ** 20), "notes": {"peak_allocated_mib": m["peak_source"]}}
            for name, c in d["configs"].items() if c["part"] != "trl" and (m := c.get("measured"))]
    keys = next((c["prediction_overrides"] for c in d["configs"].values() if c.get("prediction_overrides")), [])
    dev = d["device"]
    return {"schema": 1, "about": "written by make gpu-check (bench/gpu_check_report.py calibration)",
            "source": f"make gpu-check, mode {d['mode']}", "date": d["date"][:10],
            "device": {"name": dev["name"], "gpus": 1, "memory_mib": dev.get("memory_mib"), "driver": dev.get("driver")},
            "versions": {k: v for k, v in d["versions"].items() if v is not None}, "commit": d["commit"]["sha"],
            "predict_overrides": keys, "runs": runs}


def _write(path: Path, text: str) -> None:
    """``text`` into ``path`` whole or not at all: a kill mid-write leaves the previous version."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _finite(obj):
    """NaN and infinities as null: JSON has no such numbers."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def ratios(c: dict) -> dict:
    """Predicted / measured per phase, per step, and for the peak (the probe's and the plan's); only where both
    are known."""
    m, p = c.get("measured") or {}, c.get("predicted") or {}
    plan, probe = p.get("plan") or {}, p.get("probe") or {}
    pairs = {ph: (plan.get("phase_seconds", {}).get(ph), m.get("phase_seconds", {}).get(ph)) for ph in PHASES}
    pairs["step"] = (plan.get("step_seconds"), m.get("step_seconds"))
    pairs["probe_peak"] = (probe.get("peak_bytes"), m.get("peak_bytes"))
    pairs["plan_peak"] = (plan.get("per_gpu_bytes"), m.get("peak_bytes"))
    return {k: a / b for k, (a, b) in pairs.items() if a is not None and b}


# ----------------------------------------------------------------------------- markdown
def markdown(d: dict) -> list[str]:
    dev, v, c = d["device"], d["versions"], d["commit"]
    mem = f", {dev['memory_mib']:,} MiB" if dev.get("memory_mib") else ""
    pkgs = ", ".join(f"{k} {v[k] or '-'}" for k in ("torch", "cuda", *PACKAGES[1:]))
    sha = f"{c['sha'] or 'unknown'}{' (dirty)' if c.get('dirty') else ''} ({c['source']})"
    out = [f"# make gpu-check: {dev['name']}, {d['date']}", "",
           f"{dev['name']}{mem}, driver {dev.get('driver') or '-'}; python {v['python']}, {pkgs}; commit {sha}; "
           f"mode {d['mode']}; {d.get('elapsed_s', 0):.0f} s of a {d['deadline_s']:.0f} s deadline.", "",
           "| part | status | seconds | budget s | note |", "| --- | --- | --- | --- | --- |"]
    for name, p in d["parts"].items():
        secs = f"{p['seconds']:.1f}" if "seconds" in p else "-"
        out.append(f"| {name} | {p['status']} | {secs} | {p['budget_s']:.0f} | {_cell(_note(p))} |")
    out += ["", "## Measured against predicted", "",
            "| config | quantity | measured | probe | plan | probe / measured | plan / measured |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, cfg in d["configs"].items():
        out += _config_rows(name, cfg, d["parts"].get(cfg["part"], {}).get("status", "-"))
    out += ["", "## Throughput", "", "| config | generation tok/s | update tok/s | update MFU | update HFU | peak MiB |"
            " steps measured |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, cfg in d["configs"].items():
        m = cfg.get("measured")
        if m and "update_tok_s" in m:
            out.append(f"| {name} | {m['generate_tok_s']:,.0f} | {m['update_tok_s']:,.0f} | {_num(m.get('mfu'), 3)} | "
                       f"{_num(m.get('hfu'), 3)} | {m['peak_bytes'] / 2 ** 20:,.0f} | {m['steps']} |")
    return out + ["", "## Checks", ""] + [f"- {line}" for line in _checks(d["parts"])]


def _config_rows(name: str, cfg: dict, status: str) -> list[str]:
    m, p = cfg.get("measured"), cfg.get("predicted") or {}
    plan, probe, r = p.get("plan") or {}, p.get("probe") or {}, cfg.get("ratios", {})
    missing = status if m is None else "-"
    failed = "failed" if "error" in p else "-"
    rows = []
    for ph in (*PHASES, "step"):
        got = (m or {}).get("phase_seconds", {}).get(ph) if ph != "step" else (m or {}).get("step_seconds")
        want = plan.get("phase_seconds", {}).get(ph) if ph != "step" else plan.get("step_seconds")
        if got is None and m is not None:
            continue  # not measured by this part (bench trl's TRL side times steps only)
        rows.append(f"| {name} | {ph} s | {_num(got, 3, missing)} | - | {_num(want, 3, failed)} | - | "
                    f"{_num(r.get(ph), 2)} |")
    peak = (m or {}).get("peak_bytes")
    rows.append(f"| {name} | peak GiB | {_num(peak and peak / GiB, 2, missing)} | "
                f"{_num(probe.get('peak_bytes') and probe['peak_bytes'] / GiB, 2, failed)} | "
                f"{_num(plan.get('per_gpu_bytes') and plan['per_gpu_bytes'] / GiB, 2, failed)} | "
                f"{_num(r.get('probe_peak'), 2)} | {_num(r.get('plan_peak'), 2)} |")
    if "error" in p:
        rows.append(f"| {name} | prediction | - | failed | failed | - | {_cell(p['error'], whole=True)} |")
    return rows


def _checks(parts: dict) -> list[str]:
    lines = []
    pk = parts.get("packed_vs_padded", {}).get("result")
    if pk:
        lines.append(f"packed vs padded ({pk['dtype']}, {pk['tokens']} tokens): log-prob |diff| max "
                     f"{pk['logprob_max_abs']:.4f} (bound {pk['tolerance']['logprob_max_abs']}), mean "
                     f"{pk['logprob_mean_abs']:.5f} (bound {pk['tolerance']['logprob_mean_abs']}); gradients relative "
                     f"{pk['grad_rel']:.4f} (bound {pk['tolerance']['grad_rel']}), worst parameter "
                     f"{pk['grad_worst_rel']:.4f}")
    lc = parts.get("long_completion", {}).get("result")
    if lc:
        lines.append(f"long completions: SIGTERM {lc['signal_after_s']:.1f} s after start (its first step begun), "
                     f"exit {lc['exit_code']}, {lc['checkpoint'] or 'no checkpoint'}, requeue.json {lc['requeue']}")
    tr = parts.get("trl", {}).get("result")
    if tr:
        lines.append(f"bench trl: ours {tr['ours_step_s']:.3f} s per step, TRL GRPOTrainer {tr['trl_step_s']:.3f} s: "
                     f"ours/TRL {tr['ratio']:.2f}; peak ours {tr['ours_peak_mb']:,.0f} MiB, TRL "
                     f"{tr['trl_peak_mb']:,.0f} MiB")
    return lines or ["none ran"]


def _note(p: dict) -> str:
    if p["status"] == "skipped":
        return p["reason"]
    if p["status"] == "failed":
        return p["error"]
    return ""


def _num(x, digits: int, missing: str = "-") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return missing
    return f"{x:,.{digits}f}"


def _cell(text: str, limit: int = 300, whole: bool = False) -> str:
    """One table cell, pipes escaped, cut: the text's last line that says something (where a process's output
    ends with its error), or ``whole``, every line (an exception's message)."""
    lines = [s.strip() for s in str(text).splitlines() if s.strip()]
    line = " ".join(lines) if whole else lines[-1] if lines else ""
    return (line[:limit] + ("..." if len(line) > limit else "")).replace("|", "\\|")
