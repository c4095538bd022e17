#!/usr/bin/env bash
# Build one small virtual environment per source's reward code, for the reward corpus check (docs/fidelity.md,
# "Rewards"; tests/fidelity/rewards/test_rewards.py):
#   tests/fidelity/rewards/envs.sh [open_r1|simplerl|math_verify_current|open_instruct|all] ...     (default: all)
# Each env lives in $FIDELITY_ENVS/<name> (default /tmp/rlr-fidelity-envs, beside tests/fidelity/envs.sh's; never the
# project's .venv) and is built once: a complete env carries a .ok stamp, a half-built one is removed and rebuilt.
# None needs torch. The sources' files are not in this tree: each env gets them under <env>/src, taken with
# `git archive` at the commit the recipes cite from a snapshot of the source repository,
# $FIDELITY_MIRROR/<owner>+<repo>/repo (default /work/.mirror, where the search tools' `fetch github:<owner>/<repo>`
# puts it).
set -euo pipefail
PY=${PY:-python3}
ROOT=${FIDELITY_ENVS:-/tmp/rlr-fidelity-envs}
MIRROR=${FIDELITY_MIRROR:-/work/.mirror}
mkdir -p "$ROOT"

fresh() {  # fresh NAME: a new venv with pip; prints its python
  local dir="$ROOT/$1"
  rm -rf "$dir"
  "$PY" -m venv "$dir"
  "$dir/bin/pip" install --quiet --upgrade pip >&2
  echo "$dir/bin/python"
}

sources() {  # sources ENV OWNER+REPO COMMIT PATH...: the source's files at COMMIT under $ROOT/ENV/src
  local env=$1 repo=$2 commit=$3; shift 3
  local git_dir="$MIRROR/$repo/repo"
  if [[ ! -d "$git_dir" ]]; then
    echo "rewards/envs.sh: no snapshot of ${repo/+//} at $git_dir" \
      "(set FIDELITY_MIRROR, or fetch github:${repo/+//})" >&2
    exit 2
  fi
  mkdir -p "$ROOT/$env/src"
  for path in "$@"; do  # the subtree alone (the snapshot lacks some large data files elsewhere in the commit)
    git --git-dir "$git_dir" archive --prefix="$path/" "$commit:$path" | tar -x -C "$ROOT/$env/src"
  done
}

# Open-R1 @1416fa0 (rewards.py last changed at c1e1192): its setup.py pins math-verify==0.5.2 (which pins
# latex2sympy2_extended==1.0.6) and torch==2.6.0, whose sympy pin is 1.13.1. The driver imports src/open_r1/rewards.py
# (tests/fidelity/rewards/source_rewards.py says what of its imports it leaves out).
build_open_r1() {
  local py; py=$(fresh rewards-open-r1)
  "$py" -m pip install --quiet "math-verify==0.5.2" "latex2sympy2_extended==1.0.6" "sympy==1.13.1"
  sources rewards-open-r1 huggingface+open-r1 1416fa0cf21595d2083b399a2a0bbddd7f6e9563 src/open_r1
}

# SimpleRL-Zoo v1 @cf1c785: requirements.txt pins math-verify[antlr4_11_0]==0.6.0 and word2number (the toolkit also
# imports regex and numpy); its torch 2.4.0 leaves sympy free, so the release of its day (1.13.3, 2024-09; 1.14 came
# 2025-04, after the fork's last code commit).
build_simplerl() {
  local py; py=$(fresh rewards-simplerl)
  "$py" -m pip install --quiet "math-verify[antlr4_11_0]==0.6.0" "sympy==1.13.3" word2number regex numpy
  sources rewards-simplerl hkust-nlp+simpleRL-reason cf1c7858bfc145a27aa733e75d930d34f0d318a6 \
    verl/utils/reward_score
}

# The same Open-R1 and SimpleRL-Zoo reward code on the math-verify this project runs (0.9.0, with latex2sympy2_extended
# 1.11.0, sympy 1.14.0 and antlr4 4.9.3, as .venv): where ours differs from a source on its pinned math-verify but not
# here, the difference is the math-verify release's (docs/fidelity.md "Rewards").
build_math_verify_current() {
  local py; py=$(fresh rewards-math-verify-0.9.0)
  "$py" -m pip install --quiet "math-verify==0.9.0" "latex2sympy2_extended==1.11.0" "sympy==1.14.0" \
    "antlr4-python3-runtime==4.9.3" word2number regex \
    numpy
  sources rewards-math-verify-0.9.0 huggingface+open-r1 1416fa0cf21595d2083b399a2a0bbddd7f6e9563 src/open_r1
  sources rewards-math-verify-0.9.0 hkust-nlp+simpleRL-reason cf1c7858bfc145a27aa733e75d930d34f0d318a6 \
    verl/utils/reward_score
}

# Open-Instruct: the Tulu 3 release 3dd7a07d (requirements.txt: sympy==1.12.0, antlr4-python3-runtime==4.11.0,
# mpmath==1.3.0, langdetect) and the Tulu 3.1 GRPO commit c8b66a0e3 (pyproject.toml: sympy==1.13.1, the same antlr4
# and mpmath). Their math_utils.py and if_functions.py are the same file; ground_truth_utils.py differs (the GRPO
# commit no longer strips the text or cuts it at "<|assistant|>\n"). Only the open_instruct/ package is taken.
build_open_instruct() {  # build_open_instruct NAME COMMIT SYMPY
  local py; py=$(fresh "rewards-open-instruct-$1")
  "$py" -m pip install --quiet "sympy==$3" "mpmath==1.3.0" "antlr4-python3-runtime==4.11.0" langdetect
  sources "rewards-open-instruct-$1" allenai+open-instruct "$2" open_instruct
}

once() {  # once ENV COMMAND...: COMMAND unless ENV carries its .ok stamp (a build cut short has none and is redone)
  local dir="$ROOT/$1"; shift
  [[ -f "$dir/.ok" ]] && { echo "fidelity env ${dir##*/}: ready ($dir)"; return 0; }
  echo "fidelity env ${dir##*/}: building in $dir"
  "$@" && touch "$dir/.ok"
}

targets=("$@")
[[ ${#targets[@]} -eq 0 || ${targets[0]} == all ]] && targets=(open_r1 simplerl math_verify_current open_instruct)
for t in "${targets[@]}"; do
  case "$t" in
    open_r1) once rewards-open-r1 build_open_r1 ;;
    simplerl) once rewards-simplerl build_simplerl ;;
    math_verify_current) once rewards-math-verify-0.9.0 build_math_verify_current ;;
    open_instruct)
      once rewards-open-instruct-3dd7a07d build_open_instruct 3dd7a07d 3dd7a07da07e78550e7be48a7d317ec3d9c9cd6d 1.12.0
      once rewards-open-instruct-c8b66a0e3 build_open_instruct c8b66a0e3 c8b66a0e34efa3a891d4773bcfa40250498f3373 1.13.1
      ;;
    *) echo "rewards/envs.sh: unknown env '$t' (expected open_r1, simplerl, math_verify_current, open_instruct or" \
         "all)" >&2; exit 2 ;;
  esac
done
