"""The ``layout`` group (conf/layout/): the GPUs of a run and who uses them, checked before any model is built.

A layout has ``nodes x gpus_per_node`` GPUs. ``learner_gpus`` of them train, one rank each (the process
group's world, which must be the one torchrun started). Generation either shares the learners' GPUs
(``mode=colocate``: TRL ``vllm_mode=colocate``, OpenRLHF ``--colocate_all_models``, veRL's hybrid engine) or
has ``rollout_gpus`` of its own behind vLLM servers (``mode=dedicated``, ``rollout=vllm_server``:
Open-Instruct's vLLM actors, Open-R1's ``trl vllm-serve`` node). vLLM engines span
``rollout.vllm.tensor_parallel_size`` GPUs each (that key is the one place the TP size lives):
``engines = rollout_gpus / TP`` when dedicated, ``learner_gpus / TP`` when colocated. Each source's layout is an
option of the group, citing it; docs/launch.md has the table.
"""
from __future__ import annotations

import os

from omegaconf import OmegaConf

from core.registry import Registry


# Layout modes (``layout.mode``) -> fn(layout) -> problems; ``engine_gpus`` names the key whose GPUs the
# vLLM engines occupy.
MODES: Registry = Registry("layout mode")


@MODES.register("colocate", engine_gpus="learner_gpus")
def _colocate(lay) -> list[str]:
    """Engines run on the learner GPUs, which every rank holds: no GPU only generates."""
    if int(lay.rollout_gpus):
        return [f"layout.rollout_gpus={lay.rollout_gpus} with layout.mode=colocate: colocated engines run on the "
                f"learner GPUs, so rollout_gpus must be 0; use layout.mode=dedicated for GPUs that only generate"]
    return []


@MODES.register("dedicated", engine_gpus="rollout_gpus")
def _dedicated(lay) -> list[str]:
    """A server generates on GPUs of its own, after the learners' (Open-Instruct, Open-R1 on Slurm)."""
    if int(lay.rollout_gpus) < 1:
        return ["layout.mode=dedicated with layout.rollout_gpus=0: a dedicated server needs GPUs of its own; "
                "use layout.mode=colocate to generate on the learner GPUs"]
    return []


def tensor_parallel(cfg) -> int:
    """vLLM's tensor-parallel size (``rollout.vllm.tensor_parallel_size``); 1 for an engine without one (hf)."""
    vllm = OmegaConf.select(cfg, "rollout.vllm")
    return int(vllm.tensor_parallel_size) if vllm is not None else 1


def engines(cfg) -> int:
    """vLLM engines of the layout (data-parallel copies): the GPUs they occupy over the TP size."""
    lay = cfg.layout
    return int(lay[MODES.meta(lay.mode)["engine_gpus"]]) // tensor_parallel(cfg)


def world_size() -> int:
    """The ranks this process runs among: torchrun's ``WORLD_SIZE`` (or submitit's, exported by
    core/launch.py); 1 for a single process."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def layout_problems(cfg, world: int) -> list[str]:
    """Every way ``cfg.layout`` cannot run in a world of ``world`` ranks: more GPUs than the nodes hold, rollout
    GPUs on the learners' without colocation, engines wider than a node or not dividing their GPUs, learner
    nodes started unevenly, a learner count other than the world size."""
    lay, tp = cfg.layout, tensor_parallel(cfg)
    nodes, gpn, learners, rollout = (int(lay[k]) for k in ("nodes", "gpus_per_node", "learner_gpus", "rollout_gpus"))
    total, errors = nodes * gpn, MODES.get(lay.mode)(lay)
    if learners > total:
        errors.append(f"layout.learner_gpus={learners} is more GPUs than layout.nodes x layout.gpus_per_node = "
                      f"{nodes} x {gpn} = {total}")
    elif learners + rollout > total:
        errors.append(f"layout.learner_gpus + layout.rollout_gpus = {learners} + {rollout} = {learners + rollout} "
                      f"GPUs do not fit in layout.nodes x layout.gpus_per_node = {nodes} x {gpn} = {total}: the "
                      f"rollout GPUs would overlap the learners' without colocation; use layout.mode=colocate, fewer "
                      f"rollout_gpus or more nodes")
    if learners > gpn and learners % gpn:
        errors.append(f"layout.learner_gpus={learners} spans nodes but is not a multiple of layout.gpus_per_node="
                      f"{gpn}: torchrun starts the same number of ranks on every learner node")
    if tp > gpn:
        errors.append(f"rollout.vllm.tensor_parallel_size={tp} is larger than layout.gpus_per_node={gpn}: a "
                      f"tensor-parallel engine runs within one node")
    key = MODES.meta(lay.mode)["engine_gpus"]
    if int(lay[key]) % tp:
        errors.append(f"layout.{key}={lay[key]} is not a multiple of rollout.vllm.tensor_parallel_size={tp}: each "
                      f"vLLM engine takes {tp} of the {'learner' if key == 'learner_gpus' else 'rollout'} GPUs")
    errors += _server_problems(cfg)
    if learners != world:
        given = f"WORLD_SIZE={os.environ['WORLD_SIZE']}" if "WORLD_SIZE" in os.environ else "no WORLD_SIZE: one process"
        errors.append(f"layout.learner_gpus={learners} but this run has {world} rank(s) ({given}); start one rank per "
                      f"learner GPU (torchrun, hydra/launcher=slurm or launch/slurm.sbatch: docs/launch.md), or use "
                      f"layout=single (what torchrun gives) or scale=tiny")
    return errors


def _server_problems(cfg) -> list[str]:
    """Dedicated GPUs are reached through vLLM servers and only there: ``rollout.engine=vllm_server`` iff
    ``layout.mode=dedicated``, one ``rollout.server.hosts`` entry per engine, no sleep mode (a server keeps its GPU)."""
    dedicated, server = cfg.layout.mode == "dedicated", cfg.rollout.engine == "vllm_server"
    if dedicated != server:
        return [f"layout.mode={cfg.layout.mode} with rollout.engine={cfg.rollout.engine}: GPUs that only generate are "
                f"reached through vLLM servers, so layout.mode=dedicated goes with rollout=vllm_server and only "
                f"with it (colocated: rollout=hf or rollout=vllm)"]
    if not server:
        return []
    errors, hosts, n = [], list(cfg.rollout.server.hosts), engines(cfg)
    if len(hosts) != n:
        errors.append(f"rollout.server.hosts has {len(hosts)} host(s) but the layout has {n} vLLM engine(s) "
                      f"(layout.rollout_gpus={cfg.layout.rollout_gpus} / rollout.vllm.tensor_parallel_size="
                      f"{tensor_parallel(cfg)}): give one host per engine (launch/slurm.sbatch sets them)")
    if cfg.rollout.vllm.enable_sleep_mode:
        errors.append("rollout.vllm.enable_sleep_mode=true with rollout.engine=vllm_server: a server keeps its GPUs; "
                      "sleep mode frees a colocated engine's memory for training (rollout=vllm)")
    return errors


def collapse(world: int) -> dict:
    """What ``scale=tiny`` makes of a layout: the machine at hand, one node whose ``world`` ranks all learn,
    generation colocated (core/config/scale.py)."""
    return {"mode": "colocate", "nodes": 1, "gpus_per_node": world, "learner_gpus": world, "rollout_gpus": 0}
