"""``python -m recipes.explain``: the batch arithmetic of a recipe in our keys and its source's flags, and the
arithmetic that fails when an override breaks an invariant. The named recipes' published figures are checked in
tests/test_recipes.py."""
from __future__ import annotations

import subprocess
import sys

from core.paths import PROJECT_ROOT
from tests.helpers import CLI_ENV, explain


def _explain(*overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "recipes.explain", *overrides], cwd=PROJECT_ROOT, env=CLI_ENV,
                          capture_output=True, text=True, timeout=120)


def test_the_default_recipe_is_explained_from_its_config():
    proc = _explain("train.total_steps=null", "train.epochs=3", "data.generator.num_train=1000")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "one RL step: train.prompts_per_step 16 x train.group_size 8 = 128 completions" in out
    assert "1000 training rows after the filters -> 62 RL steps per epoch" in out  # 1000 // 16, last batch dropped
    assert "run: 186 RL steps = 3.00 epochs, about 24 views of each example" in out
    assert "186 x 1 = 186 optimiser steps" in out


def test_a_source_view_states_the_batch_in_its_flags():
    proc = explain("source.name=trl", "train.prompts_per_step=16", "train.group_size=7", "train.mini_batch_size=112",
                   "train.micro_batch_size=16")  # in this process: the two tests around it run the CLI
    assert proc.returncode == 0, proc.stderr
    assert "generation batch: 16 x 1 x 7 = 112 completions = 16 prompts x 7" in proc.stdout


def test_the_openrlhf_view_states_the_batch_in_its_flags():
    """No recipe names source.name=openrlhf (OpenRLHF's recipes train reward models): it is a command-line option."""
    proc = explain("source.name=openrlhf", "train.micro_batch_size=32")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith("in openrlhf's flags:\n  --rollout_batch_size: 16\n  --n_samples_per_prompt: 8\n"
                                "  --train_batch_size: 128\n  --micro_train_batch_size: 32\n  --max_epochs: 1\n")


def test_a_broken_invariant_prints_the_failing_arithmetic():
    proc = _explain("train.group_size=14", "train.prompts_per_step=8", "train.mini_batch_size=64")
    assert proc.returncode == 1
    assert "train.prompts_per_step x train.group_size = 8 x 14 = 112 completions is not divisible by " \
           "train.mini_batch_size=64" in proc.stderr


def test_the_engine_line_names_what_the_config_generates_with():
    """The default recipe generates with ``hf``: no vLLM engine is mentioned (issue 27: "1 vLLM engine")."""
    out = explain().stdout
    gpus = next(line for line in out.splitlines() if line.startswith("GPUs:"))
    assert "rollout.engine=hf" in gpus and "vLLM engine(s)" not in gpus
    out = explain("recipe=simplerl_zoo_7b").stdout
    assert "rollout.engine=vllm: 8 vLLM engine(s) x TP 2 (colocate)" in out


def test_the_views_of_each_example_are_one_figure(shared_data):  # the rows are counted from the real data
    """SimpleRL-Zoo 7B: 100 steps x 8192 completions over 8360 rows, the same figure in our keys and in veRL's
    flags (issue 27: "about 100 views" and "96 views" in one output)."""
    out = explain("recipe=simplerl_zoo_7b").stdout
    assert "run: 100 RL steps = 12.50 epochs, about 98 views of each example (100 x 8192 completions / 8360 rows)" in out
    assert "steps run: 100 = 12 full epochs of 8 + 4 steps (12.50 epochs, about 98 views" in out
    assert [w for w in out.split() if w == "views"] == ["views", "views"]  # the two lines above, no other figure


def test_hub_rows_are_the_published_count_unless_asked(monkeypatch):
    """A hub dataset is not downloaded to count rows: ``data.published_rows`` stands in; ``--count-rows`` reads the
    split (here a loader raising the hub's own offline error: a short message, not 25 s of retries)."""
    import datasets
    from huggingface_hub.errors import OfflineModeIsEnabled

    calls = []

    def offline(*args, **kwargs):
        calls.append(args)
        raise ConnectionError("Couldn't reach 'x' on the Hub (OfflineModeIsEnabled)") from OfflineModeIsEnabled("off")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    proc = explain("recipe=open_r1_grpo_math_7b")
    assert proc.returncode == 0, proc.stderr
    assert not calls
    assert "data: 7500 training rows as published -> 58 RL steps per epoch" in proc.stdout
    assert "as published for DigitalLearningGmbH/MATH-lighteval train" in proc.stdout
    proc = explain("recipe=open_r1_grpo_math_7b", "--count-rows")
    assert proc.returncode == 0 and calls
    assert "data.hub_name=DigitalLearningGmbH/MATH-lighteval: the dataset could not be read" in proc.stdout


def test_a_reward_model_recipe_is_explained_from_its_plan():
    """Open-Instruct's RM (issue 28: explain refused loop=rm): 8 GPUs x 1 pair x 32 accumulated = 256 pairs; its
    release filter keeps long pairs whole, so max_len bounds no step; the hub pairs are not counted offline."""
    out = explain("recipe=open_instruct_rm_8b").stdout
    assert "GPUs: 8 learner GPU(s) on 1 node(s) x 8; a reward model: no rollout" in out
    assert "one optimiser step: train.batch_size 256 pairs = 512 sequences" in out
    assert "per learner: 32 pairs = train.micro_batch_size 1 x 32 accumulated (256 / (1 x 8 learners))" in out
    assert "tokens per step: not bounded by train.max_len: data.length_filter_bug keeps a pair whole when its " \
           "prompt is within data.max_prompt_tokens 2048" in out
    assert "data: training pairs not counted here -> 1 epoch(s) x (pairs // 256) optimiser steps" in out
    out = explain("recipe=openrlhf_rm_llama3_8b_4090_8192_zero3").stdout
    assert "per learner: 21 pairs = train.micro_batch_size 1 x 21 accumulated (126 / (1 x 6 learners))" in out
    assert "tokens per step: at most 252 sequences x train.max_len 8192 = 2064384 (longer pairs are cut" in out


def test_a_reward_model_recipe_counts_its_pairs_and_tokens_where_they_are_here():
    """tiny_rm's generated pairs: 4000 - 400 held out = 3600 -> 112 steps of 32 a epoch, 3 epochs; every pair is
    'copy dddd: dddd' plus its rejected twin, so the measured tokens are exact."""
    out = explain("recipe=tiny_rm").stdout
    assert "data: 3600 training pairs after the filters -> 112 optimiser steps per epoch" in out
    assert "run: 336 optimiser steps = train.epochs 3 x 112; schedule cosine over 336, warmup 17" in out
    assert "measured: 30.0 tokens per pair (chosen + rejected) -> about 960 real tokens per step" in out
    assert "tokens per step: at most 64 sequences x train.max_len 64 = 4096" in out


def test_each_open_r1_recipe_states_its_run_and_the_release_whose_defaults_apply():
    out = explain("recipe=open_r1_grpo_code_1_5b").stdout
    assert "reproduces: README.md's config_demo_code command" in out
    assert "defaults: TRL v0.18.0 (setup.py trl[vllm]==0.18.0 @1416fa0) (source.defaults=pinned; " \
           "source.defaults=written: TRL v0.16.0 23a635e (setup.py trl==0.16.0 @ca8664d))" in out
    out = explain("recipe=open_r1_grpo_code_1_5b", "source.defaults=written").stdout
    assert "defaults: TRL v0.16.0 23a635e (setup.py trl==0.16.0 @ca8664d) (source.defaults=written" in out


def test_explain_states_what_a_recipe_step_was_checked_against():
    """explain prints tests/fidelity/sources.yaml's line (issue 29: the source package and version of `make
    fidelity`; issue 41: Open-Instruct's commit) for RL and reward-model recipes alike; tests/fidelity/test_steps.py
    holds the file to the recipes."""
    assert "fidelity: step checked against trl 0.18.0's own code" in explain("recipe=open_r1_grpo_1_5b").stdout
    out = explain("recipe=simplerl_zoo_7b").stdout
    assert ("fidelity: step checked against verl 0.2.0.post2's own code, and again in bfloat16 at its sharding on 2 "
            "CPU ranks (stage3 ours)") in out  # sources.yaml engine (docs/fidelity.md "Engines")
    out = explain("recipe=openrlhf_rm_llama3_8b_4090").stdout
    assert "fidelity: step checked against openrlhf 0.9.0's own code (make fidelity" in out  # no engine check
    assert "fidelity: step checked against open_instruct 3dd7a07d's own code" in explain(
        "recipe=open_instruct_rm_8b").stdout
    assert "fidelity: step checked against open_instruct c8b66a0e's own code" in explain(
        "recipe=open_instruct_grpo_8b").stdout
