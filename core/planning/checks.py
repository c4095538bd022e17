"""What ``recipes.plan`` refuses before it builds any model: a layout the hardware cannot hold, a model whose
architecture is not known here. Each problem names the key, its value and what was expected."""
from __future__ import annotations

from core.errors import InputError


def hardware_problems(cfg, plan) -> list[str]:
    """A layout that cannot run on ``hardware``: more GPUs per node or in all than it has, a vLLM engine wider than
    one of its nodes (tensor parallelism runs within a node)."""
    hw, lay, name = cfg.hardware, plan.layout, hardware_choice(cfg)
    have = int(hw.nodes) * int(hw.gpus_per_node)
    want = lay.learner_gpus + lay.rollout_gpus
    errors = []
    if lay.gpus_per_node > int(hw.gpus_per_node):
        errors.append(f"layout.gpus_per_node={lay.gpus_per_node} but hardware={name} has {hw.gpus_per_node} GPUs per "
                      f"node")
    if want > have:
        errors.append(f"layout.learner_gpus + layout.rollout_gpus = {lay.learner_gpus} + {lay.rollout_gpus} = {want} "
                      f"GPUs but hardware={name} has {hw.nodes} x {hw.gpus_per_node} = {have}; choose a layout of at "
                      f"most {have} GPUs or a larger hardware profile")
    if lay.tp > int(hw.gpus_per_node):
        errors.append(f"rollout.vllm.tensor_parallel_size={lay.tp} is wider than a node of hardware={name} "
                      f"({hw.gpus_per_node} GPUs): a tensor-parallel engine runs within one node")
    return errors


def hardware_choice(cfg) -> str:
    """The ``hardware`` option the command chose (its file name), as Hydra recorded it; the GPU's name without Hydra."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return str(HydraConfig.get().runtime.choices.get("hardware"))
    return str(cfg.hardware.name)


def model_problems(cfg, plan) -> list[str]:
    """Each model the plan builds from a hub checkpoint needs its architecture here (core/models/shapes.py): the
    setting that names it, its value and the known ones."""
    from core.models.shapes import local_config

    critic = cfg.get("advantage", {}).get("critic") or {}
    keys = {critic.get("init_from"): "advantage.critic.init_from"}
    errors = []
    for source in dict.fromkeys(m.source for m in plan.models if m.source != "tiny"):
        try:
            local_config(source, keys.get(source, "model.name_or_path"))
        except InputError as e:
            errors.append(str(e))
    return errors


def check(cfg, plan) -> None:
    """Raise one :class:`InputError` listing every problem of :func:`hardware_problems` and :func:`model_problems`."""
    errors = hardware_problems(cfg, plan) + model_problems(cfg, plan)
    if errors:
        raise InputError("\n  ".join(["the plan cannot be made:", *errors]))
