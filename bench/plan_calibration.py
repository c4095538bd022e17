"""``python -m bench.plan_calibration [--reports DIR] [--write]``: the planner's time beside every headline figure
users quote (../shared/reference/README.md, "Headline figures"), one row per reading of a figure.

Each :data:`CASES` entry is a claim, the recipe and overrides that set up its source's run, and its readings: what the
figure can mean where the source leaves it open (how many steps, which generation layout). A reading's prediction is
:func:`core.planning.step_time.estimate` on the probe's report of those overrides, with the global efficiencies
(step_time.py ``EFFICIENCY``): nothing here is tuned per case. ``--reports DIR`` reads (``--write``: probes and
writes) the reports as JSON, so the table and tests/planning/test_calibration.py need no probing.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

# Open-R1's slowness report on 4 H100: the Qwen2.5-7B-Instruct GRPO demo (config_demo @068f13f2: num_generations 16,
# per_device_train_batch_size 4, gradient_accumulation_steps 16, max_prompt_length 1024, max_completion_length 4096;
# ../shared/reference/open_r1.md §1.2) with ZeRO-3 CPU offload of optimiser and parameters (TRL issue #3858's setup)
_OPEN_R1 = ["recipe=open_r1_grpo_math_7b", "hardware=h100_80g_1x4", "model.name_or_path=Qwen/Qwen2.5-7B",
            "layout.gpus_per_node=4", "rollout.max_new_tokens=4096", "data.max_prompt_tokens=1024",
            "train.group_size=16", "train.micro_batch_size=4", "train.logprob_micro_batch_size=4",
            "zero=stage3", "zero.offload_optimizer=true", "zero.offload_param=true"]


@dataclass(frozen=True)
class Reading:
    name: str
    overrides: tuple[str, ...] = ()  # over the case's
    steps: int | None = None  # the run's steps under this reading (None: the plan's)


@dataclass(frozen=True)
class Case:
    key: str
    claim: str
    value: float  # the claimed figure, in ``unit``
    unit: str  # "h" (the run) or "min/step"
    source: str
    overrides: tuple[str, ...]
    readings: tuple[Reading, ...] = field(default_factory=lambda: (Reading("as configured"),))
    well_defined: bool = True


CASES: tuple[Case, ...] = (
    Case("open_instruct_rm_8b", "Open-Instruct 8B reward model", 9, "h", "issue #485 (maintainer)",
         ("recipe=open_instruct_rm_8b",)),
    Case("open_instruct_rlvr_8b", "Open-Instruct 8B RLVR, full run", 65, "h", "issue #485 (maintainer)",
         ("recipe=open_instruct_rlvr_8b",),
         (Reading("10M episodes (the command: 44,642 steps)", steps=44642),
          Reading("100k episodes (paper Table 21: 446 steps)", steps=446),
          Reading("~50k episodes (articles: 223 steps)", steps=223)), well_defined=False),
    Case("open_instruct_rlvr_70b", "Open-Instruct 70B RLVR, full run", 60, "h", "issue #485 (maintainer)",
         ("recipe=open_instruct_rlvr_70b",), (Reading("400k episodes (625 steps)", steps=625),)),
    Case("simplerl_zoo_7b", "SimpleRL-Zoo 7B, 100 steps on 16 H100", 15, "h", "paper and issues",
         ("recipe=simplerl_zoo_7b",),
         (Reading("completions at the 8192 cap", steps=100),
          Reading("mean completion 1024 tokens", ("rollout.expected_new_tokens=1024",), steps=100)),
         well_defined=False),
    Case("simplerl_zoo_14b", "SimpleRL-Zoo 14B, 100 steps on 16 H100", 15, "h", "paper and issues",
         ("recipe=simplerl_zoo_14b",),
         (Reading("completions at the 8192 cap", steps=100),
          Reading("mean completion 1024 tokens", ("rollout.expected_new_tokens=1024",), steps=100)),
         well_defined=False),
    Case("open_r1_4xh100", "Open-R1 GRPO step, 4 H100, 4096 completions, ZeRO-3 CPU offload", 25, "min/step",
         "open-r1 / trl issues", tuple(_OPEN_R1),
         (Reading("vLLM server on 1 GPU, 3 learners", ("layout=dedicated", "layout.learner_gpus=3",
                                                       "layout.rollout_gpus=1", "train.prompts_per_step=12",
                                                       "train.mini_batch_size=192")),
          # TRL 0.14-0.16 GRPOTrainer._prepare_inputs generates per micro-batch (per_device_train_batch_size 4 on
          # each of 4 ranks: 16 completions a call, gradient_accumulation_steps calls a step)
          Reading("HF generate on 4 learners (no vLLM)", ("rollout=hf", "layout=colocate", "layout.learner_gpus=4",
                                                          "train.prompts_per_step=16", "train.mini_batch_size=256",
                                                          "rollout.generation_batch_size=16"))),
         well_defined=False),
    Case("openrlhf_rm_4090_8192_z3", "OpenRLHF 8B RM, 6x4090, max_len 8192 + ZeRO-3 + LoRA", 278, "h",
         "issue #354 (user's ETA, or OOM)", ("recipe=openrlhf_rm_llama3_8b_4090", "train.max_len=8192",
                                              "zero=stage3")),
    Case("openrlhf_rm_4090_4096_z2", "OpenRLHF 8B RM, 6x4090, max_len 4096 + ZeRO-2 + LoRA", 24, "h",
         "secondary write-up, unverified", ("recipe=openrlhf_rm_llama3_8b_4090",)),
)


def overrides(case: Case, reading: Reading) -> list[str]:
    return list(case.overrides) + list(reading.overrides)


def report_of(case: Case, reading: Reading, reports: Path | None, write: bool = False) -> dict:
    """The probe's report of a reading: read from ``reports`` (written there first when ``write``), else probed."""
    from recipes.probe import probe

    path = None if reports is None else reports / report_name(case, reading)
    if path is not None and path.exists() and not (write and path.name not in _WRITTEN):
        return json.loads(path.read_text())
    report = probe(overrides(case, reading))
    report.pop("probe_seconds", None)  # varies run to run
    if path is not None:
        _WRITTEN.add(path.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    return report


_WRITTEN: set[str] = set()  # reports this process wrote: readings that differ only in steps share one


def report_name(case: Case, reading: Reading) -> str:
    """A reading's report file: the case's, and its own overrides' (readings that differ in steps only share it)."""
    return f"{case.key}{'__' + _slug('_'.join(reading.overrides)) if reading.overrides else ''}.json"


def predict(case: Case, reading: Reading, report: dict):
    """``(predicted value in the case's unit, StepTime)`` of a reading."""
    from recipes.probe import prepared_config
    from core.planning.step_time import estimate

    prepared = prepared_config(overrides(case, reading))
    st = estimate(prepared.config, prepared.plan, report)
    if case.unit == "min/step":
        return st.step_seconds / 60, st
    steps = reading.steps if reading.steps is not None else st.steps
    return steps * st.step_seconds / 3600, st


def rows(reports: Path | None = None, write: bool = False) -> list[dict]:
    out = []
    for case in CASES:
        for reading in case.readings:
            report = report_of(case, reading, reports, write)
            value, st = predict(case, reading, report)
            top = sorted(st.phases.items(), key=lambda kv: -kv[1])[:3]
            out.append({"case": case.key, "claim": case.claim, "claimed": case.value, "unit": case.unit,
                        "reading": reading.name, "predicted": value, "ratio": value / case.value,
                        "per_gpu_gib": report["per_gpu_bytes"] / 2 ** 30,
                        "step_seconds": st.step_seconds, "where": ", ".join(f"{k} {v:.0f} s" for k, v in top),
                        "well_defined": case.well_defined, "source": case.source})
    return out


def table(rs: list[dict]) -> list[str]:
    out = ["| claim | source | claimed | reading | predicted | predicted / claimed | probe's peak GiB/GPU | "
           "step: largest phases |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rs:
        out.append(f"| {r['claim']} | {r['source']} | {r['claimed']:g} {r['unit']} | {r['reading']} | "
                   f"{r['predicted']:.1f} {r['unit']} | {r['ratio']:.2f} | {r['per_gpu_gib']:.1f} | "
                   f"{r['step_seconds']:.0f} s: {r['where']} |")
    return out


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_")[:80]


def main(argv: list[str]) -> None:
    import contextlib

    reports = Path(argv[argv.index("--reports") + 1]) if "--reports" in argv else None
    with contextlib.redirect_stdout(sys.stderr):
        rs = rows(reports, write="--write" in argv)
    print("\n".join(table(rs)))


if __name__ == "__main__":
    main(sys.argv[1:])
