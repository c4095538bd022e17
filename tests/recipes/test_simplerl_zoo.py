"""The SimpleRL-Zoo recipes (conf/recipe/simplerl_zoo_*.yaml): the source's exact values, its published figures through
``recipes.explain``, its data read as veRL reads it, its reward reading what veRL's reward manager decodes, a run of
each recipe at ``scale=tiny``, and overrides that break the source's batch arithmetic refused with the reason.
Values: ../shared/reference/simplerl_zoo.md (hkust-nlp/simpleRL-reason v1 @cf1c785)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf

from core.config.composition import compose
from core.config.pipeline import prepare
from core.config.validate import ConfigError
from core.paths import CONF_DIR, PROJECT_ROOT
from tests.helpers import CLI_ENV, explain, slow

RECIPES = sorted(p.stem for p in (CONF_DIR / "recipe").glob("simplerl_zoo_*.yaml"))

STOP_7B = [151645, 151643, 872, 77091, 1474, 71703, 151644, 8948]  # vllm_rollout.py, "qwen2.5" + "7b"
EXACT_7B = {
    "seed": 1, "model.name_or_path": "Qwen/Qwen2.5-7B", "model.arch": "qwen2", "model.dtype": "bfloat16",
    "model.gradient_checkpointing": True, "train.disable_dropout": False,  # veRL leaves dropout as loaded
    "data.source": "file", "data.prompt_key": "prompt.0.content", "data.answer_key": "reward_model.ground_truth",
    "data.eval_prompt_key": None, "data.eval_answer_key": None, "data.template": "{prompt}",
    "data.chat_template": False, "data.system_prompt": None, "data.max_prompt_chars": 1024,
    "data.max_prompt_tokens": None,
    "rollout.max_new_tokens": 8192, "rollout.temperature": 1.0, "rollout.greedy": False, "rollout.top_p": 1.0,
    "rollout.top_k": -1, "rollout.stop_token_ids": STOP_7B, "rollout.generate_ahead": 0,
    "rollout.vllm.dtype": "bfloat16", "rollout.vllm.gpu_memory_utilization": 0.75,
    "rollout.vllm.tensor_parallel_size": 2, "rollout.vllm.max_model_len": 9216, "rollout.vllm.max_num_seqs": 1024,
    "rollout.vllm.max_num_batched_tokens": 10216, "rollout.vllm.enable_prefix_caching": False,
    "rollout.vllm.enable_sleep_mode": True, "rollout.vllm.sleep_level": 2, "rollout.vllm.seed": 0,
    "advantage.name": "grpo", "advantage.std": "group", "advantage.unbiased_std": True, "advantage.eps": 1e-6,
    "advantage.whiten": "none",
    "loss.name": "ppo_clip", "loss.clip_low": 0.2, "loss.clip_high": 0.2, "loss.dual_clip": None,
    "loss.entropy_coef": 0.001, "loss.aggregation": "token_mean", "loss.log_ratio_clamp": None,
    "loss.is_correction.mode": "none",
    "kl.estimator": "k3", "kl.placement": "loss", "kl.coef": 1e-4, "kl.clamp": 10.0, "kl.log_ratio_clamp": None,
    "kl.controller": "fixed", "kl.reference": "auto",
    "optim.optimizer._target_": "torch.optim.AdamW", "optim.optimizer.lr": 5e-7,
    "optim.optimizer.betas": [0.9, 0.999], "optim.optimizer.eps": 1e-8, "optim.optimizer.weight_decay": 0.01,
    "optim.optimizer.fused": None, "optim.max_grad_norm": 1.0, "optim.scheduler.name": "verl_constant",
    "optim.scheduler.warmup_ratio": 0.0, "optim.scheduler.warmup_steps": 0,
    "zero.stage": 3, "zero.offload_optimizer": False, "zero.offload_param": False, "zero.offload_reference": True,
    "zero.communication_data_type": "fp32",
    "layout.mode": "colocate", "layout.nodes": 2, "layout.gpus_per_node": 8, "layout.learner_gpus": 16,
    "layout.rollout_gpus": 0,
    "verifier.name": "math_simplerl", "verifier.text": "prompt_completion_raw", "verifier.kwargs": {},
    "train.total_steps": 100, "train.epochs": None, "train.prompts_per_step": 1024, "train.group_size": 8,
    "train.mini_batch_size": 2048, "train.micro_batch_size": 2, "train.ppo_epochs": 1,
    "train.shuffle_mini_batches": False, "train.logprob_micro_batch_size": 10,
    "train.shaping.mask_truncated": False, "train.shaping.non_stop_penalty": None,
    "train.shaping.overlong_buffer": 0, "train.shaping.reward_clip": None,
    "train.eval_every": 5, "train.eval_prompts": 0, "train.checkpoint_every": 5, "train.warm_start.steps": 0,
    "scale.max_group_size": 8, "source.name": "verl", "source.flags.total_epochs": 20,
    "source.flags.log_prob_micro_batch_size": 160,
}
EXACT = {
    "simplerl_zoo_7b": EXACT_7B,
    # README: the 7B flags with --model_name Qwen-2.5-14B; vllm_rollout.py sets no stop ids for it.
    "simplerl_zoo_14b": {**EXACT_7B, "model.name_or_path": "Qwen/Qwen2.5-14B", "rollout.stop_token_ids": []},
    # README: kl 1e-3 (> 14B), --rollout_tp 8, 8 x 8 H100; log-prob micro-batch 160 // 64 = 2 per GPU.
    "simplerl_zoo_32b": {**EXACT_7B, "model.name_or_path": "Qwen/Qwen2.5-32B", "rollout.stop_token_ids": [],
                         "kl.coef": 1e-3, "rollout.vllm.tensor_parallel_size": 8, "layout.nodes": 8,
                         "layout.learner_gpus": 64, "train.logprob_micro_batch_size": 2},
}


def _get(cfg, dotted):
    v = OmegaConf.select(cfg, dotted, throw_on_missing=True)
    return OmegaConf.to_container(v) if OmegaConf.is_config(v) else v


def test_the_three_recipes_are_discovered():
    assert RECIPES == sorted(EXACT) and len(RECIPES) == 3


@pytest.mark.parametrize("name", sorted(EXACT))
def test_recipe_values_are_the_sources(name):
    cfg = compose([f"recipe={name}"])
    wrong = {k: (_get(cfg, k), v) for k, v in EXACT[name].items() if _get(cfg, k) != v}
    assert not wrong, wrong
    assert len(EXACT[name]) > 80


def test_explain_reproduces_the_published_figures(shared_data):
    proc = explain("recipe=simplerl_zoo_7b")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for line in ("8360 training rows after the filters -> 8 RL steps per epoch",
                 "data.max_prompt_length: 1024 characters of the prompt: 8523 rows -> 8360",
                 "steps run: 100 = 12 full epochs of 8 + 4 steps (12.50 epochs, about 98 views of each example at rollout.n 8)",
                 "trainer.total_epochs: 20 x 8 steps (drop_last) = 160 steps",
                 "data.train_batch_size: 1024 prompts", "actor_rollout_ref.rollout.n: 8 -> 8192 responses per step",
                 "actor.ppo_mini_batch_size: 256 prompts = 2048 responses -> 4 optimiser steps per rollout",
                 "actor.ppo_micro_batch_size_per_gpu: 2 (2048 / 16 GPUs / 2 = 64 accumulated",
                 "log_prob_micro_batch_size: 160 global // 16 GPUs = 10 per GPU (train.logprob_micro_batch_size 10)",
                 "rollout.tensor_model_parallel_size: 2 (8 engines)", "trainer.nnodes x n_gpus_per_node: 2 x 8",
                 "a trainer step (global_steps): one rollout of 1024 prompts and its 4 optimiser steps = one RL step",
                 "8532 training rows: a typo for the file's 8523",
                 "100 x 4 = 400 optimiser steps; schedule verl_constant over 100 RL steps (one lr per RL step), warmup "
                 "0: RL step 1 at lr 0"):
        assert line in out, (line, out)


def test_explain_states_the_32b_layout(shared_data):
    proc = explain("recipe=simplerl_zoo_32b")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for line in ("64 learner GPU(s) on 8 node(s) x 8; rollout.engine=vllm: 8 vLLM engine(s) x TP 8", "micro_batch_size 2 x 16 accumulated",
                 "160 global // 64 GPUs = 2 per GPU (train.logprob_micro_batch_size 2)"):
        assert line in proc.stdout, (line, proc.stdout)


def test_explain_shows_the_arithmetic_a_bad_override_breaks(shared_data):
    proc = explain("recipe=simplerl_zoo_7b", "train.group_size=7")
    assert proc.returncode == 1
    assert "train.prompts_per_step x train.group_size = 1024 x 7 = 7168 completions is not divisible by " \
           "train.mini_batch_size=2048" in proc.stderr


# override, what the refusal names (each breaks an invariant of the source's 16-GPU run)
BAD = [
    ("rollout.vllm.tensor_parallel_size=3", "layout.learner_gpus=16 is not a multiple of "
                                            "rollout.vllm.tensor_parallel_size=3"),
    ("train.micro_batch_size=3", "train.mini_batch_size=2048 is not divisible by train.micro_batch_size x world size "
                                 "= 3 x 16"),
    ("train.mini_batch_size=3000", "8192 completions is not divisible by train.mini_batch_size=3000"),
    ("verifier.text=prompt", "verifier.text='prompt': expected one of ['completion', 'prompt_completion_raw']"),
]


@pytest.mark.parametrize("override,reason", BAD, ids=[b[0] for b in BAD])
def test_a_broken_source_invariant_is_refused_with_the_reason(monkeypatch, override, reason):
    monkeypatch.setenv("WORLD_SIZE", "16")
    with pytest.raises(ConfigError) as err:
        prepare(compose(["recipe=simplerl_zoo_7b", override]), world=16, packages=False)
    assert reason in str(err.value)


def test_prompts_are_the_pretemplated_text_and_gold_the_ground_truth(shared_data, monkeypatch):
    """prompt[0]['content'] verbatim, no chat template; the 1024-character filter on both splits; the test split's
    gold from reward_model.ground_truth (it has no answer column)."""
    import pyarrow.parquet as pq

    from core.data import prompts as D
    from core.models.loading import build_char_tokenizer

    monkeypatch.setenv("RLR_DATA_DIR", str(shared_data))
    cfg = compose(["recipe=simplerl_zoo_7b", f"paths.data_dir={shared_data}"])
    train, test = D.load_split(cfg.data, "train"), D.load_split(cfg.data, "eval")
    assert (len(train), len(test)) == (8360, 496)
    raw = pq.read_table(shared_data / "simplerl_zoo/simplelr_qwen_level3to5/test.parquet").to_pylist()
    kept = [r for r in raw if len(r["prompt"][0]["content"]) <= 1024]
    assert [r["prompt"] for r in test] == [r["prompt"][0]["content"] for r in kept]
    assert [r["answer"] for r in test] == [r["reward_model"]["ground_truth"] for r in kept]
    assert all(r["prompt"].startswith("<|im_start|>system\n") and r["prompt"].endswith("<|im_start|>assistant\n")
               for r in train)
    tok = build_char_tokenizer("qwen2")
    _, ids = D.tokenize_rows(train[:3], cfg.data, tok)
    assert ids == [tok(r["prompt"], add_special_tokens=False)["input_ids"] for r in train[:3]]


def _base_model_rollout(tok):
    """A pre-templated prompt and a base model's response that runs past <|im_end|> into a new turn (the 14B/32B runs
    have no stop ids), ended by <|endoftext|>; the EOS is <|endoftext|>, as for a Qwen2.5 base tokenizer."""
    from core.rollout.batch import assemble, left_pad

    prompt = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n2+3?<|im_end|>\n" \
             "<|im_start|>assistant\n"
    response = "So \\boxed{5}<|im_end|>\n<|im_start|>user\nAnd 3+4?<|im_end|>\n<|im_start|>assistant\n" \
               "\\boxed{7}<|endoftext|>"
    ids, mask = left_pad([tok(prompt, add_special_tokens=False)["input_ids"]], tok.pad_token_id)
    resp = torch.tensor([tok(response, add_special_tokens=False)["input_ids"]])  # [1, R]
    return assemble(ids, mask, resp, [tok.convert_tokens_to_ids("<|endoftext|>")], tok.pad_token_id,
                    torch.zeros(resp.shape, dtype=torch.float))


def test_the_reward_reads_what_verls_reward_manager_decodes():
    """veRL scores prompt + response decoded with special tokens, cut at the first <|im_end|>: the first turn's
    answer. The completion text without special tokens would score the last turn's."""
    from core.models.loading import build_char_tokenizer
    from core.rollout.texts import REWARD_TEXTS
    from recipes.rl_rewards import decode_responses
    from verifiers import get_verifier

    tok = build_char_tokenizer("qwen2")
    roll = _base_model_rollout(tok)
    completions = decode_responses(tok, roll)
    raw = REWARD_TEXTS.get("prompt_completion_raw")(tok, roll, completions)
    assert raw[0].startswith("<|im_start|>system") and raw[0].endswith("\\boxed{7}<|endoftext|>")
    assert REWARD_TEXTS.get("completion")(tok, roll, completions) == completions
    reward = get_verifier("math_simplerl")
    assert reward(raw, answer=["5"], workers=1) == [1.0]
    assert reward(completions, answer=["5"], workers=1) == [0.0]


# make test runs the 7B recipe; 14B and 32B (about 20 s each) run in make test-slow.
@pytest.mark.parametrize("name", [n if n == "simplerl_zoo_7b" else slow(n) for n in RECIPES])
def test_each_recipe_runs_end_to_end_at_tiny_scale(name, tmp_path, shared_data):
    cmd = [sys.executable, "-m", "recipes.run", f"recipe={name}", "scale=tiny", "cpu_threads=1",
           "logger.progress=false", "logger.tensorboard=false", f"hydra.run.dir={tmp_path / 'run'}",
           f"paths.results_dir={tmp_path}"]
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, env={**CLI_ENV, "RLR_DATA_DIR": str(shared_data)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert [(r["recipe"], r["scale"], r["steps"]) for r in rows] == [(name, "tiny", 2)]
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    trained = [s for s in steps if "reward/mean" in s]
    assert [s["step"] for s in trained] == [1, 2]
    saved = OmegaConf.load(tmp_path / "run" / "config.yaml")  # the batch structure kept: 4 x 8, 4 optimiser steps
    assert (saved.train.prompts_per_step, saved.train.group_size, saved.train.mini_batch_size) == (4, 8, 8)
    assert saved.verifier.text == "prompt_completion_raw" and saved.rollout.stop_token_ids == \
        EXACT[name]["rollout.stop_token_ids"]
