"""Multi-node launch through existing tools (docs/launch.md): what each launcher needs from the config, checked
before anything is submitted, and the rank environment each gives the loop.

Both paths give every rank what ``torch.distributed``'s ``env://`` reads (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT), so the loop (core/training/distributed.py) cannot tell them apart:

- submitit, ``python -m recipes.run -m hydra/launcher=slurm``: one Slurm job per Hydra job, one Slurm task per
  learner GPU, each task running the Hydra job; :func:`export_submitit_ranks` sets the variables from Slurm's
  with submitit's ``TorchDistributedEnvironment``, the pattern submitit documents
  (facebookincubator/submitit docs/examples/torch_distributed.py); the answer in submitit issue #1764 is not to
  run torchrun inside submitit tasks.
- ``sbatch launch/slurm.sbatch``: one task per node running torchrun with a c10d rendezvous at the first node
  (torchtune recipes/dev/multinode_grpo.sbatch, Open-R1 slurm/train.slurm), plus one ``vllm serve`` per engine
  on the rollout GPUs of a dedicated layout (rollout=vllm_server). ``python -m core.launch [overrides]`` prints
  its plan (:func:`plan`) as shell variables, after every check a rank would run.
"""
from __future__ import annotations

import json
import os
import shlex
import sys

from core.config.validate import ConfigError, final_config

_PLUGIN = "hydra_plugins.hydra_submitit_launcher.submitit_launcher."
# Keys of hydra.launcher that every Slurm submission needs from the site (the cluster), not the recipe: they go in
# the untracked conf/local/slurm/site.yaml (template launch/slurm_site.example.yaml) or on the command line.
SITE_KEYS = ("partition", "account")


def export_submitit_ranks() -> None:
    """Inside a submitit task that torchrun did not start: export this task's rank variables from Slurm's (or
    the local executor's). Every GPU stays visible and ``LOCAL_RANK`` picks this rank's (``device=auto``), as
    under torchrun. A preset MASTER_ADDR gives way to the job's first node; a preset MASTER_PORT is kept."""
    if "SUBMITIT_EXECUTOR" not in os.environ or "WORLD_SIZE" in os.environ:
        return
    from submitit.helpers import TorchDistributedEnvironment

    TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)


def launch_problems(cfg, launcher) -> list[str]:
    """What the submitit launcher ``launcher`` (``hydra.launcher``) cannot start for ``cfg``: site keys left
    unset, a dedicated server (learner ranks only), a task count other than the layout's learners."""
    target = str(launcher.get("_target_", ""))
    if not target.startswith(_PLUGIN):
        return []
    errors = []
    missing = [f"hydra.launcher.{k}" for k in SITE_KEYS if target.endswith("SlurmLauncher") and launcher[k] is None]
    if missing:
        errors.append(f"{' and '.join(missing)} not set: Slurm site settings go in conf/local/slurm/site.yaml "
                      f"(untracked; copy launch/slurm_site.example.yaml) or on the command line")
    if cfg.layout.mode == "dedicated":
        errors.append("layout.mode=dedicated: the submitit launcher starts learner ranks only; start the generation "
                      "server with them through sbatch launch/slurm.sbatch (docs/launch.md)")
    ranks = int(launcher.nodes) * int(launcher.tasks_per_node)
    if ranks != int(cfg.layout.learner_gpus):
        errors.append(f"hydra.launcher.nodes x hydra.launcher.tasks_per_node = {launcher.nodes} x "
                      f"{launcher.tasks_per_node} = {ranks} tasks but layout.learner_gpus={cfg.layout.learner_gpus}: "
                      f"submitit starts one rank per task")
    return errors


def check_multirun(argv: list[str]) -> None:
    """Before a multirun (``-m``) submits anything: raise :class:`ConfigError` with every
    :func:`launch_problems` of its launcher, for the config its sweep overrides leave out (Hydra's own master
    config of a multirun)."""
    if not {"-m", "--multirun"} & set(argv) and "hydra.mode=MULTIRUN" not in argv:
        return
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from core.config.composition import compose

    parsed = OverridesParser.create().parse_overrides([a for a in argv if not a.startswith("-")])
    cfg = compose([o.input_line for o in parsed if not o.is_sweep_override()], with_hydra=True)
    errors = launch_problems(cfg, HydraConfig.get().launcher)
    if errors:
        raise ConfigError("cannot submit:\n  - " + "\n  - ".join(errors))


def placement(cfg) -> dict[str, object]:
    """Where the layout's roles run, GPUs counted node by node: learners on the first ``learner_gpus``, the
    dedicated rollout GPUs right after them, one vLLM server per engine (``SERVERS``: ``node:devices:port``
    each, engine ``j`` on ``rollout.server.port + j``), none straddling a node."""
    from core.config.layout import engines, tensor_parallel

    lay, tp = cfg.layout, tensor_parallel(cfg)
    gpn, learners, rollout = int(lay.gpus_per_node), int(lay.learner_gpus), int(lay.rollout_gpus)
    servers = []
    for j in range(engines(cfg) if rollout else 0):
        node, first = divmod(learners + j * tp, gpn)  # the engine's first GPU: its node and its index there
        if first + tp > gpn:
            raise ConfigError(f"vLLM engine {j} (rollout.vllm.tensor_parallel_size={tp}) would start at GPU {first} of "
                              f"node {node} and span nodes: with layout.learner_gpus={learners} and "
                              f"layout.gpus_per_node={gpn}, make the learners fill their nodes or TP divide the rest")
        servers.append(f"{node}:{_span(first, first + tp)}:{int(cfg.rollout.server.port) + j}")
    shared = rollout > 0 and learners % gpn > 0  # learners and servers split the last learner node
    return {"NODES": int(lay.nodes), "GPUS_PER_NODE": gpn, "LEARNER_NODES": -(-learners // gpn),
            "NPROC_PER_NODE": min(learners, gpn), "LEARNER_DEVICES": _span(0, learners % gpn) if shared else "",
            "ROLLOUT_GPUS": rollout, "TP": tp, "ENGINES": len(servers), "SERVERS": " ".join(servers)}


def _span(lo: int, hi: int) -> str:
    return ",".join(str(i) for i in range(lo, hi))


def serve_args(cfg) -> list[str]:
    """``vllm serve`` flags besides model, port and TP: the ``rollout.vllm`` settings, then the ones TRL 1.16's
    ``trl vllm-serve`` imposes (trl/scripts/vllm_serve.py ``build_command``: the NCCL weight-transfer engine
    VLLMClient pushes through, processed log-probs for the importance correction, no cap on log-probs)."""
    v = cfg.rollout.vllm
    args = ["--host", "0.0.0.0", "--data-parallel-size", "1", "--gpu-memory-utilization", str(v.gpu_memory_utilization),
            "--dtype", str(v.dtype), "--seed", str(v.seed)]
    for key in ("max_model_len", "max_num_seqs", "max_num_batched_tokens"):
        if v[key] is not None:
            args += [f"--{key.replace('_', '-')}", str(v[key])]
    args += ["--enable-prefix-caching" if v.enable_prefix_caching else "--no-enable-prefix-caching"]
    return args + ["--weight-transfer-config", json.dumps({"backend": "nccl"}), "--logprobs-mode", "processed_logprobs",
                   "--max-logprobs", "-1"]


def plan(overrides: list[str]) -> dict[str, object]:
    """What launch/slurm.sbatch starts for ``overrides``: the placement, the servers and their flags, the model
    they serve and the run dir every rank shares, after every check a rank would run (in a world of the layout's
    learners)."""
    from hydra.core.hydra_config import HydraConfig

    from core.config.composition import compose

    cfg = compose(overrides, with_hydra=True)
    run_dir = str(HydraConfig.get().run.dir)
    cfg = final_config(cfg, world=int(cfg.layout.learner_gpus))
    values = placement(cfg)
    if not values["ROLLOUT_GPUS"]:
        return {**values, "SERVE_ARGS": "", "SERVER_TIMEOUT": 0, "MODEL": cfg.model.name_or_path or "",
                "RUN_DIR": run_dir}
    if not cfg.model.name_or_path:
        raise ConfigError("layout.mode=dedicated serves model.name_or_path with vllm serve, and it is null (a tiny "
                          "model built in the process has no path to serve)")
    return {**values, "SERVE_ARGS": shlex.join(serve_args(cfg)),
            "SERVER_TIMEOUT": int(float(cfg.rollout.server.timeout_s)), "MODEL": cfg.model.name_or_path,
            "RUN_DIR": run_dir}


def main(argv: list[str]) -> None:
    """``python -m core.launch [overrides]``: the plan as ``KEY=value`` lines a shell can ``eval``."""
    from core.errors import InputError

    try:
        values = plan(argv)
    except InputError as e:
        sys.exit(f"{type(e).__name__}: {e}")
    print("\n".join(f"{key}={shlex.quote(str(value))}" for key, value in values.items()))


if __name__ == "__main__":
    main(sys.argv[1:])
