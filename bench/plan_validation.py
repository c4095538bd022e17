"""``python -m bench.plan_validation [--steps N] [--run-dir DIR]``: the planner's seconds per phase (core/planning/
step_time.py) beside a measured RL run on this CPU (docs/planner.md "Validation").

It runs ``recipes.run`` with :data:`OVERRIDES` for ``N`` steps (the demo recipe on a wider tiny Qwen2, so its matrix
products, not Python, take the time; no warm start: a random model's completions run to the cap, which is what the
planner assumes without a published mean), reads ``time/<phase>`` from its metrics.jsonl (the mean over the steps
after the first, which pays one-off costs), and prints both with the ratio. The profile (conf/hardware/
cpu_epyc_2vcpu.yaml) holds this machine's measured fp32 GEMM rate and copy bandwidth, so the efficiencies are 1.
"""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.gpu_smoke import PHASE_METRICS as MEASURED  # the planner's phase -> the loop's metric

OVERRIDES = ["recipe=tiny_math_grpo", "hardware=cpu_epyc_2vcpu", "train.warm_start.enabled=false",
             "data.max_prompt_tokens=8", "rollout.max_new_tokens=32", "model.tiny.hidden_size=512",
             "model.tiny.intermediate_size=2048", "model.tiny.num_hidden_layers=4",
             "model.tiny.num_attention_heads=8", "model.tiny.num_key_value_heads=4", "cpu_threads=2"]
# the profile's figures are this machine's measured rates, not a datasheet's
EFFICIENCY = {"mfu": 1.0, "hbm": 1.0, "hf_kv": 1.0}


def measured(run_dir: Path) -> dict[str, float]:
    """Mean seconds per phase over the run's steps after the first."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if MEASURED["update"] in r][1:]  # the step rows, the first one left out
    return {phase: sum(r[key] for r in rows) / len(rows) for phase, key in MEASURED.items()}


def predicted() -> dict[str, float]:
    from core.planning.step_time import estimate
    from recipes.probe import prepared_config, probe

    with contextlib.redirect_stdout(sys.stderr):
        report = probe(OVERRIDES)
        prepared = prepared_config(OVERRIDES)
    return estimate(prepared.config, prepared.plan, report, EFFICIENCY).phases


def run(steps: int, run_dir: Path) -> None:
    cmd = [sys.executable, "-m", "recipes.run", *OVERRIDES, f"train.total_steps={steps}", "logger.progress=false",
           f"hydra.run.dir={run_dir}", "train.eval_every=0"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def main(argv: list[str]) -> None:
    steps = int(argv[argv.index("--steps") + 1]) if "--steps" in argv else 6
    run_dir = Path(argv[argv.index("--run-dir") + 1]) if "--run-dir" in argv else \
        Path(tempfile.mkdtemp(prefix="plan_validation_")) / "run"
    if not (run_dir / "metrics.jsonl").exists():
        run(steps, run_dir)
    got, want = measured(run_dir), predicted()
    print("| phase | predicted s | measured s | predicted / measured |")
    print("| --- | --- | --- | --- |")
    for phase in MEASURED:
        print(f"| {phase} | {want[phase]:.3f} | {got[phase]:.3f} | {want[phase] / got[phase]:.2f} |")
    total_p, total_m = sum(want[p] for p in MEASURED), sum(got.values())
    print(f"| step | {total_p:.3f} | {total_m:.3f} | {total_p / total_m:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
