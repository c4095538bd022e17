"""What a colocated vLLM engine holds on a GPU beside its KV cache, estimated from the model's config before vLLM
measures anything, and the KV cache each meaning of ``rollout.vllm.gpu_memory_utilization`` gives it
(``rollout.vllm.gpu_memory_utilization_of``). One source for the engine (core/rollout/vllm.py passes the ``free``
budget to vLLM) and the planner (core/planning/memory.py).

- ``card`` (stock vLLM, TRL): the engine may use ``fraction x the whole GPU``; its KV cache is what that leaves after
  its weights, its profile run's activations and CUDA graphs (vLLM 0.31 vllm/v1/worker/gpu_worker.py
  ``determine_available_memory``: requested memory minus the non-KV memory), and vLLM refuses to start unless that
  much is free when it starts (vllm/v1/worker/utils.py ``request_memory``).
- ``free`` (veRL 0.2's SPMD vLLM 0.6.3, which SimpleRL-Zoo ran): the KV cache is ``fraction x`` what is free on the GPU
  once its weights are loaded and its profile run is done (verl/third_party/vllm/vllm_v_0_6_3/worker.py
  ``determine_num_available_blocks``, "NOTE(sgm) [VERL] use the remaining memory": ``num_gpu_blocks =
  int((free_gpu_memory * gpu_memory_utilization) // cache_block_size)``, the stock formula commented out below it).
"""
from __future__ import annotations

from core.planning.model_figures import figures

GiB = 2 ** 30
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# The profile run's tokens where the config leaves max_num_batched_tokens to vLLM (its default varies by version, GPU
# and entry point: 8192 assumed).
PROFILE_TOKENS = 8192
# vLLM's default max_num_seqs (vLLM 0.31 vllm/engine/arg_utils.py ``get_batch_defaults``): 1024 on GPUs of >= 70 GiB
# other than the A100 (its name checked lower-cased), else 256.
VLLM_SEQS = {"large": 1024, "small": 256}
# vLLM sets up its tensor-parallel communicator before it snapshots the free memory (gpu_worker.py ``init_device``), so
# it sees less free than the engine measured just before: NCCL's buffers, up to 256 MiB per communicator
# (core/planning/memory.py NCCL_PER_COMMUNICATOR), twice over for margin.
START_SLACK = 512 * 2 ** 20


def default_max_num_seqs(memory_bytes: float, gpu_name: str) -> int:
    """vLLM's ``max_num_seqs`` when the config leaves it unset, on a GPU of ``memory_bytes`` named ``gpu_name``."""
    large = memory_bytes >= 70 * GiB and "a100" not in gpu_name.lower()
    return VLLM_SEQS["large" if large else "small"]


def weight_bytes(config, dtype_bytes: int, tp: int) -> int:
    """The engine's weights per GPU: every parameter (tied ones once) in its dtype, split over its TP ranks."""
    return figures(config).params * dtype_bytes // tp


def profile_activation_bytes(config, tp: int, tokens: int, seqs: int, dtype_bytes: int) -> int:
    """The peak of vLLM's profile forward per GPU (an estimate: vLLM measures it only once its weights are in): the
    residual and hidden states plus the MLP's gate/up and activation outputs of ``tokens`` tokens, and the sampler's
    fp32 logits of the last token of ``seqs`` sequences."""
    h, inter = config.hidden_size, config.intermediate_size
    return tokens * (2 * h + 3 * inter // tp) * dtype_bytes + seqs * config.vocab_size * 4


def free_kv_bytes(free: int, fraction: float, weights: int, activations: int) -> int:
    """veRL's KV cache under ``free``: ``fraction`` of what ``free`` bytes leave once the engine's weights and its
    profile run's activations are in (negative when they do not fit)."""
    return int(fraction * (free - weights - activations))
