# Self-documenting: `make help` lists every target with a `## ` comment.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# CPU wheel of torch; a CUDA machine can override: `make TORCH_SPEC=torch demo`.
TORCH_SPEC ?= torch==2.13.0
# The interpreter of `make gpu-smoke` and `make gpu-check`: the project venv where there is one, else $(PY), which
# must have CUDA torch and the project's dependencies (the GPU machines: docs/performance.md, "GPU check").
SMOKE_PY ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PY))
# Where `make gpu-check` writes gpu_check.json and gpu_check.md.
GPU_CHECK_OUT ?= results/gpu_check
PYTEST_ARGS ?=
# Constraints file of `make test-constraints` (constraints/test.sh).
C ?= constraints/gpu.txt

.DEFAULT_GOAL := help
.PHONY: help venv demo test test-slow test-gpu test-all test-min test-constraints check-gpu-constraints bench gpu-smoke gpu-check \
        probe plan compare fidelity clean

help: ## List the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-22s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

venv: $(STAMP) ## Create .venv and install the project (torch first, then the rest)

demo: $(STAMP) ## Run the default recipe (tiny_math_grpo): GRPO on a tiny local model, CPU, < 3 min
	$(BIN)/python -m recipes.run

test: $(STAMP) ## Run the CPU test suite (not slow, not gpu): about 15 min on 2 cores
	$(BIN)/python -m pytest -m "not slow and not gpu and not fidelity" $(PYTEST_ARGS)

test-slow: $(STAMP) ## Run the slow tests (demo learning check, long end-to-end runs)
	$(BIN)/python -m pytest -m "slow and not gpu and not fidelity" $(PYTEST_ARGS)

test-gpu: $(STAMP) ## Run the GPU tests (vLLM, flash-attn); needs CUDA and `pip install -e .[gpu]`
	$(BIN)/python -m pytest -m gpu $(PYTEST_ARGS)

test-all: $(STAMP) ## Run every CPU test, slow ones included
	$(BIN)/python -m pytest -m "not gpu and not fidelity" $(PYTEST_ARGS)

test-min: ## Install every floor of pyproject.toml (constraints/min.txt) in a /tmp venv and run the fast subset
	$(MAKE) test-constraints C=constraints/min.txt

test-constraints: ## The same with the pins of C (default constraints/gpu.txt: the gpu extra's versions, on CPU)
	PY=$(PY) TORCH_SPEC="$(TORCH_SPEC)" constraints/test.sh $(C) $(PYTEST_ARGS)

check-gpu-constraints: $(STAMP) ## Resolve constraints/gpu.txt with pip (dry run: the project and vllm; flash-attn aside)
	$(BIN)/pip install --dry-run --ignore-installed -c constraints/gpu.txt "$(TORCH_SPEC)" -e . vllm 2>/dev/null | tail -1

bench: $(STAMP) ## Run the benchmarks (see docs/performance.md)
	$(BIN)/python -m bench

gpu-smoke: ## On a CUDA machine: a Qwen2.5-0.5B-shaped model through the RL loop (zero none/2/3), packed vs padded in bf16, throughput and MFU
	$(SMOKE_PY) -m bench.gpu_smoke

gpu-check: ## On one H100/H200, 8 min: every GPU check (smoke, ZeRO 0/2/3, long completions + SIGTERM, bench trl) measured vs predicted, in GPU_CHECK_OUT
	$(SMOKE_PY) -m bench.gpu_check --out $(GPU_CHECK_OUT)

# The recipes `make probe` probes (RECIPES=name ... for some): every named one, the tiny ones aside.
RECIPES ?= $(filter-out tiny_%,$(basename $(notdir $(wildcard conf/recipe/*.yaml))))

probe: $(STAMP) ## Per-GPU memory and FLOPs of each named recipe at its real shapes on its source's GPUs, on this CPU
	@for r in $(RECIPES); do $(BIN)/python -m recipes.probe recipe=$$r || exit 1; echo; done

plan: $(STAMP) ## Each named recipe on its source's GPUs: memory per GPU broken down, verdict, knobs, time per step and run
	@for r in $(RECIPES); do $(BIN)/python -m recipes.plan recipe=$$r || exit 1; echo; done

compare: $(STAMP) ## Print the results table of finished runs as markdown
	$(BIN)/python -m recipes.compare

# Where `make fidelity` builds the source frameworks' envs (tests/fidelity/envs.sh; never .venv).
FIDELITY_ENVS ?= /tmp/rlr-fidelity-envs

fidelity: $(STAMP) ## Each recipe's update against its source framework's own code (TRL, veRL, OpenRLHF, Open-Instruct) in envs of their own: docs/fidelity.md
	FIDELITY_ENVS=$(FIDELITY_ENVS) PY=$(PY) tests/fidelity/envs.sh all
	FIDELITY_ENVS=$(FIDELITY_ENVS) PY=$(PY) tests/fidelity/rewards/envs.sh all
	FIDELITY_ENVS=$(FIDELITY_ENVS) $(BIN)/python -m pytest -m fidelity tests/fidelity $(PYTEST_ARGS)
	$(BIN)/python -m tests.fidelity.report

clean: ## Remove run outputs and the model cache (keeps .venv)
	rm -rf results/runs results/evals results/*.jsonl results/*.lock .cache
