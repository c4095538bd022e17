"""``make gpu-check``: every GPU check of the project in one command, on one CUDA device (an H100 or H200: 8 minutes,
python start-up and DeepSpeed's op builds included), measured against predicted in ``gpu_check.json`` and
``gpu_check.md`` (bench/gpu_check_report.py; schema and figures: docs/performance.md, "GPU check"). Its parts, in order:

1. ``predictions``: for each config below, ``recipes.plan.plan`` (on this CPU, fake tensors): the probe's per-GPU
   peak, the plan's seconds per phase and per-GPU total, on the device's profile in conf/hardware/
   (:data:`HARDWARE`); a config that cannot be predicted is recorded with its error and the runs go on;
2. ``packed_vs_padded``: bench/gpu_smoke.py's check of the packed forward against the padded one (bf16);
3. ``zero_none``, ``zero_stage2``, ``zero_stage3``: the smoke's RL run (Qwen2.5-0.5B shapes, random weights, 16
   prompts x 8, 256 new tokens) under each ZeRO mode, each its own ``python -m recipes.run``;
4. ``long_completion``: the same at 1024 new tokens under zero=stage2; once its first step has begun it gets the
   SIGTERM of a time limit or a preemption, and must finish the step, write its checkpoint and exit 75
   (core/training/preemption.py);
5. ``trl``: ``python -m bench trl``'s two sides, ours and TRL's ``GRPOTrainer``, one repetition
   (bench/trl_grpo_bench.py).

Each part has a budget, its expected seconds (:data:`SIZES`, from issue 36's H200 run). A part starts only if its
budget fits before the deadline (``GPU_CHECK_DEADLINE_S``), else it is recorded as skipped; its processes are
stopped at twice the budget or at the deadline. Both files are rewritten after every part, so a kill leaves the
parts that finished. Exit status 1 when a part failed.

    make gpu-check [GPU_CHECK_OUT=DIR]       # python -m bench.gpu_check [--out DIR] (default results/gpu_check)
    GPU_SMOKE_DEVICE=cpu GPU_SMOKE_SHAPES=tiny python -m bench.gpu_check --out DIR   # on a CPU, tiny (the tests)

``GPU_SMOKE_ZERO`` picks the ZeRO modes, ``GPU_CHECK_HARDWARE`` a conf/hardware profile for the predictions.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

from bench import gpu_smoke as S
from bench import trl_grpo_bench as T
from bench.gpu_check_report import Report, environment
from core.paths import PROJECT_ROOT


@dataclass(frozen=True)
class Sizes:
    steps: int  # RL steps of each ZeRO run (the first is the warm-up)
    max_new: int
    long_new: int  # the long run's new tokens
    long_steps: int  # its train.total_steps: the signal stops it first
    trl_steps: int  # bench trl's steps per side (the first is the warm-up)
    trl_max_new: int
    deadline_s: float
    budgets: dict[str, float]  # a part's expected seconds


SIZES = {
    # Issue 36's H200 run: a step at 256 new tokens generates in 7.8 s, scores log-probs in 0.3-0.7 s and updates in
    # 0.8 s (none) to 2.8 s (stage3); at 1024 tokens it generates in 62 s; bench trl: 3.6 and 2.8 s per step.
    # Estimated from those: the greedy evaluations before and after (16 prompts to the cap, 30 ms per decode
    # iteration) 8 s each at 256 tokens, 31 s at 1024; start-up, model load and the final save 25 s a run; the long
    # run's checkpoint (fp32 optimiser states, 6 GB) a few seconds; bench trl's start-up and setup 20 s a side.
    "qwen2_5_0_5b": Sizes(steps=2, max_new=256, long_new=1024, long_steps=2, trl_steps=3, trl_max_new=128,
                          deadline_s=450,
                          budgets={"predictions": 25, "packed_vs_padded": 30, "zero_none": 60, "zero_stage1": 62,
                                   "zero_stage2": 62, "zero_stage3": 70, "long_completion": 130, "trl": 70}),
    # On this project's 2-core machine a part takes 10-60 s, several times that when the machine is shared: budgets
    # that only a hung part reaches.
    "tiny": Sizes(steps=1, max_new=16, long_new=16, long_steps=500, trl_steps=2, trl_max_new=8, deadline_s=3600,
                  budgets=dict.fromkeys(("predictions", "packed_vs_padded", "zero_none", "zero_stage1", "zero_stage2",
                                         "zero_stage3", "long_completion", "trl"), 300)),
}
# a device name (nvidia-smi's) -> its profile in conf/hardware/, the first that the name contains
HARDWARE = {"H200": "h200_141g_1x1", "H100": "h100_80g_1x8", "A100": "a100_80g_1x8", "RTX 4090": "rtx4090_24g_1x6",
            "cpu": "cpu_epyc_2vcpu"}
TRL_MODEL = {"qwen2_5_0_5b": "qwen2_5_0_5b_random", "tiny": "tiny_qwen2"}  # bench trl's model option
SIGNAL_MARGIN_S = 1.0  # without /proc: after the row written just before the stop handler is installed
DEFAULT_OUT = PROJECT_ROOT / "results" / "gpu_check"


@dataclass
class Context:
    report: Report
    sizes: Sizes
    tmp: Path
    device_name: str  # nvidia-smi's, or "cpu": picks the predictions' hardware profile
    prediction_keys: dict[str, list[str]]  # config -> keys given to its prediction beyond its run's overrides

    def overrides(self, config: str) -> list[str]:
        return self.report.configs[config]["overrides"]


@dataclass(frozen=True)
class Part:
    name: str
    run: Callable[[Context, float], dict]  # (context, timeout s) -> result; result["failure"] fails the part


# ----------------------------------------------------------------------------- the configs and their predictions
def configs(sizes: Sizes) -> dict[str, dict]:
    """Every config that is run and predicted: its part and its overrides (what the run was given, its run dir
    aside)."""
    out = {f"zero_{z}": {"part": f"zero_{z}", "overrides": S.recipe_overrides(z, sizes.steps, sizes.max_new)}
           for z in S.ZEROS}
    out["long_completion"] = {"part": "long_completion",
                              "overrides": S.recipe_overrides("stage2", sizes.long_steps, sizes.long_new)}
    out["trl_ours"] = {"part": "trl", "overrides": T.shared_overrides(S.DEVICE, TRL_MODEL[S.SHAPES],
                                                                         sizes.trl_max_new, sizes.trl_steps)}
    return out


def hardware_overrides(device_name: str) -> list[str]:
    """The conf/hardware profile of the device (``GPU_CHECK_HARDWARE`` names one), as one GPU of one node."""
    name = os.environ.get("GPU_CHECK_HARDWARE") or next((v for k, v in HARDWARE.items() if k in device_name), None)
    if name is None:
        raise ValueError(f"no conf/hardware profile for the device {device_name!r} (known: {', '.join(HARDWARE)}); "
                         f"GPU_CHECK_HARDWARE=NAME picks one")
    return [f"hardware={name}", "hardware.nodes=1", "hardware.gpus_per_node=1"]


def predict(overrides: list[str]) -> dict:
    """``recipes.plan.plan`` of ``overrides`` (knobs not measured): the probe's and the plan's figures."""
    from recipes.plan import plan

    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed logs to stdout on import
        p = plan(overrides, knobs=False)
    return {"probe": {"peak_bytes": p["probe"]["per_gpu_bytes"], "phase_peak_bytes": p["probe"]["phases"]},
            "plan": {"phase_seconds": p["time"]["phases"], "step_seconds": p["step_seconds"],
                     "per_gpu_bytes": p["memory"]["per_gpu_bytes"], "verdict": p["verdict"]},
            "hardware": p["hardware"]}


def predictions(ctx: Context, timeout: float) -> dict:
    """Each config's prediction; one that fails records its error (the part fails, the runs still go on)."""
    start, failed = time.monotonic(), []
    for name, c in ctx.report.configs.items():
        begun = time.monotonic()
        try:
            keys = hardware_overrides(ctx.device_name) + ctx.prediction_keys.get(name, [])
            c["prediction_overrides"] = keys
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"not predicted: the part's {timeout:.0f} s ran out")
            c["predicted"] = {**predict(c["overrides"] + keys), "seconds": round(time.monotonic() - begun, 1)}
        except Exception as e:  # noqa: BLE001 - any failure of the planner is this config's recorded result
            c["predicted"] = {"error": _error(e)}
            failed.append(name)
    failure = f"{len(failed)} of {len(ctx.report.configs)} predictions failed ({', '.join(failed)}): " \
              f"{ctx.report.configs[failed[0]]['predicted']['error'].splitlines()[0][:300]}" if failed else None
    return {"predicted": len(ctx.report.configs) - len(failed), "failed": failed, "failure": failure}


# ----------------------------------------------------------------------------- the measured parts
def packed_vs_padded(ctx: Context, timeout: float) -> dict:
    proc = subprocess.run([sys.executable, "-m", "bench.gpu_smoke", "packed"], capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode:
        raise RuntimeError(f"python -m bench.gpu_smoke packed exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def zero_run(zero: str, ctx: Context, timeout: float) -> dict:
    name = f"zero_{zero}"
    figures = S.recipe_run(ctx.overrides(name), ctx.tmp / name, timeout)
    shutil.rmtree(ctx.tmp / name, ignore_errors=True)
    ctx.report.configs[name]["measured"] = measured(figures, ctx.device_name)
    return {k: ctx.report.configs[name]["measured"][k] for k in ("generate_tok_s", "update_tok_s", "mfu", "hfu")}


def measured(figures: dict, device_name: str) -> dict:
    """A run's :func:`bench.gpu_smoke.step_figures` as a config's measured row, with the update's MFU and HFU
    against the device's datasheet peak (by its name: this process never touches the GPU)."""
    config, recompute = _model_figures()
    mfu, hfu = S.update_flops_utilisation(config, figures, S.peak_tflops(device_name), recompute)
    peak = figures.pop("peak_mb")
    return {**figures, "peak_bytes": int(peak * 2 ** 20), "peak_source": _peak_source(), "mfu": mfu, "hfu": hfu}


@functools.cache
def _model_figures():
    """The smoke model's transformers config and whether it recomputes under gradient checkpointing (for MFU)."""
    from transformers import AutoConfig

    from core.config.composition import compose
    from core.models.loading import model_dir

    cfg = compose(S.MODEL)
    return AutoConfig.from_pretrained(model_dir(cfg.model)), bool(cfg.model.gradient_checkpointing)


def _peak_source() -> str:
    return "torch.cuda.max_memory_allocated" if S.DEVICE.startswith("cuda") else "process high-water RSS (VmHWM)"


def long_completion(ctx: Context, timeout: float) -> dict:
    """The long run, stopped by SIGTERM once its first step has begun: exit 75, ``requeue.json``, the checkpoint."""
    from core.training.preemption import MARKER, REQUEUE_EXIT

    run_dir, start = ctx.tmp / "long_completion", time.monotonic()
    log = ctx.tmp / "long_completion.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(S.recipe_command(ctx.overrides("long_completion"), run_dir), stdout=out,
                                stderr=subprocess.STDOUT, env={**os.environ, "HYDRA_FULL_ERROR": "1"})
        try:
            _wait_for_training(proc, run_dir / "metrics.jsonl", start + timeout, log)
            proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic() - start
            code = proc.wait(timeout=max(1.0, start + timeout - time.monotonic()))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    marker = json.loads((run_dir / MARKER).read_text()) if (run_dir / MARKER).exists() else None
    checkpoint = f"checkpoint-{marker['step']}" if marker else None
    problems = [f"exit {code}, expected {REQUEUE_EXIT}"] if code != REQUEUE_EXIT else []
    problems += [f"no {MARKER}"] if marker is None else []
    problems += [f"no {checkpoint}"] if checkpoint and not (run_dir / checkpoint).is_dir() else []
    if (run_dir / "metrics.jsonl").exists() and '"time/update"' in (run_dir / "metrics.jsonl").read_text():
        ctx.report.configs["long_completion"]["measured"] = measured(S.step_figures(run_dir), ctx.device_name)
    else:
        problems.append("no step was logged")
    failure = "; ".join(problems) + f"\n{log.read_text()[-3000:]}" if problems else None
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"exit_code": code, "signal_after_s": signalled, "requeue": marker, "checkpoint": checkpoint,
            "failure": failure}


def _wait_for_training(proc: subprocess.Popen, metrics: Path, until: float, log: Path) -> None:
    """Until the run has logged its evaluation before RL and then installed its stop handler (recipes/rl.py
    ``train``): SIGTERM is then caught (Linux: the process's ``SigCgt``; elsewhere :data:`SIGNAL_MARGIN_S` after
    the row), and a SIGTERM before would end the process at once."""
    seen = None
    while time.monotonic() < until:
        if proc.poll() is not None:
            raise RuntimeError(f"exited {proc.returncode} before training:\n{log.read_text()[-4000:]}")
        if seen is None and metrics.exists() and '"eval/accuracy"' in metrics.read_text():
            seen = time.monotonic()
        if seen is not None:
            caught = _catches_sigterm(proc.pid)
            if caught or caught is None and time.monotonic() - seen >= SIGNAL_MARGIN_S:
                return
        time.sleep(0.1)
    raise TimeoutError(f"the run did not start training within the part's time ({metrics})")


def _catches_sigterm(pid: int) -> bool | None:
    """Whether process ``pid`` has a SIGTERM handler (``/proc/<pid>/status`` ``SigCgt``, a hex mask of signal n at
    bit n - 1), None where that cannot be read."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        mask = next(line.split()[1] for line in status if line.startswith("SigCgt:"))
    except (OSError, StopIteration, IndexError):
        return None
    return bool(int(mask, 16) >> (signal.SIGTERM - 1) & 1)


def trl(ctx: Context, timeout: float) -> dict:
    """bench trl's two sides, one repetition; ours is the ``trl_ours`` config, measured per phase too."""
    until, s = time.monotonic() + timeout, ctx.sizes
    env = {"BENCH_DEVICE": S.DEVICE, "BENCH_MODEL": TRL_MODEL[S.SHAPES], "BENCH_STEPS": str(s.trl_steps),
           "BENCH_MAX_NEW": str(s.trl_max_new), "BENCH_REPS": "1"}
    res = {side: [T.spawn(side, env, timeout=max(1.0, until - time.monotonic()))] for side in ("ours", "trl")}
    summary = T.summarize(res)
    ours = res["ours"][0]
    phases = {p: statistics.median(step[p] for step in ours["phases"][1:]) for p in ours["phases"][0]}
    ctx.report.configs["trl_ours"]["measured"] = {
        "steps": len(ours["step_s"]) - 1, "first_step": 2, "phase_seconds": phases,
        "step_seconds": summary["ours_step_s"], "peak_bytes": int(summary["ours_peak_mb"] * 2 ** 20),
        "peak_source": _peak_source() + " over the process"}
    return summary


# ----------------------------------------------------------------------------- running the parts
def parts() -> list[Part]:
    return [Part("predictions", predictions), Part("packed_vs_padded", packed_vs_padded),
            *[Part(f"zero_{z}", partial(zero_run, z)) for z in S.ZEROS],
            Part("long_completion", long_completion), Part("trl", trl)]


def run_parts(ctx: Context, todo: list[Part], deadline: float, clock: Callable[[], float]) -> None:
    """Each part in turn if its budget fits before ``deadline`` (seconds on ``clock``), else skipped; the report
    saved after each."""
    for part in todo:
        entry, elapsed = ctx.report.parts[part.name], clock()
        if elapsed + entry["budget_s"] > deadline:
            entry.update(status="skipped", reason=f"would not fit: {elapsed:.0f} s elapsed + {entry['budget_s']:.0f} "
                                                  f"s budget > {deadline:.0f} s deadline")
        else:
            try:
                result = part.run(ctx, min(2 * entry["budget_s"], deadline - elapsed))
                entry.update(status="failed" if result.get("failure") else "ok", result=result)
                if result.get("failure"):
                    entry["error"] = result["failure"]
            except Exception as e:  # noqa: BLE001 - a part's failure is recorded; the next part runs
                entry.update(status="failed", error=_error(e))
            entry["seconds"] = round(clock() - elapsed, 1)
        ctx.report.data["elapsed_s"] = round(clock(), 1)
        ctx.report.save()
        print(f"{part.name}: {entry['status']}" + (f" in {entry['seconds']} s" if "seconds" in entry else "")
              + (f" ({_last_line(entry.get('error') or entry.get('reason'))})" if entry["status"] != "ok" else ""),
              flush=True)


def _error(e: BaseException) -> str:
    if isinstance(e, subprocess.TimeoutExpired):
        return f"timed out after {e.timeout:.0f} s: {' '.join(map(str, e.cmd))[:300]}"
    return "".join(traceback.format_exception_only(type(e), e)).strip()[-4000:]


def _last_line(text: str | None) -> str:
    lines = [s for s in (text or "").splitlines() if s.strip()]
    return lines[-1][:300] if lines else ""


def main(argv: list[str]) -> int:
    from core.errors import printed_help

    if printed_help(argv, __doc__):
        return 0
    start = time.monotonic()
    out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else DEFAULT_OUT
    S.require_device("make gpu-check")
    sizes = SIZES[S.SHAPES]
    deadline = float(os.environ.get("GPU_CHECK_DEADLINE_S", sizes.deadline_s))
    env = environment(S.DEVICE)
    todo = parts()
    report = Report(out, {**env, "mode": f"{S.DEVICE}, {S.SHAPES} shapes", "deadline_s": deadline,
                          "sizes": {k: v for k, v in vars(sizes).items() if k != "budgets"}},
                    {p.name: sizes.budgets[p.name] for p in todo}, configs(sizes))
    report.save()
    print(f"make gpu-check on {env['device']['name']} ({report.data['mode']}), deadline {deadline:.0f} s: "
          f"{out / 'gpu_check.json'}, {out / 'gpu_check.md'}", flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        device = env["device"]["name"] if S.DEVICE.startswith("cuda") else "cpu"
        # bench trl runs its prompts without a length limit; the probe needs the longest (the run drops none)
        ctx = Context(report, sizes, Path(tmp), device,
                      {"trl_ours": [f"data.max_prompt_tokens={S.MAX_PROMPT_TOKENS}"]})
        run_parts(ctx, todo, deadline, lambda: time.monotonic() - start)
    print("\n".join((out / "gpu_check.md").read_text().splitlines()), flush=True)
    return 1 if any(p["status"] == "failed" for p in report.parts.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
