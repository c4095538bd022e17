#!/usr/bin/env bash
# The fast subset on the versions a constraints file pins, in a throwaway venv outside the repo:
#   constraints/test.sh constraints/min.txt       # make test-min: every floor of pyproject.toml
#   constraints/test.sh constraints/gpu-cpu.txt   # make test-constraints C=...: the gpu extra's versions, on CPU
# torch comes first from TORCH_SPEC (the local CPU wheel by default, as `make venv`), then the project with
# `pip install -c FILE -e .[dev]`, in a venv rebuilt every time (VENV_ROOT, default /tmp; REUSE=1 keeps it). What the subset
# covers and why each floor: docs/dependencies.md.
set -euo pipefail
C=${1:?usage: constraints/test.sh CONSTRAINTS_FILE [pytest args]}
shift
PY=${PY:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
VENV=${VENV_ROOT:-/tmp}/rlrecipes-$(basename "$C" .txt)
# config composition, losses and advantages, verifiers, a tiny RL run (plain and ZeRO-3 on 2 ranks), a tiny RM
# run with LoRA, TRL's VLLMClient against the server double, the floors themselves and the per-step peak memory
SUBSET=(tests/test_floors.py tests/test_configs.py tests/core/test_loss.py tests/core/test_advantage.py
        tests/core/test_metrics.py tests/verifiers/test_math.py tests/rm/test_reward_model.py
        "tests/core/test_rl_runs.py::test_cli_two_step_ppo_run"
        "tests/core/test_rl_runs.py::test_bf16_run_keeps_fp32_master_weights_and_a_bf16_reference"
        tests/rm/test_recipes.py tests/test_rollout_server.py "tests/test_zero.py::test_two_ranks_match_the_single_process_engine")
start=$SECONDS
if [[ -z ${REUSE:-} ]]; then  # REUSE=1: run the tests in the venv the last call built
  "$PY" -m venv --clear "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip
  "$VENV/bin/pip" install --quiet "$TORCH_SPEC"
  "$VENV/bin/pip" install --quiet -c "$C" -e ".[dev]"
fi
installed=$SECONDS
"$VENV/bin/python" - "$C" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version
from packaging.requirements import Requirement

pins = [Requirement(s) for s in (line.split("#")[0].strip() for line in open(sys.argv[1])) if s]
got, absent = {}, []
for r in pins:
    try:
        got[r.name] = version(r.name)
    except PackageNotFoundError:  # pinned for another machine (vllm, flash-attn in gpu.txt)
        absent.append(r.name)
bad = {r.name: got[r.name] for r in pins if r.name in got and got[r.name] not in r.specifier}
got.setdefault("torch", version("torch"))
print("installed:", " ".join(f"{k}=={v}" for k, v in got.items()),
      f"(not installed here: {', '.join(absent)})" if absent else "")
sys.exit(f"not the pinned versions: {bad}" if bad else 0)
PY
"$VENV/bin/python" -m pytest -p no:cacheprovider -m "not slow and not gpu" -q "${SUBSET[@]}" "$@"
echo "$C: install $((installed - start)) s, tests $((SECONDS - installed)) s"
