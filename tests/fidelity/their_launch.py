"""The environment ``accelerate launch`` gives a source's script, for a driver run under ``torchrun`` in a source env
(tests/fidelity/open_instruct_rm.py, trl_grpo.py; never in .venv)."""
from __future__ import annotations

import os


def accelerate_env(flags: list[str], mixed_precision: str | None = None) -> None:
    """Set what ``accelerate launch FLAGS --num_processes WORLD_SIZE [--mixed_precision MP] script.py`` gives each
    process, by the env's accelerate's own launcher code (``_validate_launch_command``, ``prepare_deepspeed_cmd_env``:
    the config file's DeepSpeed plugin, ZeRO stage, offloading and mixed precision as ``ACCELERATE_*`` variables);
    the ranks' own variables are torchrun's. ``mixed_precision`` None keeps the config's."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    given = ["--num_processes", os.environ["WORLD_SIZE"]]
    given += ["--mixed_precision", mixed_precision] if mixed_precision is not None else []
    args = launch_command_parser().parse_args([*flags, *given, "script.py"])
    args, defaults, mp_from_config = _validate_launch_command(args)
    # as launch_command does before deepspeed_launcher (accelerate commands/launch.py, 0.31 and 1.4 alike): the
    # config's DeepSpeed fields, and mixed_precision when the config set it
    fields = list(defaults.deepspeed_config) + (["mixed_precision"] if mp_from_config else [])
    args.deepspeed_fields_from_accelerate_config = ",".join(fields)
    _, env = prepare_deepspeed_cmd_env(args)
    os.environ.update({k: v for k, v in env.items() if k.startswith(("ACCELERATE_", "FSDP_"))})
