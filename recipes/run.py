"""Entry point: ``python -m recipes.run [recipe=NAME] [scale=tiny] [key=value ...]``.

Composes ``conf/config.yaml`` with Hydra (no change of working directory), prepares it (core/config/pipeline.py
``prepare``: ``scale`` applied, every key checked, the run's plan derived, the config frozen) and hands it to the
loop named by ``loop`` (recipes/__init__.py ``LOOPS``). Returns the loop's objective so Hydra sweepers can optimise it.

Two things differ from a plain ``@hydra.main`` script: ``--cfg job`` prints the config the loop will run, prepared
as the loop prepares it (Hydra's own would print it before ``scale``), and a bad config, data file or resume prints its
message and exits 1 instead of a traceback; a key Hydra refuses while composing gets the nearest valid
names added. Every other error keeps its full traceback.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from contextlib import contextmanager

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from core.config.composition import register_resolvers  # noqa: E402
from core.paths import CONF_DIR  # noqa: E402
from recipes import LOOPS  # noqa: E402

register_resolvers()


def run(cfg: DictConfig) -> float | None:
    """Dispatch to the ``main`` of loop ``cfg.loop`` (recipes/__init__.py ``LOOPS``) with ``cfg`` prepared: nothing
    is built before every check passed."""
    from core.config.pipeline import prepare

    return LOOPS.get(cfg.loop)(prepare(cfg))


# Third-party deprecation warnings a run cannot act on, filtered by category and message (every other warning
# shows): torch 2.13 deprecates the collectives DeepSpeed's ZeRO-3 gathers and reduces call each step
# (``all_gather_into_tensor``, ``reduce_scatter_tensor``, from torch/distributed/distributed_c10d.py).
THIRD_PARTY_DEPRECATIONS = ((FutureWarning, r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is "
                                            r"deprecated"),)


def _quiet() -> None:
    """Keep the console to our own progress bar and summary: no per-load bars, backend banners or
    :data:`THIRD_PARTY_DEPRECATIONS`."""
    import warnings

    import transformers

    for category, message in THIRD_PARTY_DEPRECATIONS:
        warnings.filterwarnings("ignore", message=message, category=category)
    from huggingface_hub.utils import disable_progress_bars

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    disable_progress_bars()


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    from core.launch import export_submitit_ranks

    export_submitit_ranks()  # a rank started as a submitit task (hydra/launcher=slurm): RANK, WORLD_SIZE, ...
    _quiet()
    set_cpu_threads(int(cfg.cpu_threads))
    with no_run_dir_if_refused():
        return run(cfg)


@contextmanager
def no_run_dir_if_refused():
    """A command refused for its input (:class:`core.errors.InputError`) leaves no run dir behind: the dir is
    removed when it holds only what Hydra wrote there before the job started (``.hydra/`` and the job's log), so a
    resumed run's dir, or any dir holding a file of a run, stays. Removing afterwards rather than creating the dir
    later: Hydra makes the dir, writes ``.hydra/`` and opens its log file there before it calls the job, for every
    launcher (basic, submitit, each torchrun rank); deferring that would mean turning both off and redoing them
    for each, while this rule holds whichever launcher ran the job."""
    from hydra.core.hydra_config import HydraConfig

    from core.errors import InputError

    try:
        yield
    except InputError:
        hc = HydraConfig.get()
        run_dir = hc.runtime.output_dir
        if os.path.isdir(run_dir) and set(os.listdir(run_dir)) <= {hc.output_subdir, f"{hc.job.name}.log"}:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise


def set_cpu_threads(n: int) -> None:
    """``torch.set_num_threads(n)`` for ``n > 0`` (config ``cpu_threads``); 0 leaves torch's default."""
    if n < 0:
        raise ValueError(f"cpu_threads={n}: expected 0 (torch's default) or a positive thread count")
    if n:
        import torch

        torch.set_num_threads(n)


def print_job_config(argv: list[str], prepare_job=None) -> bool:
    """``--cfg job`` (``-c job``): print the config the entry point will run and return True. It is prepared as
    the entry point prepares it (``prepare_job(overrides)``; by default the loops': scaled to this machine, checked
    in the world its layout asks for, whether or not the gpu extra is installed here), so a config it would refuse
    prints its problems and nothing as config."""
    from omegaconf import OmegaConf

    from core.config.pipeline import prepare
    from core.launch import hydra_args

    args = hydra_args(argv)
    if args.cfg != "job":
        return False
    prepared = (prepare_job or (lambda o: prepare(o, launched=True, packages=False)))(args.overrides)
    print(OmegaConf.to_yaml(prepared.config, resolve=args.resolve), end="")
    return True


def _nearest(cause) -> str:
    """For a key the schema lacks (OmegaConf's ConfigKeyError or ConfigAttributeError, which carry the key and
    the schema): the nearest valid names; none for a key the schema has (a value of the wrong type)."""
    from core.config.checking import nearest_keys

    schema, key = getattr(cause, "object_type", None), getattr(cause, "key", None)
    if not (dataclasses.is_dataclass(schema) and isinstance(key, str)) or \
            key in {f.name for f in dataclasses.fields(schema)}:
        return ""
    near = nearest_keys(key, schema)
    return f"did you mean {' or '.join(near)}?" if near else ""


def cli() -> None:
    from core.config.resume import with_saved_recipe
    from core.launch import check_multirun, sweep_dirnames

    def start():
        sys.argv[1:] = with_saved_recipe(sys.argv[1:])  # a resume composes the run's recipe, not the default
        if print_job_config(sys.argv[1:]):
            return
        check_multirun(sys.argv[1:])  # what a submitit launcher cannot start, before it submits anything
        sys.argv[1:] = sweep_dirnames(sys.argv[1:])  # a multirun's job dirs named by the values they sweep
        main()

    briefly_on_input_errors(start)


def briefly_on_input_errors(entry) -> None:
    """Run ``entry`` (a ``@hydra.main`` function): a config Hydra cannot compose, an override it cannot parse and
    an :class:`core.errors.InputError` print their message and exit 1; every other error keeps its traceback."""
    from hydra.errors import ConfigCompositionException, OverrideParseException

    from core.errors import InputError

    os.environ["HYDRA_FULL_ERROR"] = "1"  # errors reach this function, which prints input errors briefly
    try:
        entry()
    except ConfigCompositionException as e:
        cause = e.__cause__
        hint = _nearest(cause) if cause is not None else ""
        sys.exit("\n".join(x for x in (str(e), str(cause) if cause else "", hint) if x))
    except OverrideParseException as e:  # an override Hydra cannot parse
        sys.exit(str(e))
    except InputError as e:
        sys.exit(f"{type(e).__name__}: {e}")


if __name__ == "__main__":
    cli()
