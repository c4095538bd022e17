"""Run one fidelity check: our recorder in this interpreter, the source's driver in its own env, then the comparison
(docs/fidelity.md). Each check writes its figures to ``$FIDELITY_REPORT/<recipe>.json`` (default results/fidelity/),
which ``python -m tests.fidelity.report`` tabulates."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from core.paths import PROJECT_ROOT
from tests.fidelity.compare import TOL, diffs, failures, rm_diffs, vacuous
from tests.fidelity.compare_engine import ENGINE_TOL, engine_failures, engine_rl_diffs, engine_rm_diffs

HERE = Path(__file__).parent
SOURCES: dict[str, dict] = yaml.safe_load((HERE / "sources.yaml").read_text())
ENVS = Path(os.environ.get("FIDELITY_ENVS", "/tmp/rlr-fidelity-envs"))
REPORT_DIR = Path(os.environ.get("FIDELITY_REPORT", PROJECT_ROOT / "results" / "fidelity"))
# A random tiny model never earns a math or code reward, and all-zero rewards give zero advantages and a step that
# tests nothing. The stub gives every group the rewards 0, 1, 2 by row; the source is fed the same scores either way
# (its reward functions are checked on their own: tests/recipes, docs/verifiers.md).
REWARD = ["verifier.name=tests.stub_rewards:step_position", "verifier.kwargs={}"]


def env_python(env: str) -> Path:
    """The interpreter of a built env (tests/fidelity/envs.sh), or a skip naming the command that builds it."""
    py = ENVS / env / "bin" / "python"
    if not (ENVS / env / ".ok").exists():
        pytest.skip(f"fidelity env {env} not built: tests/fidelity/envs.sh (or make fidelity)")
    return py


def extensions_dir(env: str) -> Path:
    """Where a source env's DeepSpeed builds its CPU ops (torch's JIT extensions): a folder of the env's own. The
    project's venv builds ops of the same names (``deepspeed_shm_comm``, ``cpu_adam``) against its own DeepSpeed into
    the folder tests/conftest.py names; an env building into that one replaces them with its DeepSpeed's build, and
    the project's DeepSpeed then loads a module it does not fit (``deepspeed_shm_comm has no attribute
    vector_kernel_level``, seen in make test)."""
    return ENVS / env / "torch_extensions"


def run_env(env: str | None = None) -> dict[str, str]:
    """The environment of a check's command: this one's, one thread per process, and for a driver run in source env
    ``env`` its own :func:`extensions_dir` in place of the project's."""
    out = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    if env is not None:
        out["TORCH_EXTENSIONS_DIR"] = str(extensions_dir(env))
    return out


def _run(cmd: list, timeout: int, env: str | None = None, cwd: Path = PROJECT_ROOT) -> None:
    """``cmd`` with :func:`run_env` (``env``: the source env a driver runs in), in ``cwd``: a driver runs in its
    check's folder, where what a source's script writes to its working directory lands (Open-Instruct's
    ``reward_modeling.main`` writes TensorBoard events to ``runs/``)."""
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, env=run_env(env), capture_output=True, text=True,
                         timeout=timeout)
    if out.returncode:
        raise AssertionError(f"{' '.join(map(str, cmd[:3]))} ... exited {out.returncode}:\n{out.stderr[-4000:]}")


def check_rl(recipe: str, tmp: Path, driver: str, *overrides: str, timeout: int = 600) -> list[dict]:
    """Our recipe's recorded steps (tests/fidelity/ours_rl.py) against ``driver`` run in the recipe's source env;
    the per-step differences, written to the report and asserted within tolerance and not vacuous."""
    from safetensors.torch import load_file

    src = SOURCES[recipe]
    py = env_python(src["env"])
    _run([sys.executable, "-m", "tests.fidelity.ours_rl", recipe, tmp, *REWARD, *overrides], timeout)
    given = {"defaults": src.get("defaults", {}), **({"deviations": src["deviations"]} if "deviations" in src else {})}
    _run([py, HERE / driver, PROJECT_ROOT / src["source"], tmp, json.dumps(given)], timeout, src["env"], tmp)
    ours = torch.load(tmp / "ours.pt", weights_only=False)["steps"]
    theirs = torch.load(tmp / f"{src['package']}.pt", weights_only=False)
    critic = tmp / "init_critic" / "model.safetensors"  # PPO's value model before the first step
    per_step = diffs(ours, theirs["steps"], load_file(tmp / "init" / "model.safetensors"),
                     load_file(critic) if critic.exists() else None)
    return _conclude(recipe, {**given, "ran": theirs["versions"], "overrides": [*REWARD, *overrides]}, per_step, ours)


def check_rm(recipe: str, tmp: Path, driver: str, timeout: int = 900) -> list[dict]:
    """Our reward-model recipe's recorded optimiser steps (tests/fidelity/ours_rm.py) against the source's own trainer
    (``driver``: OpenRLHF's ``train_rm``, tests/fidelity/openrlhf_rm.py; Open-Instruct's ``reward_modeling.main``,
    tests/fidelity/open_instruct_rm.py) run in the recipe's source env on the recipe's command; the per-step
    differences, written to the report and asserted within tolerance and not vacuous. A source's first DeepSpeed run
    builds its CPU Adam kernel (about 2 minutes, cached after)."""
    src = SOURCES[recipe]
    py = env_python(src["env"])
    _run([sys.executable, "-m", "tests.fidelity.ours_rm", recipe, tmp], timeout)
    given = {"defaults": src.get("defaults", {}), "deviations": src.get("deviations", {})}
    _run([py, HERE / driver, PROJECT_ROOT / src["source"], tmp, json.dumps(given)], timeout, src["env"], tmp)
    ours = torch.load(tmp / "ours.pt", weights_only=False)
    theirs = torch.load(tmp / f"{src['package']}.pt", weights_only=False)
    per_step = rm_diffs(ours, theirs)
    if "head_kept" in theirs:  # Open-Instruct: the head its layer_init leaves is the one our head_init must give
        expected = "transformers" if theirs["head_kept"] else "inv_sqrt_hidden"
        assert ours["meta"]["head_init"] == expected, (
            f"{recipe}: the source's layer_init {'left' if theirs['head_kept'] else 'replaced'} the checkpoint's head; "
            f"train.head_init is {ours['meta']['head_init']}, the source's behaviour is {expected}")
    return _conclude(recipe, {**given, "ran": theirs["versions"], "overrides": [], "argv": theirs["argv"]}, per_step,
                     ours["steps"])


def _conclude(recipe: str, ran: dict, per_step: list[dict], ours: list[dict]) -> list[dict]:
    """Write the check's report (``$FIDELITY_REPORT/<recipe>.json``: what ran, the tolerances, the per-step figures)
    and assert every figure within tolerance and the check not vacuous."""
    src = SOURCES[recipe]
    REPORT_DIR.mkdir(parents=True, exist_ok=True)
    report = {"recipe": recipe, "package": src["package"], "version": src["version"], **ran, "tolerance": TOL,
              "steps": per_step}
    (REPORT_DIR / f"{recipe}.json").write_text(json.dumps(report, indent=1))
    problems = failures(per_step) + vacuous(per_step, ours)
    assert not problems, f"{recipe} against {src['package']} {src['version']}:\n" + "\n".join(problems)
    return per_step


def check_engine(recipe: str, tmp: Path, driver: str, timeout: int = 900) -> list[dict]:
    """A recipe's check again at its source's engine (sources.yaml ``engine``, docs/fidelity.md "Engines"): ours
    under torchrun on ``ranks`` ranks with the recipe's own ZeRO node at ``dtype`` (``--engine``: bf16 with
    DeepSpeed's fp32 master weights), the source's ``driver`` under torchrun at its own engine (given ``engine``:
    DeepSpeed bf16 at the command's or launcher's ZeRO stage, or veRL's FSDP); compared with
    :data:`tests.fidelity.compare_engine.ENGINE_TOL`, written to ``$FIDELITY_REPORT/engine/<recipe>.json``."""
    src = SOURCES[recipe]
    eng, py = src["engine"], env_python(src["env"])
    rm = driver.endswith("_rm.py")
    ranks = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={eng['ranks']}"]
    ours_cmd = ["-m", f"tests.fidelity.{'ours_rm' if rm else 'ours_rl'}", recipe, tmp, "--engine"]
    _run([sys.executable, *ranks, *ours_cmd, f"model.dtype={eng['dtype']}", *([] if rm else REWARD)], timeout)
    given = {"defaults": src.get("defaults", {}), "deviations": src.get("deviations", {}), "engine": eng}
    _run([py, *ranks, HERE / driver, PROJECT_ROOT / src["source"], tmp, json.dumps(given)], timeout, src["env"], tmp)
    ours = torch.load(tmp / "ours.pt", weights_only=False)
    theirs = torch.load(tmp / f"{src['package']}.pt", weights_only=False)
    ran = {"zero_stage": ours["meta"]["zero_stage"], "dtype": ours["meta"]["dtype"], "world": ours["meta"]["world"]}
    want = {"zero_stage": int(eng["zero"].removeprefix("stage")), "dtype": eng["dtype"], "world": eng["ranks"]}
    assert ran == want, f"{recipe}: our side ran {ran}, sources.yaml's engine says {want} (the recipe's ZeRO node)"
    per_step = engine_rm_diffs(ours, theirs) if rm else engine_rl_diffs(ours, theirs)
    (REPORT_DIR / "engine").mkdir(parents=True, exist_ok=True)
    report = {"recipe": recipe, "package": src["package"], "version": src["version"], "engine": eng,
              "ran": theirs["versions"], "tolerance": ENGINE_TOL, "steps": per_step}
    (REPORT_DIR / "engine" / f"{recipe}.json").write_text(json.dumps(report, indent=1))
    problems = engine_failures(per_step) + vacuous(per_step, ours["steps"])
    assert not problems, f"{recipe} against {src['package']} {src['version']} at {eng}:\n" + "\n".join(problems)
    return per_step
