#!/usr/bin/env bash
# Build one virtual environment per source framework release, for the fidelity checks (docs/fidelity.md).
#   tests/fidelity/envs.sh [trl|verl|openrlhf|open_instruct|all] ...   (default: all, every env a check drives)
# Each env lives in $FIDELITY_ENVS/<name> (default /tmp/rlr-fidelity-envs; never the project's .venv) and is
# built once: a complete env carries a .ok stamp, a half-built one is removed and rebuilt.
# torch is the CPU wheel every env shares (torch==2.13.0, the project's TORCH_SPEC); the sources pinned older
# torch builds for CUDA (Open-R1 torch 2.6.0, SimpleRL-Zoo torch 2.4.0), which the step code does not depend on.
set -euo pipefail
PY=${PY:-python3}
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
# accelerate==1.4.0, deepspeed==0.16.8). TRL and its dependencies are pure Python: the whole package installs; only
# its vllm extra is left out (vLLM needs CUDA; the checks feed recorded completions instead of generating).
# DeepSpeed 0.16.8 (Open-R1's pin, the same setup.py): the engine check runs TRL under accelerate's DeepSpeed plugin
# with the recipe's recipes/accelerate_configs/zero2.yaml (tests/fidelity/trl_grpo.py); built without isolation
# against this env's torch, as for Open-Instruct.
build_trl() {
  local py; py=$(fresh trl-0.18.0)
  "$py" -m pip install --quiet trl==0.18.0 transformers==4.52.3 accelerate==1.4.0 "datasets<4" pyyaml \
    setuptools wheel packaging ninja py-cpuinfo psutil hjson pydantic msgpack
  "$py" -m pip install --quiet --no-build-isolation "deepspeed==0.16.8"
}

# veRL 0.2.0.post2 (2025-02-20), the release closest to SimpleRL-Zoo's fork (its core_algos.py and
# dp_actor.py are upstream's of 2025-01-29 / 2025-02-01; ../shared/reference/simplerl_zoo.md §Sources).
# Installed --no-deps: its requirements pull vllm<=0.6.3 (CUDA only). The step code (verl.trainer.ppo.core_algos,
# verl.workers.actor.dp_actor) imports torch, transformers (< 4.48 in the fork's requirements.txt), tensordict,
# codetiming, omegaconf, numpy, ray (verl/protocol.py imports it; CPU wheels exist, nothing starts a cluster) and
# flash-attn's bert_padding (see below). tensordict 0.15.3 (the newest today), as veRL's pin (< 0.6) does not
# import under torch 2.13 (torch.multiprocessing.reductions.ForkingPickler is gone); the TensorDict calls of
# DataProto (select, split, batch_size) behave the same, and the check compares every quantity they carry.
# accelerate (unpinned in its requirements; 1.4.0, the release of that week): fsdp_workers.py's model init imports
# its init_empty_weights (the FSDP engine check, tests/fidelity/verl_fsdp.py).
build_verl() {
  local py; py=$(fresh verl-0.2.0.post2)
  "$py" -m pip install --quiet --no-deps verl==0.2.0.post2
  "$py" -m pip install --quiet "transformers==4.47.1" "tensordict==0.15.3" "ray==2.60.0" codetiming omegaconf \
    hydra-core numpy pandas pyyaml einops "accelerate==1.4.0"
  bert_padding "$py"
}

# flash-attn's CUDA kernels cannot build here; dp_actor.py imports only its flash_attn/bert_padding.py (torch and
# einops), OpenRLHF's models that and flash_attn/utils/distributed.py (torch). Both files come from flash-attn's own
# source distribution (2.8.3, OpenRLHF 0.9.0's pin; bert_padding.py is the same in 2.7.4.post1): pip downloads it,
# preparing its metadata without CUDA (FLASH_ATTENTION_SKIP_CUDA_BUILD, this env's torch), and the two files go
# under empty __init__.py files (the real flash_attn/__init__.py loads the kernels). The checks run the padded path
# (use_remove_padding=False), which calls none of it.
bert_padding() {
  local py=$1 site tmp src
  site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  tmp=$(mktemp -d)
  "$py" -m pip install --quiet setuptools wheel packaging psutil ninja
  FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE "$py" -m pip download --quiet --no-deps --no-build-isolation -d "$tmp" \
    "flash-attn==2.8.3"
  tar -xzf "$tmp/flash_attn-2.8.3.tar.gz" -C "$tmp"
  src="$tmp/flash_attn-2.8.3/flash_attn"
  mkdir -p "$site/flash_attn/utils"
  cp "$src/bert_padding.py" "$site/flash_attn/"
  cp "$src/utils/distributed.py" "$site/flash_attn/utils/"
  : > "$site/flash_attn/__init__.py"
  : > "$site/flash_attn/utils/__init__.py"
  rm -rf "$tmp"
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

# ---- Open-Instruct (issue 41): one env per cited commit of allenai/open-instruct, its code from git ----
# Open-Instruct is not a package: its scripts run from a clone. The env takes the cited commit's open_instruct/ from a
# git repository of allenai/open-instruct, $OPEN_INSTRUCT_GIT (a clone's .git or a bare mirror; default
# $FIDELITY_ENVS/open-instruct.git, cloned bare from GitHub when missing), with `git archive COMMIT open_instruct`
# into $env/src (a .pth file puts it on the path; COMMIT records which), never into this tree. Each env holds the
# commit's pins (requirements.txt) of what its step code imports; left out, as for OpenRLHF, what a CPU cannot import
# (vllm, flash-attn, bitsandbytes) and what only launches (ray, wandb, beaker): the drivers
# (tests/fidelity/open_instruct_*.py) put a stand-in for each in place, each one justified there.
OI_URL=https://github.com/allenai/open-instruct
oi_source() {  # oi_source COMMIT DEST: the commit's open_instruct/ into DEST/src, its id into DEST/src/COMMIT
  local git=${OPEN_INSTRUCT_GIT:-$ROOT/open-instruct.git}
  if [[ ! -d "$git" ]]; then git clone --quiet --bare "$OI_URL" "$git" >&2; fi
  if ! git --git-dir="$git" cat-file -e "$1^{commit}" 2>/dev/null; then
    echo "envs.sh: $git has no commit $1 (OPEN_INSTRUCT_GIT: a git repository of $OI_URL)" >&2; exit 2
  fi
  mkdir -p "$2/src"
  git --git-dir="$git" archive "$1" open_instruct configs/ds_configs | tar -x -C "$2/src"
  echo "$1" > "$2/src/COMMIT"
  local site; site=$("$2/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$2/src" > "$site/open_instruct_src.pth"
}

# 3dd7a07d (2024-11-21), the Tulu 3 release: reward_modeling.py and ppo_vllm_thread_ray_gtrl.py. Its pins
# (requirements.txt) of what the step imports: transformers 4.43.4, tokenizers 0.19.1, deepspeed 0.15.0, accelerate
# 0.31.0, antlr4 4.11.0; datasets unpinned (3.1.0, the release of that month). torch is the shared CPU build, kept by
# naming it in the same install: the commit's sympy pin (1.12.0, for its math verifier, not the step) would take pip
# back to a CUDA torch 2.4; sympy is left to torch's requirement.
build_oi_release() {
  local py; py=$(fresh open-instruct-3dd7a07d)
  "$py" -m pip install --quiet "$TORCH_SPEC" "transformers==4.43.4" "tokenizers==0.19.1" "accelerate==0.31.0" \
    "datasets==3.1.0" "numpy<2" "pyarrow<20" "antlr4-python3-runtime==4.11.0" nltk langdetect immutabledict rich \
    pandas matplotlib tensorboard python-dateutil requests packaging setuptools wheel ninja py-cpuinfo psutil hjson \
    pydantic msgpack einops
  "$py" -m pip install --quiet --no-build-isolation "deepspeed==0.15.0"
  oi_source 3dd7a07da07e78550e7be48a7d317ec3d9c9cd6d "$ROOT/open-instruct-3dd7a07d"
  DS_ACCELERATOR=cpu "$py" -c "import open_instruct.reward_modeling, open_instruct.model_utils, deepspeed"
}

# c8b66a0e (2025-02-12), the Tulu 3.1 GRPO recipe's: grpo_vllm_thread_ray_gtrl.py. Its pins (requirements.txt) of
# what the step imports: transformers 4.47.1, tokenizers 0.21.0, deepspeed 0.15.4, accelerate 1.2.1, datasets
# 3.2.0, numpy 1.26.4, antlr4 4.11.0 (torch and sympy as for 3dd7a07d: its sympy 1.13.1 pin means a CUDA torch 2.6).
build_oi_grpo() {
  local py; py=$(fresh open-instruct-c8b66a0e)
  "$py" -m pip install --quiet "$TORCH_SPEC" "transformers==4.47.1" "tokenizers==0.21.0" "accelerate==1.2.1" \
    "datasets==3.2.0" "numpy==1.26.4" "pyarrow<20" "antlr4-python3-runtime==4.11.0" nltk langdetect immutabledict \
    "rich==13.9.4" "pandas==2.2.3" matplotlib tensorboard python-dateutil requests packaging setuptools wheel ninja \
    py-cpuinfo psutil hjson pydantic msgpack einops
  "$py" -m pip install --quiet --no-build-isolation "deepspeed==0.15.4"
  oi_source c8b66a0e34efa3a891d4773bcfa40250498f3373 "$ROOT/open-instruct-c8b66a0e"
  DS_ACCELERATOR=cpu "$py" -c "import open_instruct.model_utils, open_instruct.dataset_transformation, deepspeed"
}
# ---- end Open-Instruct ----

build() {  # build NAME FUNC: once; a build cut short leaves no stamp and is redone
  local dir="$ROOT/$1"
  if [[ -f "$dir/.ok" ]]; then echo "fidelity env $1: ready ($dir)"; return; fi
  echo "fidelity env $1: building in $dir"
  "$2"
  touch "$dir/.ok"
}

targets=("$@"); [[ ${#targets[@]} -eq 0 || ${targets[0]} == all ]] && targets=(trl verl openrlhf open_instruct)
for t in "${targets[@]}"; do
  case "$t" in
    trl) build trl-0.18.0 build_trl ;;
    verl) build verl-0.2.0.post2 build_verl ;;
    openrlhf) build openrlhf-0.9.0 build_openrlhf ;;
    open_instruct) build open-instruct-3dd7a07d build_oi_release; build open-instruct-c8b66a0e build_oi_grpo ;;
    *) echo "envs.sh: unknown env '$t' (expected trl, verl, openrlhf, open_instruct or all)" >&2; exit 2 ;;
  esac
done
