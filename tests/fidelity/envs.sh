#!/usr/bin/env bash
# Build one virtual environment per source framework release, for the fidelity checks (docs/fidelity.md).
#   tests/fidelity/envs.sh [trl|verl|openrlhf|all] ...     (default: all = trl verl openrlhf, every env a check drives)
# Each env lives in $FIDELITY_ENVS/<name> (default /tmp/rlr-fidelity-envs; never the project's .venv) and is
# built once: a complete env carries a .ok stamp, a half-built one is removed and rebuilt.
# torch is the CPU wheel every env shares (torch==2.13.0, the project's TORCH_SPEC); the sources pinned older
# torch builds for CUDA (Open-R1 torch 2.6.0, SimpleRL-Zoo torch 2.4.0), which the step code does not depend on.
set -euo pipefail
PY=${PY:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=${FIDELITY_ENVS:-/tmp/rlr-fidelity-envs}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
mkdir -p "$ROOT"

fresh() {  # fresh NAME: a new venv with pip and torch; prints its python
  local dir="$ROOT/$1"
  rm -rf "$dir"
  "$PY" -m venv "$dir"
  "$dir/bin/pip" install --quiet --upgrade pip >&2
  "$dir/bin/pip" install --quiet "$TORCH_SPEC" >&2
  echo "$dir/bin/python"
}

# TRL 0.18.0, Open-R1's pin (open-r1 setup.py @1416fa0: trl[vllm]==0.18.0, transformers==4.52.3,
# accelerate==1.4.0). TRL and its dependencies are pure Python: the whole package installs; only its vllm
# extra is left out (vLLM needs CUDA; the checks feed recorded completions instead of generating).
build_trl() {
  local py; py=$(fresh trl-0.18.0)
  "$py" -m pip install --quiet trl==0.18.0 transformers==4.52.3 accelerate==1.4.0 "datasets<4" pyyaml
}

# veRL 0.2.0.post2 (2025-02-20), the release closest to SimpleRL-Zoo's fork (its core_algos.py and
# dp_actor.py are upstream's of 2025-01-29 / 2025-02-01; ../shared/reference/simplerl_zoo.md §Sources).
# Installed --no-deps: its requirements pull vllm<=0.6.3 (CUDA only). The step code (verl.trainer.ppo.core_algos,
# verl.workers.actor.dp_actor) imports torch, transformers (< 4.48 in the fork's requirements.txt), tensordict,
# codetiming, omegaconf, numpy, ray (verl/protocol.py imports it; CPU wheels exist, nothing starts a cluster) and
# flash-attn's bert_padding (see below). tensordict 0.15.3 (the newest today), as veRL's pin (< 0.6) does not
# import under torch 2.13 (torch.multiprocessing.reductions.ForkingPickler is gone); the TensorDict calls of
# DataProto (select, split, batch_size) behave the same, and the check compares every quantity they carry.
build_verl() {
  local py; py=$(fresh verl-0.2.0.post2)
  "$py" -m pip install --quiet --no-deps verl==0.2.0.post2
  "$py" -m pip install --quiet "transformers==4.47.1" "tensordict==0.15.3" "ray==2.60.0" codetiming omegaconf \
    hydra-core numpy pandas pyyaml einops
  bert_padding "$py"
}

# flash-attn's CUDA kernels cannot build here (nor can pip prepare its source distribution without CUDA);
# dp_actor.py imports only its flash_attn/bert_padding.py (torch and einops), OpenRLHF's models that and
# flash_attn/utils/distributed.py (torch). Those files, verbatim from flash-attn (tests/fidelity/vendor/:
# bert_padding.py of v2.7.4.post1, the same in v2.8.3; distributed.py of v2.8.3), go under empty __init__.py files
# (the real flash_attn/__init__.py loads the kernels). The checks run the padded path (use_remove_padding=False),
# which calls none of it.
bert_padding() {
  local py=$1 site
  site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  mkdir -p "$site/flash_attn/utils"
  cp "$HERE/vendor/flash_attn/bert_padding.py" "$site/flash_attn/"
  cp "$HERE/vendor/flash_attn/utils/distributed.py" "$site/flash_attn/utils/"
  : > "$site/flash_attn/__init__.py"
  : > "$site/flash_attn/utils/__init__.py"
}

# OpenRLHF 0.9.0, the release the RM recipes cite (train_rm_llama.sh @v0.9.0 06ab51e). --no-deps: its
# requirements pull flash-attn==2.8.3 (CUDA), ray[default], vllm and bitsandbytes; its RM path (openrlhf.cli.train_rm:
# openrlhf.models, datasets, trainer.rm_trainer, utils.deepspeed) imports torch, transformers==4.57.0 and
# deepspeed==0.18.1 (its pins; DeepSpeed runs on the CPU accelerator), peft, einops, datasets, torchdata (its
# StatefulDataLoader; 0.11.0, the newest) and flash-attn's bert_padding (as for veRL).
build_openrlhf() {
  local py; py=$(fresh openrlhf-0.9.0)
  "$py" -m pip install --quiet --no-deps openrlhf==0.9.0
  "$py" -m pip install --quiet "transformers==4.57.0" "deepspeed==0.18.1" peft einops accelerate datasets pyyaml \
    "torchdata==0.11.0"
  bert_padding "$py"
  "$py" -c "from openrlhf.cli import train_rm; from openrlhf.utils.deepspeed import DeepspeedStrategy"
}

build() {  # build NAME FUNC: once; a build cut short leaves no stamp and is redone
  local dir="$ROOT/$1"
  if [[ -f "$dir/.ok" ]]; then echo "fidelity env $1: ready ($dir)"; return; fi
  echo "fidelity env $1: building in $dir"
  "$2"
  touch "$dir/.ok"
}

targets=("$@"); [[ ${#targets[@]} -eq 0 || ${targets[0]} == all ]] && targets=(trl verl openrlhf)
for t in "${targets[@]}"; do
  case "$t" in
    trl) build trl-0.18.0 build_trl ;;
    verl) build verl-0.2.0.post2 build_verl ;;
    openrlhf) build openrlhf-0.9.0 build_openrlhf ;;
    *) echo "envs.sh: unknown env '$t' (expected trl, verl, openrlhf or all)" >&2; exit 2 ;;
  esac
done
