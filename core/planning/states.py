"""Resident memory per GPU: what a run holds across every micro-step (the trained models' states under ZeRO, the
frozen reference, the colocated vLLM reservation). ``recipes.probe`` adds each phase's measured activations to it;
``recipes.plan`` (core/planning/memory.py) breaks it down further. One source for both."""
from __future__ import annotations

from core.errors import InputError

GiB = 2 ** 30


def prompt_tokens(cfg) -> int:
    """Max prompt tokens: ``data.max_prompt_tokens``, else vLLM's ``max_model_len`` minus the new tokens."""
    if cfg.data.get("max_prompt_tokens"):
        return int(cfg.data.max_prompt_tokens)
    vllm = cfg.rollout.get("vllm")
    if vllm is not None and vllm.max_model_len:
        return int(vllm.max_model_len) - int(cfg.rollout.max_new_tokens)
    raise InputError("data.max_prompt_tokens=null and rollout.vllm.max_model_len=null: the probe needs the longest "
                     "prompt; set data.max_prompt_tokens")


def param_counts(model) -> tuple[int, int, int]:
    """``(trainable, frozen, largest layer)`` parameter counts; tied weights once, the largest layer as DeepSpeed's
    ``estimate_zero3_model_states_mem_needs_all_live`` takes it (the most parameters one module owns directly)."""
    seen = {}
    for p in model.parameters():
        seen.setdefault(id(p), p)
    trainable = sum(p.numel() for p in seen.values() if p.requires_grad)
    frozen = sum(p.numel() for p in seen.values() if not p.requires_grad)
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return trainable, frozen, largest


def zero_total(n: int, largest: int, zero, gpus: int) -> int:
    """Bytes per GPU of the weights, gradients, fp32 master weights and Adam moments of ``n`` trained parameters.

    ZeRO-2 and -3: DeepSpeed's estimators (deepspeed/runtime/zero/stage_1_and_2.py
    ``estimate_zero2_model_states_mem_needs``: ``2N + 18N/g``; stage3.py ``estimate_zero3_model_states_mem_needs``:
    ``18N/g`` + 4 x the largest layer gathered, ``2N/g`` with the optimiser offloaded, the layer only with the
    parameters offloaded too). ZeRO-1 partitions the optimiser only: ``4N + 16N/g``. Stage 0 (the plain engine,
    core/training/engine.py): bf16 weights and gradients, fp32 master copies and their gradients, Adam: ``20N``."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    stage, offload = int(zero.stage), bool(zero.offload_optimizer)
    if stage == 3:
        return estimate_zero3_model_states_mem_needs(
            n, largest, num_gpus_per_node=gpus, cpu_offload=offload, cpu_offload_params=bool(zero.offload_param))[1]
    if stage == 2:
        return estimate_zero2_model_states_mem_needs(n, num_gpus_per_node=gpus, cpu_offload=offload)[1]
    if stage == 1:
        return 4 * n + (0 if offload else 16 * n // gpus)
    return 20 * n


def state_parts(model, zero, gpus: int) -> dict[str, int]:
    """A trained model's states per GPU, split: ``frozen`` (parameters that do not train, LoRA's base: 2 bytes each,
    sharded under ZeRO-3 only), ``weights`` (the bf16 copy the forward reads: ``2N``, ``2N/g`` + the gathered layer
    at ZeRO-3), ``gradients`` (bf16 and fp32: ``6N/g`` sharded at ZeRO-2/3, ``2N + 4N/g`` at ZeRO-1, ``6N`` at 0,
    none on the GPU with the optimiser offloaded) and ``optimizer`` (fp32 master weights and Adam's two moments, the
    rest of :func:`zero_total`: ``12N/g``, ``12N`` at stage 0). The split follows the comment of DeepSpeed's ZeRO-2
    estimator (18 = 2 grads_16bit + 4 grads_32bit + 4 params_32bit + 8 optimizer_states_32bit); the sum is the
    estimator's figure, unchanged."""
    n, frozen, largest = param_counts(model)
    stage, g = int(zero.stage), gpus
    total = zero_total(n, largest, zero, gpus)
    offloaded = bool(zero.offload_optimizer)
    if stage == 3:
        weights = (0 if zero.offload_param and offloaded else 2 * n // g) + 4 * largest
        grads = 0 if offloaded else 6 * n // g
    else:
        weights = 2 * n
        grads = {0: 6 * n, 1: 2 * n + (0 if offloaded else 4 * n // g), 2: 0 if offloaded else 6 * n // g}[stage]
    return {"frozen": 2 * frozen // (g if stage == 3 else 1), "weights": weights, "gradients": grads,
            "optimizer": total - weights - grads}


def model_states(model, zero, gpus: int) -> int:
    """Bytes per GPU of a trained model's states: the sum of :func:`state_parts`."""
    return sum(state_parts(model, zero, gpus).values())


def frozen_bytes(model, zero, gpus: int) -> int:
    """The reference policy per GPU: whole in its dtype (stages 0-2, as TRL keeps it), a shard under ZeRO-3 (plus the
    layer it gathers), nothing but that layer when ``zero.offload_reference`` keeps the shards in CPU memory."""
    _, n, largest = param_counts(model)
    if int(zero.stage) != 3:
        return 2 * n
    return 2 * largest + (0 if zero.offload_reference else 2 * n // gpus)


def engine_start_bytes(model, zero, gpus: int) -> int:
    """A trained model's states per GPU just after its optimiser engine is built: all of them under DeepSpeed (ZeRO 1-3
    allocate the fp32 master weights, Adam's moments and the gradient partitions in their constructors:
    deepspeed/runtime/zero/stage3.py ``_setup_for_real_optimizer``, stage_1_and_2.py ``initialize_optimizer_states``);
    on the plain engine (stage 0) the bf16 weights (2N) and their fp32 master copies (4N) only: torch's AdamW creates
    its moments at the first step and the gradients come with the first backward (core/training/engine.py)."""
    parts = state_parts(model, zero, gpus)
    return sum(parts.values()) if int(zero.stage) else parts["frozen"] + 3 * parts["weights"]


def at_vllm_start(cfg, plan, models: dict, gpus: int) -> int:
    """Bytes per GPU the trainer holds when a colocated vLLM engine is built (recipes/rl.py ``setup``: after the
    optimiser engines, before the reference goes onto the device): the trained models' states
    (:func:`engine_start_bytes`) and the overhead every process carries (core/planning/memory.py ``overhead``: CUDA
    context, NCCL, DeepSpeed's buckets). What ``rollout.vllm.gpu_memory_utilization_of=free`` sees taken."""
    if cfg.loop != "rl" or cfg.rollout.engine != "vllm":
        return 0
    from core.planning.memory import overhead

    trained = [models[r] for r in ("policy", "critic") if models.get(r) is not None]
    return sum(engine_start_bytes(m, cfg.zero, gpus) for m in trained) + sum(b for _, b, _ in overhead(cfg, plan, gpus))


def vllm_bytes(cfg, at_start: int = 0) -> tuple[int, int]:
    """``(awake, during training)`` bytes of a vLLM colocated on a learner GPU: its reservation while it generates
    (core/planning/memory.py ``vllm_reservation``: ``gpu_memory_utilization`` x the GPU, or under ``free`` its weights,
    activations, CUDA graphs and the KV cache sized from what is free beside the ``at_start`` bytes the trainer held
    when it was built); while the trainer runs the same, or asleep (``rollout.vllm.enable_sleep_mode``) its CUDA
    graphs. Sleep frees only what vLLM allocated through its ``CuMemAllocator`` pools, the weights and the KV cache
    (vllm/v1/worker/gpu_worker.py ``sleep``: ``CuMemAllocator.sleep(offload_tags=("weights",))`` at level 1, which
    backs the weights up in CPU memory, ``()`` at level 2, which discards them; docs.vllm.ai features/sleep_mode); the
    CUDA graphs, captured afterwards into torch's graph pool, stay on the GPU (vLLM 0.31.0, constraints/gpu.txt; a
    later vLLM can put the graph pool under sleep too, ``--sleep-mode-offload-cudagraph``), as do NCCL's buffers,
    NCCL's own allocation (counted in core/planning/memory.py ``overhead``). Dedicated vLLM GPUs: none here."""
    if cfg.loop != "rl" or cfg.rollout.engine != "vllm":
        return 0, 0
    from core.planning.memory import vllm_reservation

    parts = vllm_reservation(cfg, at_start)
    awake = parts["reservation_bytes"]
    return awake, parts["cuda_graph_bytes"] if cfg.rollout.vllm.enable_sleep_mode else awake


def resident(cfg, models: dict, gpus: int, at_start: int = 0) -> dict:
    """Bytes per GPU held across every micro-step: model states of the trained models, the reference, vLLM (``at_start``:
    :func:`at_vllm_start`)."""
    awake, training = vllm_bytes(cfg, at_start)
    return {"model_states": model_states(models["policy"], cfg.zero, gpus),
            "critic_states": model_states(models["critic"], cfg.zero, gpus) if models["critic"] is not None else 0,
            "reference": frozen_bytes(models["reference"], cfg.zero, gpus) if models["reference"] is not None else 0,
            "vllm_training": training, "vllm_awake": awake}
