"""Memory per GPU, broken down, with a verdict (``python -m recipes.plan``, docs/planner.md "Memory").

The figures come from the real-shape probe's report (recipes/probe.py: each phase's activations measured on fake
tensors, the resident states of core/planning/states.py); this module splits them into what a reader asks about
(weights, gradients, optimiser states, LoRA, critic, reference, activations, vLLM), adds what the probe does not count
(framework overhead: :func:`overhead`, each value with its reason) and what a colocated or dedicated vLLM leaves for
its KV cache (:func:`kv_cache`), and judges the fit (:func:`breakdown`).
"""
from __future__ import annotations

from omegaconf import OmegaConf

from core.planning.states import GiB

# Within this fraction of the card a plan is "tight": the probe's activations agree with real allocation within 5%
# (tests/test_probe.py) and the overheads below are estimates, so a plan this close may not fit; knobs are ranked.
MARGIN = 0.05
# One CUDA context per GPU process (the trainer; a colocated vLLM runs in the same process, TRL colocate and veRL's
# hybrid engine): torch 2.x on CUDA 12 with lazy module loading, plus cuBLAS/NCCL/flash-attn kernels once loaded,
# shows 0.5-1 GiB per process in nvidia-smi; the midpoint.
CUDA_CONTEXT = 0.75 * GiB
# NCCL buffers per communicator: NCCL_BUFFSIZE 4 MiB per channel and direction (NCCL's environment docs), up to 32
# channels on NVLink: 4 MiB x 2 x 32.
NCCL_PER_COMMUNICATOR = 256 * 2 ** 20
# PyTorch's caching allocator holds freed blocks it cannot reuse for a differently shaped request (reserved minus
# allocated): 5% of the trainer's allocated peak, an assumption (expandable_segments off, the default).
FRAGMENTATION = 0.05
# DeepSpeed's defaults when zero.options leaves them out (deepspeed/runtime/zero/config.py): elements.
ZERO_BUCKET_DEFAULTS = {"reduce_bucket_size": 500_000_000, "stage3_prefetch_bucket_size": 50_000_000}
# vLLM's CUDA graphs (vLLM logs "Graph capturing finished ... took 0.3-1 GiB" for 1.5-8B models; assumed). Its
# profile run's tokens and max_num_seqs default: core/rollout/vllm_memory.py, shared with the engine.
VLLM_CUDA_GRAPHS = 0.5 * GiB

ORDER = ("weights", "gradients", "optimizer", "lora", "critic", "reference", "activations", "vllm", "cuda_context",
         "nccl", "zero_buckets", "fragmentation")


# Phases that run a backward, whose gradient reduction converts DeepSpeed's bucket to the communication dtype.
REDUCING = ("update", "rm_update")


def overhead(cfg, plan, gpus: int, phase: str | None = None, trainer_bytes: int = 0) -> list[tuple[str, int, str]]:
    """``(name, bytes per GPU, why)`` of what the probe's allocated peak leaves out at ``phase`` (None: between
    phases, as when a colocated vLLM starts), for a model trained over ``gpus`` GPUs: the CUDA context, NCCL's
    buffers, DeepSpeed's communication buckets (allocated whole; in a phase with a backward, :data:`REDUCING`, with
    the reduction's copy in a wider communication dtype) and the caching allocator's fragmentation,
    :data:`FRAGMENTATION` of ``trainer_bytes`` (the trainer's allocated peak at the phase: 0 while vLLM generates,
    the loops empty torch's cache before waking it, core/rollout/vllm.py as TRL). One source for ``recipes.probe``'s
    verdict and ``recipes.plan``'s parts."""
    comms = int(gpus > 1) + int(plan.layout.tp > 1 and cfg.get("rollout", {}).get("engine") == "vllm")
    out = [("cuda_context", int(CUDA_CONTEXT), "one CUDA context per GPU process (torch + CUDA 12, lazy loading): "
                                               "0.5-1 GiB in nvidia-smi, the midpoint"),
           ("nccl", comms * NCCL_PER_COMMUNICATOR,
            f"{comms} communicator(s) (learners' data parallel; vLLM's tensor parallel when colocated) x "
            f"NCCL_BUFFSIZE 4 MiB x 2 directions x 32 channels"),
           ("zero_buckets", *zero_buckets(cfg, phase in REDUCING)),
           ("fragmentation", int(FRAGMENTATION * trainer_bytes),
            f"{FRAGMENTATION:.0%} of the trainer's allocated peak (caching allocator; assumed)")]
    return out


DS_DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}  # DeepSpeed's dtype names (runtime/config.py DtypeEnum)


def model_dtype_bytes(cfg) -> int:
    from core.rollout.vllm_memory import DTYPE_BYTES

    return DTYPE_BYTES[str(cfg.model.dtype)]


def comm_dtype_bytes(cfg) -> int:
    """Bytes of an element DeepSpeed reduces gradients in: ``zero.communication_data_type``, else the model's dtype
    (deepspeed/runtime/engine.py ``communication_data_type``). One source for the buckets here and the gradient
    traffic of core/planning/phases.py."""
    name = cfg.zero.get("communication_data_type")
    return DS_DTYPE_BYTES[str(name)] if name else model_dtype_bytes(cfg)


def zero_buckets(cfg, reducing: bool = True) -> tuple[int, str]:
    """``(bytes, why)`` of the buckets DeepSpeed allocates at ``zero.stage`` (zero.options, else DeepSpeed's defaults;
    none at stage 0, whose DDP buckets are 25 MB). ZeRO-1/2: the contiguous gradient bucket of ``reduce_bucket_size``
    elements in the model's dtype, two with ``overlap_comm`` (DeepSpeed 0.19.8 stage_1_and_2.py ``setup_buckets``);
    ZeRO-3: the reduce bucket and the prefetch bucket. With a wider ``communication_data_type`` (fp32 under bf16)
    the reduction (``reducing``: a phase with a backward) converts a bucket to it first (stage_1_and_2.py
    ``gradient_reduction_w_predivide``: ``tensor.to(communication_data_type)``; DeepSpeed 0.16.4's stage3.py the same
    before its reduce-scatter), a copy of ``reduce_bucket_size`` elements in that dtype beside the bucket. (0.19.8's
    ZeRO-3 allocates its reduce bucket in the communication dtype instead, the smaller of the two: this is the peak
    of the floor's layout.)"""
    stage = int(cfg.zero.stage)
    if stage == 0:
        return 0, "no DeepSpeed buckets at this stage"
    options = OmegaConf.to_container(cfg.zero.options) if cfg.zero.options else {}
    reduce = int(options.get("reduce_bucket_size", ZERO_BUCKET_DEFAULTS["reduce_bucket_size"]))
    model_b, comm_b = model_dtype_bytes(cfg), comm_dtype_bytes(cfg)
    if stage == 3:
        staged = reduce + int(options.get("stage3_prefetch_bucket_size",
                                          ZERO_BUCKET_DEFAULTS["stage3_prefetch_bucket_size"]))
        what = f"reduce bucket of {reduce:,} and prefetch bucket of {staged - reduce:,} elements"
    else:
        buffers = 1 + bool(options.get("overlap_comm", False))
        staged = buffers * reduce
        what = f"{buffers} gradient bucket(s) of {reduce:,} elements"
    converted = reduce * comm_b if comm_b != model_b and reducing else 0
    why = (f"DeepSpeed ZeRO-{stage}: {what} in the model's {model_b}-byte dtype, allocated whole (zero.options or "
           f"DeepSpeed's defaults)" + (f", and the reduction's copy of a bucket in the {comm_b}-byte "
                                       f"communication_data_type" if converted else ""))
    return staged * model_b + converted, why


def lora_on(cfg) -> bool:
    return int(OmegaConf.select(cfg, "train.lora.rank", default=0) or 0) > 0


def resident_parts(cfg, report: dict) -> dict[str, int]:
    """The probe's resident memory per GPU as the plan names it: the trained model's weights (with LoRA: its frozen
    base), gradients and optimiser states, LoRA's adapters (their weights, gradients and optimiser states together),
    the critic's states, the reference."""
    res, policy = report["resident_bytes"], report["state_parts"]["policy"]
    trained = policy["weights"] + policy["gradients"] + policy["optimizer"]
    lora = lora_on(cfg)
    parts = {"weights": policy["frozen"] + (0 if lora else policy["weights"]),
             "gradients": 0 if lora else policy["gradients"], "optimizer": 0 if lora else policy["optimizer"],
             "lora": trained if lora else 0, "critic": res["critic_states"], "reference": res["reference"]}
    assert sum(parts.values()) == res["model_states"] + res["critic_states"] + res["reference"]
    return parts


def phase_parts(cfg, plan, report: dict, name: str) -> dict[str, int]:
    """Every part of phase ``name`` per GPU, in :data:`ORDER`: the probe's peak split, plus the overhead; the
    allocator's fragmentation on the trainer's allocation (none while vLLM generates: the loops empty torch's cache
    before waking it, core/rollout/vllm.py as TRL)."""
    phase, res = report["phases"][name], report["resident_bytes"]
    parts = resident_parts(cfg, report)
    parts["activations"] = phase["activation_bytes"]
    parts["vllm"] = res["vllm_awake"] if name == "generate" else res["vllm_training"]
    assert sum(parts.values()) == phase["peak_bytes"], (name, parts, phase)
    parts.update({k: v for k, v, _ in overhead(cfg, plan, report["hardware"]["gpus"], name,
                                                trainer_bytes(report, name))})
    return {k: parts[k] for k in ORDER}


def trainer_bytes(report: dict, name: str) -> int:
    """The trainer's allocated peak at phase ``name`` (what fragments): the probe's peak less vLLM's part; none while
    vLLM generates (the loops empty torch's cache before waking it)."""
    if name == "generate":
        return 0
    res = report["resident_bytes"]
    return report["phases"][name]["peak_bytes"] - res["vllm_training"]


def breakdown(cfg, plan, report: dict) -> dict:
    """The memory side of a plan: per phase its parts and total per GPU, the phase that peaks, the verdict (``fits``,
    ``tight``: within :data:`MARGIN` of the card, or ``does not fit`` by ``short_bytes``), the overhead's reasons and
    the KV cache vLLM is left with."""
    card = int(float(cfg.hardware.memory_gib) * GiB)
    phases = {n: phase_parts(cfg, plan, report, n) for n in report["phases"]}
    totals = {n: sum(p.values()) for n, p in phases.items()}
    peak = max(totals, key=totals.get)
    kv = kv_cache(cfg, plan, report.get("trainer_bytes_at_vllm_start", 0))
    extra = overhead(cfg, plan, report["hardware"]["gpus"], peak, trainer_bytes(report, peak))
    per_gpu = totals[peak]
    verdict = "does not fit" if per_gpu > card else "tight" if per_gpu > (1 - MARGIN) * card else "fits"
    if kv is not None and kv["kv_bytes"] <= 0:
        verdict = "does not fit"  # vLLM refuses to start without room for one KV block
    return {"memory_bytes": card, "gpus": report["hardware"]["gpus"], "phases": phases, "totals": totals,
            "peak_phase": peak, "per_gpu_bytes": per_gpu, "verdict": verdict, "fits": verdict != "does not fit",
            "short_bytes": max(0, per_gpu - card), "headroom_bytes": max(0, card - per_gpu),
            "overhead": [{"name": n, "bytes": b, "why": w} for n, b, w in extra],
            "kv_cache": kv}


def kv_cache(cfg, plan, at_start: int = 0) -> dict | None:
    """What a vLLM engine's reservation per GPU (:func:`vllm_reservation`; ``at_start``: what the trainer holds on the
    GPU when a colocated engine is built) leaves for its KV cache after its weights, its profile run's activations and
    CUDA graphs, and how many sequences of the recipe's prompt + response length that holds per engine
    (:func:`kv_sequences`). None without vLLM."""
    engine = OmegaConf.select(cfg, "rollout.engine")
    if cfg.loop != "rl" or engine not in ("vllm", "vllm_server"):
        return None
    from core.planning.states import prompt_tokens

    parts = vllm_reservation(cfg, at_start)
    length = prompt_tokens(cfg) + int(cfg.rollout.max_new_tokens)
    batch = cfg.rollout.get("generation_batch_size") or plan.samples_per_step
    out = {"where": "rollout GPUs (dedicated)" if engine == "vllm_server" else "learner GPUs (colocated)",
           "engines": plan.layout.engines, "tp": plan.layout.tp, **parts, "tokens_per_sequence": length,
           "sequences_wanted": min(-(-batch // plan.layout.engines), max_num_seqs(cfg))}
    return {**out, "sequences": kv_sequences(out, length)}


def kv_sequences(kv: dict, tokens: int) -> int:
    """Sequences of ``tokens`` tokens the KV cache of :func:`kv_cache` holds per engine (each GPU of an engine keeps its
    share of the KV heads of every sequence)."""
    return max(0, kv["kv_bytes"]) // (kv["kv_bytes_per_token_per_gpu"] * tokens)


def vllm_reservation(cfg, at_start: int = 0) -> dict:
    """A vLLM engine's memory per GPU by ``rollout.vllm.gpu_memory_utilization_of`` (core/rollout/vllm_memory.py):
    its weights (``params x dtype bytes / TP``), profile activations, CUDA graphs, KV cache and their sum, the
    reservation. ``card``: the reservation is ``fraction x the card`` and the KV cache what it leaves; ``free``: the
    KV cache is ``fraction x (card - at_start - weights - activations)``, veRL's, and the reservation the parts' sum.
    KV bytes per token (vLLM's cache layout): ``2 (K and V) x layers x kv_heads x head_dim x dtype bytes``, the
    heads split over TP (each GPU keeps at least one, replicated past the heads)."""
    from core.models.shapes import shape_config
    from core.planning.model_figures import figures
    from core.rollout import vllm_memory as vm

    v, c = cfg.rollout.vllm, shape_config(cfg.model)
    tp, fraction, gib = int(v.tensor_parallel_size), float(v.gpu_memory_utilization), float(cfg.hardware.memory_gib)
    dtype, fig = vm.DTYPE_BYTES[cfg.model.dtype if v.dtype == "auto" else v.dtype], figures(c)
    weights, graphs = vm.weight_bytes(c, dtype, tp), int(VLLM_CUDA_GRAPHS)
    activations = vm.profile_activation_bytes(c, tp, v.max_num_batched_tokens or vm.PROFILE_TOKENS, max_num_seqs(cfg),
                                              dtype)
    if v.gpu_memory_utilization_of == "free":
        kv = vm.free_kv_bytes(int(gib * GiB) - at_start, fraction, weights, activations)
        reservation = weights + activations + graphs + max(0, kv)
    else:
        reservation = int(fraction * gib * GiB)
        kv = reservation - weights - activations - graphs
    head_dim = fig.kv_dim // c.num_key_value_heads
    return {"fraction_of": str(v.gpu_memory_utilization_of), "fraction": fraction, "free_at_start_bytes":
            int(gib * GiB) - at_start, "reservation_bytes": reservation, "weights_bytes": weights,
            "activation_bytes": activations, "cuda_graph_bytes": graphs, "kv_bytes": kv,
            "kv_bytes_per_token": 2 * c.num_hidden_layers * fig.kv_dim * dtype,  # whole model: K and V of every layer
            "kv_bytes_per_token_per_gpu": 2 * c.num_hidden_layers * max(1, c.num_key_value_heads // tp) * head_dim
            * dtype}


def max_num_seqs(cfg) -> int:
    """vLLM's ``max_num_seqs``: the config's, else vLLM's default on the profile's GPU (core/rollout/vllm_memory.py)."""
    from core.rollout.vllm_memory import default_max_num_seqs

    hw = cfg.hardware
    return int(cfg.rollout.vllm.max_num_seqs or default_max_num_seqs(float(hw.memory_gib) * GiB, str(hw.name)))


def assumptions(cfg) -> list[list]:
    """The memory side's assumptions as ``[name, value, where it comes from]`` (the time side adds its own)."""
    from core.rollout.vllm_memory import PROFILE_TOKENS

    out = [["memory.rows", "full length", "every probed micro-batch is the longest (prompt + max_new_tokens, or "
                                          "train.max_len): the worst micro-step, what a run must survive"],
           ["memory.attention", "flash (O(T))", "the probe runs sdpa's flash kernel, no T x T mask, as flash-attn"],
           ["memory.cuda_context_gib", CUDA_CONTEXT / GiB, "per GPU process, nvidia-smi 0.5-1 GiB (midpoint)"],
           ["memory.nccl_per_communicator_gib", NCCL_PER_COMMUNICATOR / GiB, "NCCL_BUFFSIZE 4 MiB x 2 x 32 channels"],
           ["memory.fragmentation", FRAGMENTATION, "of the trainer's allocated peak (caching allocator)"],
           ["memory.margin", MARGIN, "within this fraction of the card the plan is tight and knobs are ranked"]]
    if cfg.loop == "rl" and cfg.rollout.engine in ("vllm", "vllm_server"):
        free = cfg.rollout.vllm.gpu_memory_utilization_of == "free"
        out += [["vllm.accounting", "of free" if free else "of the card",
                 "the KV cache is gpu_memory_utilization x what is free once the trainer's states (at the engine's "
                 "start) and vLLM's weights and profile run are in (veRL 0.2's vLLM 0.6.3 worker; passed to vLLM as "
                 "kv_cache_memory_bytes)" if free else "vLLM (constraints/gpu.txt) reserves gpu_memory_utilization x "
                 "the card beside what the trainer holds"],
                ["vllm.max_num_batched_tokens", cfg.rollout.vllm.max_num_batched_tokens or PROFILE_TOKENS,
                 "the config's, else assumed (vLLM's default varies)"],
                ["vllm.max_num_seqs", max_num_seqs(cfg), "the config's, else vLLM's V1 default"],
                ["vllm.cuda_graphs_gib", VLLM_CUDA_GRAPHS / GiB, "vLLM's capture log for 1.5-8B models (0.3-1 GiB)"]]
    return out
