"""veRL's FSDP engine on the CPU: the SimpleRL-Zoo engine check's source side (docs/fidelity.md "Engines"), run by
tests/fidelity/verl_grpo.py under ``torchrun`` in the veRL 0.2.0.post2 env when GIVEN_JSON names an ``engine``.

The actor and the reference are built by veRL's own ``ActorRolloutRefWorker._build_model_optimizer``
(verl/workers/fsdp_workers.py @0.2.0.post2), as its ``init_model`` calls it for the hybrid worker: the actor's
weights in fp32, the reference's in bf16, each wrapped in FSDP1 (``FullyShardedDataParallel``) with
``FULL_SHARD`` over every rank (``get_sharding_strategy`` of the 1-D mesh ``create_device_mesh`` builds for
``fsdp_size: -1``), its transformer-layer wrap policy, ``MixedPrecision(param_dtype=bf16, reduce_dtype=fp32,
buffer_dtype=fp32)`` (its defaults: the config sets no ``mixed_precision``) and rank 0's weights broadcast
(``sync_module_states``); AdamW over the actor's sharded fp32 flat parameters (the fp32 master weights) and veRL's
constant schedule. ``DataParallelPPOActor`` then runs on each rank's chunk of the batch as the worker's
``compute_log_prob``, ``compute_ref_log_prob`` and ``update_actor`` do: FSDP gathers the bf16 parameters for each
forward and backward, reduce-scatters the gradients in fp32 (mean over ranks) and clips by the global norm.

What a CPU needs, each the least that lets that code run (:func:`cpu_stand_ins`):

- the device: ``torch.cuda.current_device()`` is the CPU (FSDP's ``device_id``), the mesh is the CPU's, the process
  group gloo (the worker's ``init_process_group("nccl")`` is not reached: the group exists);
- FSDP's guard that refuses CPU module states under ``sync_module_states`` (torch/distributed/fsdp/_init_utils.py
  ``_check_module_states_for_sync_module_states``, for NCCL) is lifted: the broadcast itself runs on gloo;
- the reference's ``CPUOffload(offload_params=True)`` is dropped: FSDP pins the offloaded shards (``pin_memory``,
  which fails without an accelerator: "Cannot access accelerator device when none is available"); here every
  parameter is in host memory anyway, and the forward is the same;
- ``attn_implementation='flash_attention_2'`` loads as ``sdpa`` (flash-attn's kernels are CUDA's);
  ``log_gpu_memory_usage`` logs nothing (it reads CUDA's allocator);
- CUDA's autocast: ``_forward_micro_batch`` runs under ``torch.autocast(device_type='cuda', dtype=bfloat16)``,
  which a CPU turns off (torch warns). The forward is bf16 either way (FSDP casts the parameters), but on a GPU two
  results are fp32: the per-token log-probs (flash-attn's Triton ``cross_entropy_loss``, which loads the bf16 logits
  as fp32; veRL takes it whenever flash-attn imports, as in the recipe's GPU env) and the entropy (softmax and
  logsumexp are on CUDA autocast's fp32 list). Both are computed here in fp32 from the bf16 logits, as there.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

import verl.utils.torch_functional as verl_F


def cpu_stand_ins() -> None:
    """Install what the CPU needs before veRL builds its FSDP modules (the module docstring says why each)."""
    import torch.distributed.fsdp as fsdp
    import transformers
    from torch.distributed.fsdp import _init_utils

    import verl.workers.fsdp_workers as workers

    torch.cuda.current_device = lambda: torch.device("cpu")
    _init_utils._check_module_states_for_sync_module_states = lambda module_states: None
    offload = fsdp.CPUOffload
    fsdp.CPUOffload = lambda offload_params=False: None if offload_params else offload(offload_params=False)
    load = transformers.AutoModelForCausalLM.from_pretrained.__func__

    def sdpa(cls, *args, **kwargs):
        return load(cls, *args, **{**kwargs, "attn_implementation": "sdpa"})

    transformers.AutoModelForCausalLM.from_pretrained = classmethod(sdpa)
    workers.log_gpu_memory_usage = lambda *args, **kwargs: None

    def cross_entropy_loss(logits, labels):  # flash-attn's (losses, z_losses), in fp32 as its kernel computes
        return F.cross_entropy(logits.float(), labels, reduction="none"), torch.zeros(labels.shape)

    verl_F.FLAH_ATTN_CROSS_ENTROPY_LOSS_AVAILABLE, verl_F.cross_entropy_loss = True, cross_entropy_loss
    entropy = verl_F.entropy_from_logits
    verl_F.entropy_from_logits = lambda logits: entropy(logits.float())  # [n, R] fp32, as under CUDA's autocast


def worker(src: dict, rank: int, world: int):
    """veRL's hybrid worker (actor, rollout and reference) as ``__init__`` leaves it, without Ray or vLLM: its rank,
    its 1-D FSDP mesh over every rank and its config (the recipe's keys, the actor's FSDP and optimiser config)."""
    from torch.distributed.device_mesh import init_device_mesh

    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    w = ActorRolloutRefWorker.__new__(ActorRolloutRefWorker)
    w._rank = rank
    w.device_mesh = init_device_mesh("cpu", (world,), mesh_dim_names=["fsdp"])  # create_device_mesh, fsdp_size -1
    w._is_actor = w._is_rollout = w._is_ref = True  # role actor_rollout_ref
    w.config = OmegaConf.create({"rollout": {"name": "vllm"}, "actor": src["actor"], "ref": src["ref"],
                                 "model": src["model"]})
    return w


def build(src: dict, path, meta: dict, rank: int, world: int):
    """The actor (FSDP module, optimiser, schedule) and the reference's FSDP module, by ``_build_model_optimizer`` as
    ``init_model`` calls it; the schedule's horizon is the run's RL steps (ray_trainer.py injects
    ``total_training_steps``)."""
    w = worker(src, rank, world)
    optim = OmegaConf.merge(w.config.actor.optim, {"total_training_steps": meta["total_steps"]})
    actor, optimizer, scheduler, _ = w._build_model_optimizer(
        model_path=str(path), fsdp_config=w.config.actor.fsdp_config, optim_config=optim, override_model_config={},
        use_remove_padding=False, enable_gradient_checkpointing=w.config.model.get("enable_gradient_checkpointing"),
        role="actor")
    ref = w._build_model_optimizer(model_path=str(path), fsdp_config=w.config.ref.fsdp_config, optim_config=None,
                                   override_model_config={}, use_remove_padding=False, role="ref")[0]
    return actor, optimizer, scheduler, ref


def full_weights(module) -> dict:
    """The actor's full fp32 state dict (its sharded flat parameters gathered: the master weights; a collective)."""
    from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel, StateDictType

    with FullyShardedDataParallel.state_dict_type(module, StateDictType.FULL_STATE_DICT,
                                                  FullStateDictConfig(offload_to_cpu=False, rank0_only=False)):
        return {k: v.detach().float().clone() for k, v in module.state_dict().items()}


def sharding(module) -> str:
    """What FSDP did with the actor, for the report: its strategy, this rank's share of the flat parameters and the
    model's parameter count (FULL_SHARD over 2 ranks: about half each)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    local = sum(p.numel() for p in module.parameters())
    with FullyShardedDataParallel.summon_full_params(module, writeback=False):
        full = sum(p.numel() for p in module.parameters())
    return f"{module.sharding_strategy.name}, rank 0 holds {local} of {full} parameters"
