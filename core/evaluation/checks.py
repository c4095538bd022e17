"""``python -m recipes.eval``'s config through the pipeline's steps (core/config/pipeline.py): compose conf/eval.yaml,
check it (an evaluation has no scale), derive the model it evaluates (:class:`Source`), freeze (:func:`prepare_eval`).

The check refuses, before a weight is read: every key against its schema, the model (a training run dir or a hub
name / local dir), the sets and their verifiers, the samples and k of the metrics, the engine. Every problem found
is collected and raised together, each naming the key, the value and what was expected (as core/config/validate.py
does for training).
"""
from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from core.config.checking import check_schema
from core.config.pipeline import Prepared, composed, finished
from core.config.schema import PromptDataConfig
from core.errors import InputError
from core.evaluation.schema import EvalRunConfig, EvalSetConfig, store
from core.evaluation.sets import SET_KEYS
from core.models.loading import model_source_problem
from verifiers import VERIFIERS

ENGINES = ("hf", "vllm")  # one process samples: the server engine serves weights a trainer pushes


class EvalConfigError(InputError):
    """An eval config that cannot run; the message lists every problem found."""


@dataclass(frozen=True)
class Source:
    """The model evaluated: its ``from_pretrained`` path, the recipe and seed its rows carry, and the training
    run dir it came from (None for a hub name or local dir)."""

    path: str
    recipe: str
    seed: int
    run_dir: str | None


def prepare_eval(source: Sequence[str] | DictConfig | Prepared) -> Prepared[Source]:
    """``source`` (overrides of conf/eval.yaml, a composed eval config, or one prepared already, returned as it is)
    composed, checked (raises :class:`EvalConfigError` listing every problem), its :class:`Source` derived and
    frozen."""
    if isinstance(source, Prepared):
        return source
    store()  # conf/eval.yaml names its schema
    cfg = composed(source, config_name="eval")
    errors = problems(cfg)
    if errors:
        raise EvalConfigError("invalid eval config:\n  - " + "\n  - ".join(errors))
    return finished(cfg, resolve_source(cfg))


def problems(cfg) -> list[str]:
    """Every reason the eval config ``cfg`` cannot run."""
    errors = check_schema(cfg, root=EvalRunConfig)
    errors += _source_problems(cfg)
    errors += _set_problems(cfg)
    errors += _metric_problems(cfg)
    errors += _engine_problems(cfg.rollout)
    defaults = PromptDataConfig()
    for key in SET_KEYS:
        if cfg.data[key] != getattr(defaults, key):
            errors.append(f"data.{key}={cfg.data[key]!r}: recipes.eval reads each set's rows and columns from its "
                          f"entry in sets (sets.<name>.{key.removeprefix('eval_')}); data.* is the prompt format "
                          f"(template, chat_template, system_prompt, ...)")
    return errors


def _source_problems(cfg) -> list[str]:
    run_dir, name = cfg.run_dir, cfg.model.name_or_path
    if run_dir is None and name is None:
        return ["nothing to evaluate: give run_dir=<a training run dir, holding model/ and config.yaml> or "
                "model.name_or_path=<a hub name, or a local dir holding config.json>"]
    if run_dir is not None and name is not None:
        return [f"run_dir={run_dir} and model.name_or_path={name}: give one of them (a run dir's model is its "
                f"model/)"]
    if name is not None:
        problem = model_source_problem("model.name_or_path", name, tokenizer=True)
        return [problem] if problem else []
    d = Path(str(run_dir)).expanduser()
    if not d.is_dir():
        return [f"run_dir={run_dir}: no such directory"]
    if not (d / "config.yaml").exists():
        return [f"run_dir={run_dir}: no config.yaml, so it is not a run dir of python -m recipes.run"]
    sub = str(cfg.run_model)
    if not (d / sub / "config.json").exists():
        if sub == "best":
            return [f"run_dir={run_dir} run_model=best: no best/ (the run saves it with train.keep_best=true)"]
        return [f"run_dir={run_dir}: no saved model in model/ (a run writes it when it finishes; a killed run "
                f"resumes with python -m recipes.run hydra.run.dir={run_dir} resume=true)"]
    return []


def set_node(cfg, name: str):
    """``sets.<name>`` as a typed :class:`EvalSetConfig` node, interpolations resolved."""
    entry = OmegaConf.to_container(cfg.sets[name], resolve=True)
    return OmegaConf.merge(OmegaConf.structured(EvalSetConfig), entry)


def set_verifier(cfg, set_cfg) -> str:
    """The verifier a set is scored with: its own, or the one the preset maps it to (``eval.verifiers``)."""
    return cfg.eval.verifiers.get(set_cfg.verifier, set_cfg.verifier)


def _set_problems(cfg) -> list[str]:
    names = list(cfg.eval.sets)
    if not names:
        return [f"eval.sets is empty: name one or more of {sorted(cfg.sets)}"]
    errors = [f"eval.sets names {name} {names.count(name)} times; name each set once"
              for name in sorted(set(names)) if names.count(name) > 1]
    for name in names:
        if name not in cfg.sets:
            errors.append(f"eval.sets: unknown set {name!r}; known: {', '.join(sorted(cfg.sets))} (or add one: "
                          f"+sets.{name}={{path:FILE,prompt_key:COLUMN,answer_key:COLUMN}}, docs/eval.md)")
            continue
        entry = cfg.sets[name]
        found = check_schema(entry, root=EvalSetConfig, prefix=f"sets.{name}.") if OmegaConf.is_dict(entry) else \
            [f"sets.{name}={entry!r}: expected a mapping of set keys (path, prompt_key, answer_key, ...)"]
        if found:
            errors += found
            continue
        try:
            s = set_node(cfg, name)
        except OmegaConfBaseException as e:
            errors.append(f"sets.{name}: {e.msg if hasattr(e, 'msg') else e}".splitlines()[0])
            continue
        need = {"file": "path", "hub": "hub_name"}[s.source]
        if not s[need]:
            errors.append(f"sets.{name}.source={s.source} needs sets.{name}.{need}")
        errors += VERIFIERS.problems(set_verifier(cfg, s), s.verifier_kwargs, f"sets.{name}.verifier",
                                     f"sets.{name}.verifier_kwargs", f"sets.{name}.accuracy_term", s.accuracy_term)
    return errors


def _metric_problems(cfg) -> list[str]:
    e, greedy, errors = cfg.eval, cfg.rollout.greedy, []
    if greedy and e.samples > 1:
        errors.append(f"eval.samples={e.samples} with rollout.greedy=true: greedy decoding gives one completion "
                      f"per prompt; sample (rollout.greedy=false) or set eval.samples=1")
    if greedy and e.pass_k:
        errors.append(f"eval.pass_k={list(e.pass_k)} with rollout.greedy=true: pass@k needs sampled completions "
                      f"(greedy reports pass@1); set rollout.greedy=false or eval.pass_k=[]")
    for k in e.pass_k:
        if not 1 <= k <= e.samples:
            errors.append(f"eval.pass_k: k={k} with eval.samples={e.samples}; pass@k needs 1 <= k <= n "
                          f"(n completions per problem)")
    return errors


def _engine_problems(r) -> list[str]:
    if r.engine not in ENGINES:
        return [f"rollout.engine={r.engine}: recipes.eval samples with one of {list(ENGINES)} in its own process "
                f"(rollout=hf or rollout=vllm)"]
    if r.engine != "vllm":
        return []
    errors = []
    if importlib.util.find_spec("vllm") is None:
        errors.append("rollout.engine=vllm but vLLM is not installed here: install the gpu extra on a CUDA machine "
                      "(pip install -e '.[gpu]'), or sample with rollout=hf")
    if r.vllm.tensor_parallel_size != 1:
        errors.append(f"rollout.vllm.tensor_parallel_size={r.vllm.tensor_parallel_size}: recipes.eval runs one "
                      f"process, so one GPU per engine (tensor_parallel_size=1)")
    return errors


def resolve_source(cfg) -> Source:
    """The model a checked ``cfg`` evaluates; a run dir gives its recipe and training seed to the rows."""
    if cfg.run_dir is None:
        return Source(str(cfg.model.name_or_path), str(cfg.model.name_or_path), cfg.seed, None)
    d = Path(str(cfg.run_dir)).expanduser().resolve()
    saved = yaml.safe_load((d / "config.yaml").read_text()) or {}
    summary = d / "summary.json"
    recipe = json.loads(summary.read_text()).get("recipe") if summary.exists() else None
    return Source(str(d / str(cfg.run_model)), str(recipe or saved.get("recipe_name") or d.name),
                  int(saved.get("seed", 0)), str(d))
