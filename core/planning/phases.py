"""Seconds per phase of one step, per loop (core/planning/step_time.py ``estimate``): each returns ``(phases,
overlapped)``, the names in ``overlapped`` running beside the others (a step takes the longer of the two sums)."""
from __future__ import annotations

from core.models.shapes import shape_config
from core.planning.model_figures import figures
from core.planning import memory
from core.planning.step_time import (CPU_ADAM_PARAMS_PER_S, HF_DECODE_LAYER_SECONDS, HOST_SECONDS_PER_OP,
                                     VERIFY_CALL_SECONDS, VERIFY_SECONDS, ZERO3_MODULE_SECONDS, Context, ceil_div,
                                     flop_scale, ring)
from core.registry import Registry

# loop -> fn(Context) -> (dict phase -> seconds, set of overlapped phases)
PHASE_TIMES: Registry = Registry("loop")


@PHASE_TIMES.register("rl")
def rl_times(ctx: Context):
    cfg, plan = ctx.cfg, ctx.plan
    P, R, R_cap = prompt_len(ctx), response_len(ctx), int(cfg.rollout.max_new_tokens)
    ranks = plan.world_size
    lp, up = ctx.report["phases"]["logprobs"], ctx.report["phases"]["update"]
    lp_micro = ceil_div(plan.samples_per_rank, plan.logprob_micro_batch_size)
    up_micro = plan.samples_per_rank // plan.micro_batch_size * plan.ppo_epochs
    phases = {"generate": generate_seconds(ctx, P, R, R_cap), "score": plan.samples_per_rank * verify_seconds(ctx),
              "logprobs": lp_micro * pass_seconds(ctx, lp, P + R), "update": up_micro * pass_seconds(ctx, up, P + R)}
    _host_assumptions(ctx)
    comm, host = zero_traffic(ctx, micro_steps=up_micro, forward_passes=lp_micro * _frozen_forwards(ctx),
                              optimizer_steps=plan.optimizer_steps_per_step, gpus=ranks)
    phases["zero_comm"], phases["offload"] = comm, host
    phases["weight_sync"] = weight_sync_seconds(ctx)
    overlapped = {"generate"} if int(cfg.rollout.generate_ahead) else set()
    return phases, overlapped


@PHASE_TIMES.register("rm")
def rm_times(ctx: Context):
    cfg, plan = ctx.cfg, ctx.plan
    L = min(int(cfg.train.expected_len or cfg.train.max_len), int(cfg.train.max_len))
    ctx.assume("train.expected_len", L, "the recipe's published mean pair length" if cfg.train.expected_len
               else "null: every sequence at train.max_len (no published mean length)")
    ph, gpus = ctx.report["phases"]["rm_update"], int(ctx.report["hardware"]["gpus"])
    # every GPU of the profile trains (recipes/probe.py shard_gpus): each rank's micro-steps of an optimiser step
    micro = ceil_div(plan.batch_size, plan.micro_batch_size * gpus)
    phases = {"update": micro * pass_seconds(ctx, ph, L)}
    _host_assumptions(ctx)
    phases["zero_comm"], phases["offload"] = zero_traffic(ctx, micro_steps=micro, forward_passes=0,
                                                          optimizer_steps=1, gpus=gpus)
    return phases, set()


def prompt_len(ctx: Context) -> int:
    """The prompt cap the probe used: its rows hold prompt + ``rollout.max_new_tokens`` tokens."""
    P = int(ctx.report["phases"]["logprobs"]["tokens_per_row"]) - int(ctx.cfg.rollout.max_new_tokens)
    ctx.assume("prompt_tokens", P, "the prompt cap (data.max_prompt_tokens or vLLM's max_model_len - max_new_tokens): "
               "no recipe's source publishes its mean prompt")
    return P


def response_len(ctx: Context) -> int:
    r = ctx.cfg.rollout
    R = min(int(r.expected_new_tokens or r.max_new_tokens), int(r.max_new_tokens))  # scale=tiny caps the length
    ctx.assume("rollout.expected_new_tokens", R, "the recipe's published mean completion (its YAML cites it)"
               if r.expected_new_tokens else "null: every completion runs to rollout.max_new_tokens")
    return R


def pass_seconds(ctx: Context, phase: dict, tokens: int) -> float:
    """One micro-step of the probe's ``phase``, its rows at ``tokens`` tokens instead of full length: the larger of
    the device's time (the matrix products' FLOPs at the FLOP rate, the other ops' memory traffic, linear in the
    tokens, at the memory bandwidth) and the host's (the ops it dispatches, and under ZeRO-3 a hook per
    parameter-owning module per forward and backward)."""
    device = (phase["flops"] * flop_scale(ctx.policy, phase["tokens_per_row"], tokens) / ctx.hw.flops
              + phase["traffic_bytes"] * tokens / phase["tokens_per_row"] / ctx.hw.mem)
    hooks = phase["module_passes"] if int(ctx.cfg.zero.stage) == 3 else 0
    host = phase["ops"] * HOST_SECONDS_PER_OP[0] + hooks * ZERO3_MODULE_SECONDS[0]
    return max(device, host)


def _host_assumptions(ctx: Context) -> None:
    ctx.assume("host_seconds_per_op", HOST_SECONDS_PER_OP[0], HOST_SECONDS_PER_OP[1])
    if int(ctx.cfg.zero.stage) == 3:
        ctx.assume("zero3_module_seconds", ZERO3_MODULE_SECONDS[0], ZERO3_MODULE_SECONDS[1])


def verify_seconds(ctx: Context) -> float:
    """A completion's verification: a call on no answer when the policy is a random-weight model (built locally, no
    warm start: its completions hold no answer), else the cost of parsing and comparing one."""
    random_policy = not ctx.cfg.model.name_or_path and not ctx.plan.warm_start
    seconds, why = VERIFY_CALL_SECONDS if random_policy else VERIFY_SECONDS
    ctx.assume("verify_seconds", seconds, why)
    return seconds


def _frozen_forwards(ctx: Context) -> int:
    """Sharded forwards per log-prob micro-step that gather weights: the old policy, the reference, the critic."""
    return sum(1 for m in ctx.plan.models if m.zero_stage == 3) if ctx.plan.models else 0


# ----------------------------------------------------------------------------- generation
def generate_seconds(ctx: Context, P: int, R: int, R_cap: int) -> float:
    """One step's rollout on one engine (the engines split the step's completions evenly): prefill at compute,
    then decode iterations bound by reading the weights and the running KV caches, by compute, or (HF generate) by
    the host's per-layer overhead of each iteration."""
    cfg, plan, hw, fig = ctx.cfg, ctx.plan, ctx.hw, ctx.policy
    engine = str(cfg.rollout.engine)
    tp = plan.layout.tp if engine != "hf" else 1
    engines = plan.layout.engines if engine != "hf" else plan.world_size
    n = ceil_div(plan.samples_per_step, engines)
    prompts = n / plan.group_size if engine != "hf" and _prefix_cache(cfg) else n
    prefill = prompts * P * fig.forward_flops(P / 2) / (tp * hw.flops)
    slots = _concurrency(ctx, n, P + R)
    # continuous batching refills a finished slot; HF generate runs a wave to its longest completion
    iters = max(R_cap, ceil_div(n * R, slots)) if engine != "hf" else ceil_div(n, slots) * R_cap
    weights = iters * fig.weight_bytes / (tp * hw.mem)
    # vLLM's paged attention and flash-attn read the cache at the memory efficiency; HF generate's decode through
    # sdpa (or eager) far slower (efficiency hf_kv, measured with sdpa)
    slow_kv = engine == "hf" and str(cfg.model.attn_implementation) in ("sdpa", "eager")
    kv = n * R * (P + R / 2) * fig.kv_bytes_per_token / (tp * (hw.hf_kv if slow_kv else hw.mem))
    compute = n * R * fig.forward_flops(P + R / 2) / (tp * hw.flops)
    # HF generate: each decode iteration runs every layer's Python and launches, latency-bound at small waves
    overhead = iters * fig.layers * HF_DECODE_LAYER_SECONDS[0] if engine == "hf" else 0.0
    if engine == "hf":
        ctx.assume("hf_decode_layer_seconds", HF_DECODE_LAYER_SECONDS[0], HF_DECODE_LAYER_SECONDS[1])
    gather = 0.0
    if engine == "hf" and int(cfg.zero.stage) == 3 and plan.world_size > 1:
        # ZeRO-3: the whole model gathered once (TRL ds3_gather_for_generation), else every layer at every token
        times = 1 if cfg.rollout.gather_for_generation else iters
        gather = times * ring(fig.weight_bytes, plan.world_size) / hw.link(plan.world_size)
        gather += times * fig.weight_bytes / plan.world_size / hw.host if cfg.zero.offload_param else 0.0
    ctx.assume("generation", f"{engines} engine(s) x TP {tp}, {n} completions each, {slots} at a time, {iters} "
               f"decode iterations", "the layout, rollout.engine and the KV cache left by the vLLM reservation")
    return prefill + max(weights + kv, compute, overhead) + gather


def _prefix_cache(cfg) -> bool:
    v = cfg.rollout.get("vllm")
    return bool(v is not None and v.enable_prefix_caching)


def _concurrency(ctx: Context, n: int, seq_tokens: int) -> int:
    """Sequences decoded at once: vLLM's ``max_num_seqs`` and what its KV cache holds at ``seq_tokens`` each, both
    from the memory side (core/planning/memory.py ``kv_cache``, ``max_num_seqs``: one model of the reservation for
    both sides); HF ``generate``: ``rollout.generation_batch_size`` (0: every completion of the rank at once)."""
    cfg = ctx.cfg
    if str(cfg.rollout.engine) == "hf":
        per_rank = int(cfg.rollout.generation_batch_size) // ctx.plan.world_size
        return max(1, min(n, per_rank or n))
    kv = memory.kv_cache(cfg, ctx.plan, ctx.report.get("trainer_bytes_at_vllm_start", 0))
    return max(1, min(n, memory.max_num_seqs(cfg), memory.kv_sequences(kv, seq_tokens)))


# ----------------------------------------------------------------------------- ZeRO, offload, weight sync
def zero_traffic(ctx: Context, micro_steps: int, forward_passes: int, optimizer_steps: int, gpus: int):
    """``(collective seconds, host seconds)`` of one step's ``micro_steps`` forward-backward micro-steps,
    ``forward_passes`` sharded no-grad forwards and ``optimizer_steps`` optimiser steps on one rank."""
    cfg, hw, fig = ctx.cfg, ctx.hw, ctx.policy
    z, link = cfg.zero, hw.link(gpus)
    stage, trainable = int(z.stage), _trainable_bytes(ctx)
    grad_bytes = trainable / 2 * memory.comm_dtype_bytes(cfg)  # the gradients in DeepSpeed's communication dtype
    if stage == 3:
        # a micro-step gathers every trained model (the policy, the critic); a no-grad forward one model of the
        # policy's size (old policy, reference)
        per_step = (2 + bool(cfg.model.gradient_checkpointing)) * (fig.weight_bytes + 2 * _critic_params(ctx))
        gathers = micro_steps * (2 + bool(cfg.model.gradient_checkpointing)) + forward_passes
        comm = (micro_steps * ring(per_step, gpus) + forward_passes * ring(fig.weight_bytes, gpus)
                + micro_steps * ring(grad_bytes, gpus)) / link
    elif stage in (1, 2):
        gathers = 0
        comm = (micro_steps * ring(grad_bytes, gpus) + optimizer_steps * ring(trainable, gpus)) / link
    else:
        gathers = 0
        comm = optimizer_steps * 2 * ring(grad_bytes, gpus) / link
    host = 0.0
    if z.get("offload_optimizer"):
        shard = trainable / 2 / gpus  # trainable parameters per rank
        host += optimizer_steps * (shard * (2 + 2) / hw.host + shard / CPU_ADAM_PARAMS_PER_S[0])
        ctx.assume("cpu_adam_params_per_s", CPU_ADAM_PARAMS_PER_S[0], CPU_ADAM_PARAMS_PER_S[1])
    if z.get("offload_param") and stage == 3:
        host += gathers * fig.weight_bytes / gpus / hw.host
    return comm, host


def _trainable_bytes(ctx: Context) -> float:
    """bf16 bytes of the trained parameters: LoRA's adapters when the reward model trains them, else the policy's and
    the critic's."""
    lora = ctx.cfg.train.get("lora") if ctx.cfg.loop == "rm" else None
    if lora is not None and int(lora.rank) > 0:
        return 2.0 * _lora_params(ctx, int(lora.rank))
    return 2.0 * (ctx.policy.params + _critic_params(ctx))


def _critic_params(ctx: Context) -> int:
    """The critic's parameters: its ``init_from`` checkpoint's (Open-Instruct's 8B RM under a 70B policy), else the
    policy's; 0 without one."""
    critic = ctx.cfg.get("advantage", {}).get("critic") if ctx.cfg.loop == "rl" else None
    if critic is None:
        return 0
    if not critic.init_from:
        return ctx.policy.params
    return figures(shape_config(ctx.cfg.model, critic.init_from, "advantage.critic.init_from")).params


def _lora_params(ctx: Context, rank: int) -> int:
    """LoRA adapters of rank ``rank`` on every linear layer (all-linear): ``rank x (in + out)`` per matrix."""
    fig, c = ctx.policy, shape_config(ctx.cfg.model)
    h, inter = c.hidden_size, c.intermediate_size
    per_layer = rank * ((h + fig.attn_dim) * 2 + (h + fig.kv_dim) * 2 + 3 * (h + inter))
    return fig.layers * per_layer


def weight_sync_seconds(ctx: Context) -> float:
    """The policy's weights to vLLM once per step: a ZeRO-3 gather, then a copy on the GPU (colocated) or a
    broadcast from rank 0 to the engines' GPUs over the link between them (dedicated)."""
    cfg, plan, hw, fig = ctx.cfg, ctx.plan, ctx.hw, ctx.policy
    if str(cfg.rollout.engine) == "hf":
        return 0.0
    gpus = plan.world_size
    seconds = ring(fig.weight_bytes, gpus) / hw.link(gpus) if int(cfg.zero.stage) == 3 else 0.0
    if plan.layout.mode == "dedicated":
        across = plan.layout.nodes > 1
        seconds += fig.weight_bytes / (hw.inter if across else hw.intra)
    else:
        seconds += 2 * fig.weight_bytes / plan.layout.tp / hw.mem  # read and write into vLLM's copy
    return seconds
