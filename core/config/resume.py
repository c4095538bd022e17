"""The config a run dir was started with, and what a resume may change of it.

A resume continues the run its checkpoint belongs to: the recipe, model, data, batch shapes, optimiser and
every algorithm setting stay as they were, or the steps after the checkpoint would silently train under
another config than ``config.yaml`` records (a new learning rate, say, while the optimiser state restores
the old schedule). So a resume whose config differs from the saved one outside :data:`RESUMABLE` is
refused, before any model is built, with every difference listed; ``config.yaml`` is rewritten only once
the resume has loaded its checkpoint.

Resuming from the command line (``python -m recipes.run hydra.run.dir=<dir> resume=auto``) starts from the saved
config, not from the defaults: :func:`saved_base` (core/config/pipeline.py ``prepare``) takes every key of
``config.yaml`` except those typed on this command line, so a resume typed as the README says continues the run as it
was started (its steps, checkpointing, ``kl.coef=0``) and only what is typed now is checked against it.
"""
from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Sequence

import yaml
from omegaconf import OmegaConf, open_dict

from core.training.checkpoint import ResumeError
from core.writes import replace_text

log = logging.getLogger(__name__)

# Keys a resume may change: how long it runs and how it reports and checkpoints, what a non-finite step does (a run
# stopped at one resumes with train.on_nonfinite=skip), where it runs and reads its data (a dedicated
# generation server's address is the new allocation's).
RESUMABLE = ("resume", "resume_allow_changes", "train.total_steps", "train.eval_every", "train.checkpoint_every",
             "train.keep_checkpoints", "train.on_nonfinite", "logger.", "device", "cpu_threads",
             "collective_timeout_s", "paths.", "rollout.server.")
# What ``resume_allow_changes=true`` adds: the optimiser and its schedule (applied to the restored optimiser
# by core/training/optim.py ``retune``, not ignored).
OPTIMISATION = ("optim.",)


def write_config(run_dir: Path, cfg) -> None:
    """``config.yaml``, the resolved config (a ``DictConfig`` or the frozen one), written atomically."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    node = cfg if OmegaConf.is_config(cfg) else OmegaConf.create(json.loads(json.dumps(cfg)))
    replace_text(run_dir / "config.yaml", OmegaConf.to_yaml(node, resolve=True))


# A group chosen on the command line whose keys land elsewhere than under its own name (a ``_global_`` package).
_GROUP_KEYS = {"recipe": ("recipe_name",)}


def saved_base(cfg, typed: Sequence[str], run_dir: Path | None):
    """``cfg`` (composed, scaled) with every key of ``run_dir/config.yaml`` that ``typed`` (the keys or groups set on
    this command line, core/config/scale.py ``command_line_keys``) does not name set to its saved value, when ``cfg``
    resumes (``resume`` true or auto) a run dir that holds one; else ``cfg`` as it is. The saved config is resolved
    and scaled already, so it replaces the defaults and the scale's values alike (a ``scale=tiny`` run resumed
    without typing it stays tiny); the typed keys keep this command's values and :func:`check_resume_config`
    refuses those a resume may not change. A key the schema no longer has stays out (and that check lists it)."""
    saved_path = Path(run_dir) / "config.yaml" if run_dir is not None else None
    if cfg.resume not in (True, "auto") or saved_path is None or not saved_path.is_file():
        return cfg
    saved = yaml.safe_load(saved_path.read_text())
    if not isinstance(saved, dict):
        raise ResumeError(f"resume: {saved_path} holds no config, so the run it belongs to cannot be continued")
    names = [k for t in typed for k in (t.lstrip("+~"), *_GROUP_KEYS.get(t.lstrip("+~"), ()))]
    cfg = copy.deepcopy(cfg)
    lacking = _take(cfg, saved, "", tuple(names) + tuple(f"{k}." for k in names))
    if lacking:
        raise ResumeError(f"resume: {saved_path} holds keys this command's config has no place for "
                          f"({', '.join(lacking[:6])}{', ...' if len(lacking) > 6 else ''}): name the recipe and "
                          f"groups the run was started with (its .hydra/overrides.yaml) on the command line")
    return cfg


def _take(node, saved: dict, prefix: str, typed: tuple[str, ...]) -> list[str]:
    """``node``'s keys set to ``saved``'s, recursively, but for those ``typed`` names (a typed key, or a key below
    a typed group); returns the keys its schema lacks. A free-form dict (``verifier.kwargs``) ends with the saved
    keys and the typed ones; a node the composed config holds as no dict (``rollout.vllm`` where the default
    rollout has none) takes the saved one whole."""
    free, lacking = OmegaConf.get_type(node) is dict, []
    for k, v in saved.items():
        key = f"{prefix}{k}"
        if _matches(key, typed):
            continue
        if k not in node and not free:
            lacking.append(key)
            continue
        child = node.get(k)
        if isinstance(v, dict) and OmegaConf.is_dict(child):
            lacking += _take(child, v, f"{key}.", typed)
            continue
        with open_dict(node):
            if isinstance(v, dict):
                node.merge_with({k: v})  # from the parent: builds the field's schema type (rollout.vllm)
            else:
                node[k] = v
    if free:
        with open_dict(node):
            for k in [k for k in node if k not in saved and not _matches(f"{prefix}{k}", typed)]:
                del node[k]
    return lacking


def with_saved_recipe(argv: list[str]) -> list[str]:
    """``argv`` (a ``python -m recipes.run`` command line) with ``recipe=<the run's>`` added when it resumes
    (``resume`` true or auto) the run dir ``hydra.run.dir`` names, which holds ``config.yaml``, and names no recipe
    itself: the recipe picks the loop and the groups it was composed from (their schemas), which Hydra composes
    before any of our code runs. The run's other values come from ``config.yaml`` (:func:`saved_base`)."""
    from core.launch import hydra_args

    values = dict(o.split("=", 1) for o in hydra_args(argv).overrides if "=" in o)
    saved = Path(values.get("hydra.run.dir", "")) / "config.yaml"
    if values.get("resume", "").lower() not in ("true", "auto") or "recipe" in values or not saved.is_file():
        return argv
    recipe = (yaml.safe_load(saved.read_text()) or {}).get("recipe_name")
    return [*argv, f"recipe={recipe}"] if recipe else argv


def hydra_run_dir() -> Path | None:
    """This Hydra job's run dir (its output dir, or the run dir a composed config names: ``--cfg job``); None
    outside Hydra."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get()
    out = OmegaConf.select(hc, "runtime.output_dir", default=None) or OmegaConf.select(hc, "run.dir", default=None)
    return Path(out) if out else None


def check_resume_config(run_dir: Path, cfg) -> None:
    """Raise :class:`ResumeError` listing each key whose value differs from ``run_dir/config.yaml`` outside
    :data:`RESUMABLE` (and :data:`OPTIMISATION` when ``cfg.resume_allow_changes``), or the missing file.
    Allowed optimisation changes are logged, each with its old and new value."""
    saved_path = Path(run_dir) / "config.yaml"
    if not saved_path.exists():
        raise ResumeError(f"resume: {saved_path} is missing, so the checkpoint's config cannot be checked")
    saved = _flat(yaml.safe_load(saved_path.read_text()))
    new = _flat(OmegaConf.to_container(cfg, resolve=True))
    allowed = RESUMABLE + (OPTIMISATION if cfg.resume_allow_changes else ())
    differ = [k for k in sorted(saved.keys() | new.keys()) if saved.get(k, "<absent>") != new.get(k, "<absent>")]
    changed = [k for k in differ if not _matches(k, allowed)]
    for k in differ:
        if _matches(k, OPTIMISATION) and k not in changed:
            log.warning("resume changes %s: %r -> %r (resume_allow_changes=true)", k, saved.get(k), new.get(k))
    if changed:
        lines = [f"{k}: {saved.get(k, '<absent>')!r} -> {new.get(k, '<absent>')!r}" for k in changed]
        raise ResumeError(f"resume: the config differs from the one {run_dir} was started with, outside what a "
                          f"resume may change ({', '.join(allowed)}):\n    " + "\n    ".join(lines) +
                          "\n  start a new run (from the checkpoint's model if you like) to change these" +
                          ("; resume_allow_changes=true lets a resume change optim.*"
                           if not cfg.resume_allow_changes and any(_matches(k, OPTIMISATION) for k in changed) else ""))


def _matches(key: str, allowed: tuple[str, ...]) -> bool:
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in allowed)


def _flat(node, prefix: str = "") -> dict:
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out or {prefix[:-1]: {}}
    return {prefix[:-1]: node}
