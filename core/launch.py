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
  what it starts (:func:`sbatch_values`) as shell variables, after every check a rank would run.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

from core.config.plan import Layout
from core.config.validate import ConfigError
from core.errors import InputError

_PLUGIN = "hydra_plugins.hydra_submitit_launcher.submitit_launcher."
# Keys of hydra.launcher that every Slurm submission needs from the site (the cluster), not the recipe: they go in
# the untracked conf/local/slurm/site.yaml (template launch/slurm_site.example.yaml) or on the command line.
SITE_KEYS = ("partition", "account")


def export_submitit_ranks() -> None:
    """Inside a submitit task that torchrun did not start: export this task's rank variables from Slurm's (or
    the local executor's). Every GPU stays visible and ``LOCAL_RANK`` picks this rank's (``device=auto``), as
    under torchrun. A preset MASTER_ADDR gives way to the job's first node; a preset MASTER_PORT is kept. In a job
    of several nodes, also ``GLOO_SOCKET_IFNAME`` (unless set): the interface this node reaches another through
    (the first node, or from the first node the second), so gloo does not bind to a loopback address its name may
    resolve to (core/training/distributed.py ``check_gloo_address``; launch/slurm.sbatch does the same)."""
    if "SUBMITIT_EXECUTOR" not in os.environ or "WORLD_SIZE" in os.environ:
        return
    from submitit import JobEnvironment
    from submitit.helpers import TorchDistributedEnvironment

    from core.training.distributed import peer_interface

    TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
    job = JobEnvironment()
    if job.num_nodes > 1 and not os.environ.get("GLOO_SOCKET_IFNAME"):
        interface = peer_interface(job.hostnames[1 if job.node == 0 else 0])
        if interface:
            os.environ["GLOO_SOCKET_IFNAME"] = interface


def launch_problems(cfg, launcher) -> list[str]:
    """What the submitit launcher ``launcher`` (``hydra.launcher``) cannot start for ``cfg``: site keys left
    unset, a Slurm job that a requeue could not continue (``resume`` other than auto), a dedicated server (learner
    ranks only), a task count other than the layout's learners."""
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
    if target.endswith("SlurmLauncher") and cfg.resume != "auto":
        errors.append(f"resume={cfg.resume}: Slurm requeues a job that is preempted or times out (submitit's "
                      f"checkpoint, hydra.launcher.max_num_timeout={launcher.max_num_timeout}) and the requeued job "
                      f"runs the same command; add resume=auto so it continues its run dir (docs/reliability.md)")
    return errors


def hydra_args(argv: list[str]) -> argparse.Namespace:
    """``argv`` (a ``python -m recipes.run`` command line) as ``@hydra.main`` reads it, with Hydra's own parser
    (hydra/_internal/utils.py ``get_args_parser``, Hydra 1.3): the flags, each taking its value (``--cfg``/``-c``,
    ``--package``/``-p``, ``--config-path``/``-cp``, ``--config-name``/``-cn``, ``--config-dir``/``-cd``,
    ``--info``/``-i`` with an optional one, ``--experimental-rerun``), and the ``overrides`` apart."""
    from hydra._internal.utils import get_args_parser

    return get_args_parser().parse_args(argv)


EXCLUDE_KEY = "hydra.job.config.override_dirname.exclude_keys"


def sweep_dirnames(argv: list[str]) -> list[str]:
    """``argv`` of a multirun with Hydra told to name each job's dir by the values it sweeps only: the overrides
    every job shares (``scale=tiny``) go to ``hydra.job.config.override_dirname.exclude_keys`` (Hydra's own
    mechanism; conf/config.yaml ``hydra.sweep.subdir``), unless the command line sets that key itself."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    args = hydra_args(argv)
    if not args.multirun or any(o.startswith(EXCLUDE_KEY) for o in args.overrides):
        return argv
    shared = [o.key_or_group for o in OverridesParser.create().parse_overrides(args.overrides)
              if not o.is_sweep_override() and not o.key_or_group.startswith("hydra")]
    return [*argv, f"{EXCLUDE_KEY}=[{','.join(repr(k) for k in shared)}]"]


def check_multirun(argv: list[str]) -> None:
    """Before a multirun (``-m``) submits anything: raise :class:`ConfigError` with every
    :func:`launch_problems` of its launcher, for the config its sweep overrides leave out (Hydra's own master
    config of a multirun). A command line that only shows something (``--cfg``, ``--info``, ``--help``) submits
    nothing and is not checked; with ``-m`` it is refused, as Hydra refuses it (one mode per command line:
    hydra/_internal/utils.py ``_run_hydra``), but with the way to show what the multirun would compose."""
    args = hydra_args(argv)
    if not (args.multirun or "hydra.mode=MULTIRUN" in args.overrides):
        return
    shown = [flag for flag, given in (("--cfg", args.cfg), ("--info", args.info),
                                      ("--shell-completion", args.shell_completion)) if given]
    if shown and args.multirun:
        raise InputError(f"-m with {shown[0]}: Hydra runs one of --run, --multirun, --cfg, --info and "
                         f"--shell-completion; leave out -m to show the config a multirun composes (--cfg hydra "
                         f"shows hydra.launcher)")
    if shown or args.help or args.hydra_help:
        return
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from core.config.composition import compose

    parsed = OverridesParser.create().parse_overrides(args.overrides)
    cfg = compose([o.input_line for o in parsed if not o.is_sweep_override()], with_hydra=True)
    errors = launch_problems(cfg, HydraConfig.get().launcher)
    if errors:
        raise ConfigError("cannot submit:\n  - " + "\n  - ".join(errors))


def placement(lay: Layout, port: int | None) -> dict[str, object]:
    """Where the layout's roles run (a plan's :class:`core.config.plan.Layout`), GPUs counted node by node: learners
    on the first ``learner_gpus``, the dedicated rollout GPUs right after them, one vLLM server per engine
    (``SERVERS``: ``node:devices:port`` each, engine ``j`` on ``port + j``: ``rollout.server.port``), none
    straddling a node."""
    gpn, learners, rollout, tp = lay.gpus_per_node, lay.learner_gpus, lay.rollout_gpus, lay.tp
    servers = []
    for j in range(lay.engines if rollout else 0):
        node, first = divmod(learners + j * tp, gpn)  # the engine's first GPU: its node and its index there
        if first + tp > gpn:
            raise ConfigError(f"vLLM engine {j} (rollout.vllm.tensor_parallel_size={tp}) would start at GPU {first} of "
                              f"node {node} and span nodes: with layout.learner_gpus={learners} and "
                              f"layout.gpus_per_node={gpn}, make the learners fill their nodes or TP divide the rest")
        servers.append(f"{node}:{_span(first, first + tp)}:{port + j}")
    shared = rollout > 0 and learners % gpn > 0  # learners and servers split the last learner node
    return {"NODES": lay.nodes, "GPUS_PER_NODE": gpn, "LEARNER_NODES": -(-learners // gpn),
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


def sbatch_values(overrides: list[str]) -> dict[str, object]:
    """What launch/slurm.sbatch starts for ``overrides``: the placement, the servers and their flags, the model
    they serve and the run dir every rank shares, after every check a rank would run (core/config/pipeline.py
    ``prepare``, in a world of the layout's learners), but whether the gpu extra is installed where this runs:
    each rank checks its own."""
    from hydra.core.hydra_config import HydraConfig

    from core.config.pipeline import prepare
    from core.config.resume import with_saved_recipe

    prepared = prepare(with_saved_recipe(overrides), launched=True, packages=False)  # a resume: the run's recipe
    return launch_values(prepared, str(HydraConfig.get().run.dir))


def launch_values(prepared, run_dir: str) -> dict[str, object]:
    """:func:`sbatch_values` of a prepared config (core/config/pipeline.py) whose ranks share ``run_dir``."""
    from omegaconf import OmegaConf

    cfg = prepared.config
    values = placement(prepared.plan.layout, OmegaConf.select(cfg, "rollout.server.port"))
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
    """``python -m core.launch [overrides]``: :func:`sbatch_values` as ``KEY=value`` lines a shell can ``eval``."""
    from core.errors import tool_main

    tool_main(lambda a: print("\n".join(f"{k}={shlex.quote(str(v))}" for k, v in sbatch_values(a).items())), argv,
              __doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
