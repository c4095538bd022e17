"""Time per step and per run of a recipe on a hardware profile (``python -m recipes.plan``), from its prepared config,
its plan (core/config/plan.py) and the probe's report (recipes/probe.py ``probe()``: FLOPs of one micro-step per phase
at full length).

Each phase is a roofline: compute at the GPU's datasheet bf16 FLOP/s times a model-FLOP utilisation, memory traffic
at its datasheet bandwidth times a utilisation, collectives over the link they cross times a utilisation
(:data:`EFFICIENCY`, global, overridable); host costs are fixed figures, each with its source (several measured on the
H200 run of issue 36, docs/planner.md "Calibration on a GPU"). Per step, per learner rank:

- ``generate``: prefill at compute; decode per iteration reads the weights once plus every running sequence's KV
  cache, or computes, whichever binds (vLLM's continuous batching refills finished slots; HF ``generate`` runs waves
  of ``rollout.generation_batch_size`` to the longest completion, each iteration at least its per-layer host overhead,
  :data:`HF_DECODE_LAYER_SECONDS`); completions of ``rollout.expected_new_tokens`` (a recipe's published mean, else the cap);
- ``score``: the verifier on the rank's completions (:data:`VERIFY_SECONDS`; a random-weight policy's, which hold
  no answer, :data:`VERIFY_CALL_SECONDS`);
- ``logprobs`` and ``update``: per micro-step the larger of the device's time (the probe's FLOPs, recompute included
  when checkpointing, scaled from full length to the expected lengths with the attention term taken causal, plus the
  memory traffic of the other ops) and the host's (:data:`HOST_SECONDS_PER_OP` per op, :data:`ZERO3_MODULE_SECONDS`
  per module pass under ZeRO-3);
- ``zero_comm``: ZeRO's collectives, ring volumes ``(g-1)/g`` of the tensor per GPU: stage 3 all-gathers the weights
  for every forward, backward and recompute and reduce-scatters gradients every micro-step; stages 1-2
  reduce-scatter gradients every micro-step and all-gather the updated weights per optimiser step; DDP all-reduces
  once per optimiser step;
- ``weight_sync``: the policy's weights to vLLM once per step (gathered first under ZeRO-3);
- ``offload``: ZeRO-Offload's host traffic (gradients out, weights back, parameters fetched per gather) and
  DeepSpeed's CPU Adam (:data:`CPU_ADAM_PARAMS_PER_S`).

A step is the sum, except with ``rollout.generate_ahead=1`` (Open-Instruct's async mode), where generation of the next
batch overlaps the rest. The run is ``plan.total_steps`` steps, or the plan for the data's published rows
(``data.published_rows``). Every assumption is returned with its value and source.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from core.models.shapes import shape_config
from core.planning.model_figures import ModelFigures, figures

# name -> (value, where it comes from): the planner's only tuned figures, the same for every recipe and GPU.
EFFICIENCY: dict[str, tuple[float, str]] = {
    "mfu": (0.40, "model-FLOP utilisation of bf16 training and prefill; PaLM (Chowdhery et al. 2022, Table 3) "
                  "reports 46% for PaLM and 30% for Megatron-Turing NLG; DeepSpeed ZeRO-3 runs near the lower end"),
    "hbm": (0.60, "fraction of the datasheet memory bandwidth a decode step reaches (paged-attention kernels and "
                  "weight reads) and a training pass's ops other than matrix products (an engineering figure, not "
                  "measured here)"),
    "link": (0.70, "fraction of a link's datasheet bandwidth NCCL's ring collectives reach (nccl-tests bus bandwidth "
                   "over the link's peak; an engineering figure, not measured here)"),
    "host": (0.50, "fraction of the PCIe datasheet bandwidth ZeRO-Offload's pinned copies reach (an engineering "
                   "figure, not measured here)"),
    # H200 run of 2026-11, issue 36 (bench/gpu_measured.json, stage2_1024): HF generate of 128 rows to 1024 new tokens
    # took 62.43 s, the planner's host floor (1024 x 24 layers x 1.2 ms) 29.5 s; the excess grows with the context
    # (256 new tokens: 7.77 s, at that floor). Decode is then bound by the KV cache: 128 x 1024 x (6 + 512) tokens of
    # context x 12,288 bytes = 834 GB read in 62.43 - 0.35 (the weights' reads) s = 13.4 GB/s, 0.0028 of 4.8 TB/s.
    "hf_kv": (0.0028, "fraction of the datasheet memory bandwidth at which HF generate's eager decode goes through the "
                      "KV cache (sdpa with a padding mask: GQA heads expanded, the cache concatenated every token): "
                      "H200 run of 2026-11, issue 36 (128 x 1024 new tokens in 62.4 s)"),
}
VERIFY_SECONDS = (0.01, "CPU seconds to verify one completion, per learner rank's process (math-verify parse + "
                        "verify of a ~1k-token answer, order of magnitude; the demo's tiny ones take 0.2 ms)")
# H200 run of 2026-11, issue 36 (stage2_1024): time/verify 0.019 s for the 128 completions of a random-weight policy,
# which hold no answer to parse or compare: 0.15 ms each, the verifier's call alone.
VERIFY_CALL_SECONDS = (0.019 / 128, "CPU seconds of a verifier call on a completion with no answer (a random-weight "
                                    "policy's): H200 run of 2026-11, issue 36, 0.019 s for 128")
# H200 run of 2026-11, issue 36 (bench/gpu_measured.json, none_256): the update of 8 micro-steps of 16 x 262 tokens
# took 0.80 s, where its matrix products (12.7 TFLOP a micro-step at 0.40 x 989.5 TFLOP/s: 32 ms) and the memory
# traffic of its other ops (117 GB at 0.60 x 4.8 TB/s: 41 ms) come to 73 ms a micro-step: the host bound it, 100 ms for
# the 2,901 ops the probe counts in one: 34.5 us an op (0.80 s / (8 x 2,901)). At 1024 new tokens (stage2_1024) the
# device binds (about 290 ms a micro-step, 2.33 s predicted, 2.36 s measured) and the host's 3,153 ops take 109 ms.
HOST_SECONDS_PER_OP = (34.5e-6, "host seconds to dispatch and launch one op in eager PyTorch (Python, dispatcher, "
                                "autograd): H200 run of 2026-11, issue 36, 0.80 s for 8 x 2,901 ops")
# H200 run of 2026-11, issue 36 (stage3_256): the same update under ZeRO-3 at world size 1 took 2.83 s, 2.03 s more,
# over 8 micro-steps x 438 module passes (219 parameter-owning modules, forward and backward): 0.579 ms a pass, the
# host time of DeepSpeed's per-module fetch and release hooks (no collective at world size 1).
ZERO3_MODULE_SECONDS = (2.03 / (8 * 438), "host seconds of DeepSpeed ZeRO-3's hooks per parameter-owning module per "
                                          "forward or backward: H200 run of 2026-11, issue 36, 2.03 s over 8 x 438")
CPU_ADAM_PARAMS_PER_S = (1e9, "parameters per second DeepSpeed's CPU Adam updates per rank (order of magnitude of "
                              "ZeRO-Offload, Ren et al. 2021, §6; not measured here)")
# HF ``generate`` in eager mode: host time per decoder layer per decode iteration (Python, module calls, ~10 kernel
# launches), a floor under an iteration whatever the batch. PyTorch's "Accelerating Generative AI with PyTorch II: GPT,
# Fast" (pytorch.org/blog/accelerating-generative-ai-2, 2023) measures eager LLaMA-7B at batch 1 on an A100-80GB at
# 25.5 tok/s and calls it CPU-overhead bound: 1 / 25.5 s over 32 layers = 1.2 ms per layer.
HF_DECODE_LAYER_SECONDS = (1.2e-3, "host seconds per decoder layer per HF generate decode iteration (eager LLaMA-7B at "
                                   "batch 1, A100: 25.5 tok/s over 32 layers, overhead-bound; PyTorch blog 'GPT, Fast')")


@dataclass(frozen=True)
class StepTime:
    """Seconds per step by phase, the step, the run's steps and hours (None when the steps are unknown), and every
    assumption as ``(name, value, where it comes from)``."""

    phases: dict[str, float]
    step_seconds: float
    steps: int | None
    run_hours: float | None
    assumptions: list[tuple[str, object, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Hw:
    """A hardware profile in SI units per GPU, the efficiencies applied."""

    flops: float  # effective FLOP/s
    mem: float  # effective memory bytes/s
    hf_kv: float  # effective bytes/s of HF generate's eager decode through the KV cache
    intra: float  # effective link bytes/s inside a node
    inter: float  # effective network bytes/s per GPU out of a node
    host: float  # effective host-link bytes/s
    memory_bytes: float
    gpus_per_node: int
    name: str

    def link(self, gpus: int) -> float:
        """The bus bandwidth a ring collective over ``gpus`` GPUs runs at: the intra-node link, and once it spans
        nodes, at most a node's NICs together (NCCL lays one ring channel per NIC, each carrying its share of the
        tensor across the node boundary; nccl-tests' ``busbw``)."""
        return self.intra if gpus <= self.gpus_per_node else min(self.intra, self.inter * self.gpus_per_node)


def hardware(hw_cfg, eff: dict[str, float]) -> Hw:
    return Hw(flops=float(hw_cfg.bf16_tflops) * 1e12 * eff["mfu"], mem=float(hw_cfg.memory_gbps) * 1e9 * eff["hbm"],
              hf_kv=float(hw_cfg.memory_gbps) * 1e9 * eff["hf_kv"],
              intra=float(hw_cfg.intra_node_gbps) * 1e9 * eff["link"],
              inter=float(hw_cfg.inter_node_gbps) * 1e9 * eff["link"], host=float(hw_cfg.host_gbps) * 1e9 * eff["host"],
              memory_bytes=float(hw_cfg.memory_gib) * 2 ** 30, gpus_per_node=int(hw_cfg.gpus_per_node),
              name=str(hw_cfg.name))


def efficiencies(overrides: dict[str, float] | None = None) -> dict[str, float]:
    """:data:`EFFICIENCY`'s values with ``overrides`` (a name it does not hold is refused)."""
    from core.errors import InputError

    bad = sorted(set(overrides or {}) - set(EFFICIENCY))
    if bad:
        raise InputError(f"efficiency {', '.join(bad)}: no such efficiency; known: {', '.join(EFFICIENCY)}")
    out = {k: v for k, (v, _) in EFFICIENCY.items()}
    for k, v in (overrides or {}).items():
        if not 0 < float(v) <= 1:
            raise InputError(f"efficiency {k}={v}: expected a fraction in (0, 1]")
        out[k] = float(v)
    return out


def estimate(cfg, plan, report: dict, efficiency: dict[str, float] | None = None) -> StepTime:
    """The step time of ``cfg`` (prepared), ``plan`` (its derived plan) and ``report`` (the probe's) on
    ``cfg.hardware``; ``efficiency`` overrides :data:`EFFICIENCY`'s values by name."""
    from core.planning.phases import PHASE_TIMES

    eff = efficiencies(efficiency)
    ctx = Context(cfg=cfg, plan=plan, report=report, hw=hardware(cfg.hardware, eff),
                  policy=figures(shape_config(cfg.model)))
    ctx.assume("hardware", f"{ctx.hw.name}: {cfg.hardware.bf16_tflops} TFLOP/s bf16, {cfg.hardware.memory_gbps} GB/s "
               f"memory, links {cfg.hardware.intra_node_gbps} / {cfg.hardware.inter_node_gbps} / "
               f"{cfg.hardware.host_gbps} GB/s (intra-node, inter-node, host)", f"conf/hardware (datasheets)")
    for k, (_, why) in EFFICIENCY.items():
        ctx.assume(f"efficiency.{k}", eff[k], why if efficiency is None or k not in efficiency else "given")
    phases, overlapped = PHASE_TIMES.get(cfg.loop)(ctx)
    step = sum(v for k, v in phases.items() if k not in overlapped)
    if overlapped:
        step = max(step, sum(phases[k] for k in overlapped))
    steps = run_steps(ctx)
    return StepTime(phases=phases, step_seconds=step, steps=steps,
                    run_hours=None if steps is None else steps * step / 3600, assumptions=ctx.assumptions)


@dataclass
class Context:
    """What every phase reads, and the assumptions they add."""

    cfg: object
    plan: object
    report: dict
    hw: Hw
    policy: ModelFigures
    assumptions: list = field(default_factory=list)

    def assume(self, name: str, value, source: str) -> None:
        self.assumptions.append((name, value, source))


def run_steps(ctx: Context) -> int | None:
    """The run's steps: the plan's, else the plan for the data's published row count (before any filter)."""
    plan, rows = ctx.plan, ctx.cfg.data.get("published_rows")
    if plan.total_steps is None and rows:
        ctx.assume("data.published_rows", int(rows), "the dataset card's train rows (conf/data; filters not applied)")
        return plan.for_rows(int(rows)).total_steps
    return plan.total_steps


def flop_scale(fig: ModelFigures, probed: float, expected: float) -> float:
    """FLOPs of a row of ``expected`` tokens over those of the probe's ``probed``-token row: the probe counts the
    attention's full ``T x T`` square (torch's sdpa formula); flash kernels compute the causal half."""
    per_token = lambda t, att: 2.0 * fig.matmul_params + att * 4.0 * fig.layers * fig.attn_dim * t  # noqa: E731
    return expected * per_token(expected, 0.5) / (probed * per_token(probed, 1.0))


def ring(bytes_: float, gpus: int) -> float:
    """Bytes each GPU sends in a ring all-gather or reduce-scatter of a ``bytes_`` tensor over ``gpus`` GPUs."""
    return bytes_ * (gpus - 1) / gpus if gpus > 1 else 0.0


def ceil_div(a: float, b: float) -> int:
    return int(math.ceil(a / b))
