"""Shared test helpers: a tiny model, the real CLI in a subprocess, `recipes.explain` in this process."""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.config import schema
from core.paths import PROJECT_ROOT

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 256, "tie_word_embeddings": True}


def tiny_model(arch: str = "qwen2", seed: int = 0):
    from core.models.loading import load_causal_lm, load_tokenizer, model_dir

    cfg = schema.node(schema.ModelConfig, name_or_path=None, arch=arch, tiny=TINY, init_seed=seed, dtype="float32")
    path = model_dir(cfg)
    return load_causal_lm(path, cfg), load_tokenizer(path)


def option_parts(path: Path) -> tuple[type, tuple[Path, ...], dict]:
    """A group option's (or primary config's) schema (named in its defaults list, or by the option of its group it
    extends), the options it extends, and its own values (Hydra's own ``hydra`` node left out)."""
    from omegaconf import OmegaConf

    from core.evaluation.schema import EvalRunConfig

    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    raw.pop("hydra", None)
    named, bases = None, []
    for entry in raw.pop("defaults", []):
        if isinstance(entry, str) and entry.startswith("/schema/"):
            named = {**schema.SCHEMAS, "eval": EvalRunConfig}[entry.removeprefix("/schema/").removesuffix("@_here_")]
        elif isinstance(entry, str) and entry != "_self_":  # another option of the group (not a group choice)
            bases.append(path.parent / f"{entry}.yaml")
    named = named or next((option_parts(b)[0] for b in bases), None)
    assert named is not None, f"{path}: names no schema and extends no option that does"
    return named, tuple(bases), raw


def option_node(path: Path, own: dict | None = None):
    """The group option at ``path`` as Hydra composes it: its schema, the options it extends, then its own values
    (``own`` in their place when given)."""
    from omegaconf import OmegaConf

    named, bases, values = option_parts(path)
    extended = [option_node(base) for base in bases]
    return OmegaConf.merge(OmegaConf.structured(named), *extended, values if own is None else own)


def group_option(name: str, values: dict | None = None, **kw):
    """The group option ``name`` (``"advantage/grpo"``: conf/advantage/grpo.yaml) with ``values`` and ``kw`` merged
    over it: a node outside a composed run whose required keys (``???`` in the schema) hold the option's values."""
    from omegaconf import OmegaConf

    from core.paths import CONF_DIR

    return OmegaConf.merge(option_node(CONF_DIR / f"{name}.yaml"), values or {}, kw)


def slow(*values, **kwargs):
    """A parametrize case that runs in ``make test-slow``: ``make test`` keeps one or two of a family, not each."""
    return pytest.param(*values, marks=pytest.mark.slow, **kwargs)


def explain(*overrides: str) -> subprocess.CompletedProcess:
    """``python -m recipes.explain OVERRIDES`` in this process (a CLI start costs ~6 s of imports here; the CLI
    itself is tested in test_explain.py): its printed lines, or its input error's message with status 1."""
    from recipes.explain import main

    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out):
        try:
            main(list(overrides))
        except SystemExit as e:  # sys.exit("message"): Python prints it to stderr and exits 1
            code = e.code if isinstance(e.code, int) else 1
            err.write(f"{e.code}\n" if isinstance(e.code, str) else "")
    return subprocess.CompletedProcess(["recipes.explain", *overrides], code, out.getvalue(), err.getvalue())


# Small, fast settings for end-to-end runs of the real CLI.
FAST = ["logger.progress=false", "logger.tensorboard=false", "train.total_steps=2", "train.prompts_per_step=4",
        "train.group_size=4", "train.mini_batch_size=16", "train.micro_batch_size=8", "train.eval_prompts=8",
        "train.warm_start.steps=5", "train.warm_start.holdout=8", "data.generator.num_train=64",
        "data.generator.num_eval=8",
        "model.tiny.hidden_size=32", "model.tiny.intermediate_size=64"]


def torchrun(nproc: int) -> list[str]:
    """``torchrun`` with ``nproc`` ranks on this machine, on a free port, and, like a plain ``torchrun``, no run id
    shared by the ranks (``--standalone`` would give them one); the program and its arguments follow."""
    return [sys.executable, "-m", "torch.distributed.run", "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0",
            "--nnodes=1", f"--nproc_per_node={nproc}"]


def cli_command(tmp: Path, *overrides: str, multirun: bool = False, nproc: int = 1, default_dirs: bool = False):
    """The ``python -m recipes.run`` command line with outputs under ``tmp`` (run dir, results table; with
    ``default_dirs`` the run or sweep dir is the config's own, below ``tmp/results``); ``nproc > 1``
    launches it with :func:`torchrun` (CPU ranks over gloo)."""
    dirs = [] if default_dirs else [f"hydra.sweep.dir={tmp}/sweep"] if multirun else [f"hydra.run.dir={tmp}/run"]
    launch = [sys.executable, "-m", "recipes.run"] if nproc == 1 else [*torchrun(nproc), "-m", "recipes.run"]
    return [*launch, *(["-m"] if multirun else []), *dirs, f"paths.results_dir={tmp}/results", *overrides]


CLI_ENV = {**os.environ, "DS_ACCELERATOR": "cpu", "HYDRA_FULL_ERROR": "0"}


def run_cli(tmp: Path, *overrides: str, multirun: bool = False, timeout: int = 300, nproc: int = 1,
            default_dirs: bool = False) -> subprocess.CompletedProcess:
    """Run :func:`cli_command` to its end; past ``timeout`` seconds it is killed with every process below it
    (torchrun starts each rank in a session of its own: a rank hung in a collective must not outlive the test)
    and :class:`subprocess.TimeoutExpired` raised."""
    import psutil

    cmd = cli_command(tmp, *overrides, multirun=multirun, nproc=nproc, default_dirs=default_dirs)
    with subprocess.Popen(cmd, cwd=PROJECT_ROOT, env=CLI_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
            proc.kill()
            proc.communicate()  # the pipes close once every holder is gone
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def results(tmp: Path) -> list[dict]:
    path = Path(tmp) / "results" / "runs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
