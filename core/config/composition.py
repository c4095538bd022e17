"""Composing the configs outside ``@hydra.main``, and the OmegaConf resolvers they use.

Every entry point registers the resolvers (``recipes/run.py``, the benches, the tests' compose fixture):
``${root:}``, the project root, ``${run_stamp:}``, the launch time and a suffix unique to the launch that
keeps run dirs apart when many start in the same second (one value for every rank of a ``torchrun`` launch),
and ``${codeforces_tiny:}``, the folder of the tiny Codeforces problems (written by their data source), which the
Codeforces recipe's ``verifier.tiny`` names as cf_code's tests folder.
:func:`compose` is Hydra's compose API on ``conf/``, which Hydra's docs keep for tests, notebooks and tools like the
benches; runs go through ``@hydra.main``.
"""
from __future__ import annotations

import functools
import secrets
import time

from omegaconf import OmegaConf

from core.paths import CONF_DIR, PROJECT_ROOT


@functools.cache
def run_stamp() -> str:
    """``2025-01-31_12-00-00_a1b2c3``: the launch time and six hex characters, the same for every interpolation in
    this process and for every rank of one ``torchrun`` launch (rank 0's: ranks start apart, so their own clocks
    may straddle a second, and a plain ``torchrun`` gives them no shared id), different between launches."""
    from core.training.distributed import launch_agreed

    return launch_agreed("run_stamp", f"{time.strftime('%Y-%m-%d_%H-%M-%S')}_{secrets.token_hex(3)}")


def _codeforces_tiny() -> str:
    """The tiny Codeforces problems' folder in the local cache (core/data/codeforces_tiny.py); the data source
    ``codeforces_tiny`` writes it when it first reads the rows, before any reward is computed."""
    from core.data import codeforces_tiny

    return str(codeforces_tiny.folder(build=False))


def register_resolvers() -> None:
    """The resolvers, and every typed schema in Hydra's ConfigStore under ``schema/<group>/<name>`` (the YAML
    files name it; idempotent)."""
    from hydra.core.config_store import ConfigStore

    from core.config.schema import SCHEMAS

    for key, node in SCHEMAS.items():
        group, _, name = key.rpartition("/")
        ConfigStore.instance().store(group=f"schema/{group}" if group else "schema", name=name, node=node)
    resolvers = (("root", lambda: str(PROJECT_ROOT)), ("run_stamp", run_stamp), ("codeforces_tiny", _codeforces_tiny),
                 ("job_dirname", job_dirname))
    for name, fn in resolvers:
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn, use_cache=True)  # cached in the config: it travels with it


def job_dirname(num, overrides: str) -> str:
    """A multirun job's dir: its number, then the values it sweeps (Hydra's ``hydra.job.override_dirname``, the
    overrides every job shares left out by core/launch.py :func:`~core.launch.sweep_dirnames`): ``0_seed=0``. A
    ``/`` in a value would nest dirs, so it becomes ``_``."""
    return f"{num}_{overrides.replace('/', '_')}" if overrides else str(num)


def compose(overrides: list[str], with_hydra: bool = False, config_name: str = "config"):
    """The primary config ``config_name`` (``eval``: ``python -m recipes.eval``'s, once core/evaluation/schema.py
    ``store`` has run) with ``overrides``, as ``python -m recipes.run`` would compose it. ``with_hydra``:
    Hydra's own config is composed too and set as this process's ``HydraConfig``, so ``${hydra:...}``
    interpolations (``recipe_name``) resolve, as they do in a run, and its run and sweep dirs are resolved."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    register_resolvers()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name=config_name, overrides=overrides, return_hydra_config=with_hydra)
    if with_hydra:
        for node in (cfg.hydra.run, cfg.hydra.sweep):  # resolved while the job keys they name are here
            node.dir = str(node.dir)
        HydraConfig.instance().set_config(cfg)
        with open_dict(cfg):
            del cfg["hydra"]
    return cfg
