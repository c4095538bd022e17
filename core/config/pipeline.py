"""One pipeline from a command line to the run it describes: compose -> scale -> check -> derive -> freeze.

Every entry point calls :func:`prepare`: ``python -m recipes.run`` (the loops, and ``--cfg job``), ``python -m
core.launch``, ``recipes.explain`` and ``recipes.probe``; ``recipes.eval`` takes its own config (conf/eval.yaml)
through the same steps (core/evaluation/checks.py ``prepare_eval``).

1. compose: conf/config.yaml with the overrides, as the CLI composes it (Hydra's own config set for this process,
   so ``${hydra:...}`` resolves and the command-line keys are known), or a config composed already;
2. scale: ``source.defaults=written`` applied first (core/config/release.py), then ``scale`` (core/config/scale.py),
   the keys set on the command line kept as given by both; a resume of a
   run dir that holds ``config.yaml`` takes that config instead, but for the keys typed now
   (core/config/resume.py ``saved_base``);
3. check: every problem of the config, raised together as one ConfigError (core/config/validate.py ``problems``);
4. derive: the run's plan (core/config/plan.py): batches per rank, steps, schedule, layout, models;
5. freeze: the checked config made read-only; the loops read its values resolved once, at their first read, into
   plain read-only containers (``Prepared.frozen``, core/config/frozen.py).

Nothing changes the config afterwards: what the data decides (the RL steps of ``train.epochs``) is the plan's
(``plan.for_rows``), and ``config.yaml`` records it (:func:`recorded`).
"""
from __future__ import annotations

import copy
import functools
import json
from dataclasses import dataclass
from typing import Generic, Sequence, TypeVar

from omegaconf import DictConfig, OmegaConf

from core.config.frozen import FrozenConfig, freeze
from core.config.layout import world_size
from core.config.plan import PLANS
from core.config.resume import hydra_run_dir, saved_base
from core.config.release import with_source_defaults
from core.config.scale import apply_scale, command_line_keys
from core.config.validate import problems, refuse

P = TypeVar("P")


@dataclass(frozen=True)
class Prepared(Generic[P]):
    """A checked config and what follows from it. ``config``: the read-only ``DictConfig`` (``--cfg job`` prints
    it, ``config.yaml`` records it); ``plan``: the derived figures (core/config/plan.py); ``frozen``: the config's
    values resolved into plain read-only containers (what the loops read, core/config/frozen.py)."""

    config: DictConfig
    plan: P

    @functools.cached_property
    def frozen(self) -> FrozenConfig:
        return freeze(self.config)


def prepare(source: Sequence[str] | DictConfig | Prepared, *, world: int | None = None, launched: bool = False,
            packages: bool = True) -> Prepared:
    """``source`` (command-line overrides, a composed config, or one prepared already, returned as it is) through
    the pipeline. ``world``: the ranks this process runs among (default WORLD_SIZE), the machine ``scale=tiny``
    collapses the layout to, and the world the checks run in; ``launched``: check in the world the scaled layout
    asks for instead (its learners, one rank each, as a launcher starts them: ``core.launch``, ``recipes.explain``,
    ``recipes.probe``, ``--cfg job``). ``packages=False`` leaves out whether the gpu extra the config names is
    installed here. Raises :class:`core.config.validate.ConfigError` listing every problem."""
    if isinstance(source, Prepared):
        return source
    world = world_size() if world is None else world
    cfg = composed(source)
    typed = command_line_keys()  # after composing: composing sets Hydra's config, where the command line is
    cfg = with_source_defaults(cfg, typed)  # source.defaults=written: the file's own release's (core/config/release.py)
    cfg = saved_base(apply_scale(cfg, typed, world), typed, hydra_run_dir())
    refuse(problems(cfg, cfg.layout.learner_gpus if launched else world, packages))
    return finished(cfg, PLANS.get(cfg.loop)(cfg))


def composed(source: Sequence[str] | DictConfig, config_name: str = "config") -> DictConfig:
    """A config of its own for the pipeline: ``source`` copied when composed already (the pipeline makes its
    result read-only, not the caller's), else the primary config ``config_name`` composed with those overrides
    as the CLI composes it."""
    if OmegaConf.is_config(source):
        return copy.deepcopy(source)
    from core.config.composition import compose

    return compose(list(source), with_hydra=True, config_name=config_name)


def finished(cfg: DictConfig, plan) -> Prepared:
    """The freeze step: ``cfg`` made read-only, with its ``plan``."""
    OmegaConf.set_readonly(cfg, True)
    return Prepared(cfg, plan)


def recorded(cfg: DictConfig | FrozenConfig, plan) -> DictConfig:
    """What ``config.yaml`` records of a run: ``cfg`` resolved, with the values its plan derived from the data
    (``RECORDED``: the RL steps of ``train.epochs`` in ``train.total_steps``, where runs have recorded them and
    ``recipes.compare`` reads them)."""
    node = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg)
                            else json.loads(json.dumps(cfg)))
    for key, attr in plan.RECORDED:
        OmegaConf.update(node, key, getattr(plan, attr), merge=False)
    return node
