"""The Open-Instruct recipes (conf/recipe/open_instruct_*.yaml): the source's exact values, the Tulu chat template
verbatim, the published figures through ``recipes.explain``, the reward as the recipes configure it (routes, x10, the
placeholder bug), the local stand-in data, each recipe at ``scale=tiny`` end to end, and overrides that break the
source's batch arithmetic refused with the reason. Values: ../shared/reference/open_instruct.md
(allenai/open-instruct @3dd7a07d for PPO, @c8b66a0e3 for Tulu 3.1 GRPO)."""
from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from core.config.composition import compose
from core.config.pipeline import prepare
from core.config.validate import ConfigError
from core.paths import CONF_DIR
from tests.helpers import explain, results, run_cli

RECIPES = sorted(p.stem for p in (CONF_DIR / "recipe").glob("open_instruct_*.yaml")
                 if "\nloop: rm" not in p.read_text())

# open_instruct/dataset_processor.py CHAT_TEMPLATES["tulu"] @3dd7a07d, copied verbatim.
TULU_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{{ '<|system|>\n' + message['content'] + '\n' }}"
    "{% elif message['role'] == 'user' %}"
    "{{ '<|user|>\n' + message['content'] + '\n' }}"
    "{% elif message['role'] == 'assistant' %}"
    "{% if not loop.last %}"
    "{{ '<|assistant|>\n'  + message['content'] + eos_token + '\n' }}"
    "{% else %}"
    "{{ '<|assistant|>\n'  + message['content'] + eos_token }}"
    "{% endif %}"
    "{% endif %}"
    "{% if loop.last and add_generation_prompt %}"
    "{{ '<|assistant|>\n' }}"
    "{% endif %}"
    "{% endfor %}"
)
IFEVAL_ROUTE = {"name": "ifeval", "kwargs": {"release_behaviour": True, "placeholder_tuple_bug": True}}
# Shared by the three (reference §1.2, §1.3, §3.1, §4).
COMMON = {
    "model.name_or_path": "allenai/Llama-3.1-Tulu-3-8B-DPO", "model.arch": "llama", "model.dtype": "bfloat16",
    "model.gradient_checkpointing": True, "model.attn_implementation": "flash_attention_2",
    "train.disable_dropout": True,  # disable_dropout_in_model on every model
    "data.source": "hub", "data.hub_name": "allenai/RLVR-GSM-MATH-IF-Mixed-Constraints", "data.split": "train",
    "data.eval_split": "train", "data.prompt_key": "messages", "data.answer_key": "ground_truth",
    "data.chat_template": True, "data.chat_template_override": TULU_TEMPLATE, "data.system_prompt": None,
    "data.max_prompt_tokens": 2048, "data.prompt_overflow": "drop", "data.max_prompt_chars": None,
    "rollout.engine": "vllm_server", "rollout.max_new_tokens": 2048, "rollout.temperature": 1.0,
    "rollout.greedy": False, "rollout.top_p": 1.0, "rollout.top_k": -1, "rollout.stop_token_ids": [],
    "rollout.generate_ahead": 1, "rollout.vllm.dtype": "bfloat16", "rollout.vllm.enable_prefix_caching": False,
    "rollout.vllm.max_model_len": 4096, "rollout.vllm.gpu_memory_utilization": 0.9,
    "loss.name": "ppo_clip", "loss.clip_low": 0.2, "loss.clip_high": 0.2, "loss.dual_clip": None,
    "loss.entropy_coef": 0.0, "loss.aggregation": "token_mean", "loss.log_ratio_clamp": None,
    "loss.is_correction.mode": "none", "kl.controller": "fixed", "kl.clamp": None, "kl.reference": "auto",
    "optim.optimizer._target_": "torch.optim.AdamW", "optim.optimizer.betas": [0.9, 0.999],
    "optim.optimizer.eps": 1e-8, "optim.optimizer.weight_decay": 0.01, "optim.optimizer.fused": None,
    "optim.max_grad_norm": 1.0, "optim.scheduler.warmup_steps": 0, "optim.scheduler.warmup_override_bug": True,
    "zero.stage": 3, "zero.offload_optimizer": False, "zero.offload_param": False, "zero.grad_accum_dtype": "fp32",
    "zero.communication_data_type": None,
    "zero.options": {"stage3_prefetch_bucket_size": 0, "stage3_max_live_parameters": 0,
                     "stage3_max_reuse_distance": 0},
    "layout.mode": "dedicated", "verifier.name": "routed",
    "verifier.kwargs": {"route_column": "dataset", "scale": 10.0,
                        "routes": {"gsm8k": "gsm8k", "math": "math_tulu3", "ifeval": IFEVAL_ROUTE}},
    "train.epochs": None, "train.shuffle_mini_batches": True, "train.shaping.none_reward": "zero",
    "train.shaping.mask_truncated": False, "train.shaping.overlong_buffer": 0, "train.shaping.reward_clip": None,
    "train.warm_start.steps": 0, "source.name": "open_instruct", "source.flags.total_episodes": 10_000_000,
}
PPO_8B = {
    **COMMON, "seed": 3, "rollout.vllm.seed": 3, "rollout.vllm.tensor_parallel_size": 1,
    "advantage.name": "gae", "advantage.gamma": 1.0, "advantage.lam": 0.95, "advantage.score_position": "after_last",
    "advantage.whiten": "local", "advantage.critic.init_from": "allenai/Llama-3.1-Tulu-3-8B-RM",
    "advantage.critic.lr": 3e-7, "advantage.critic.coef": 0.1, "advantage.critic.clip": 0.2,
    "kl.estimator": "k1", "kl.coef": 0.05, "kl.placement": "reward", "kl.log_ratio_clamp": None,
    "optim.optimizer.lr": 3e-7, "optim.scheduler.name": "linear", "optim.scheduler.warmup_ratio": 0.0,
    "layout.nodes": 1, "layout.gpus_per_node": 8, "layout.learner_gpus": 7, "layout.rollout_gpus": 1,
    "train.total_steps": 44642, "train.prompts_per_step": 224, "train.group_size": 1, "train.mini_batch_size": 224,
    "train.micro_batch_size": 2, "train.ppo_epochs": 4, "train.logprob_micro_batch_size": 2,
    "train.shaping.non_stop_penalty": -10.0, "train.eval_every": 14880, "train.eval_prompts": 128,
    "train.checkpoint_every": 100,
}
EXACT = {
    "open_instruct_rlvr_8b": PPO_8B,
    "open_instruct_rlvr_70b": {
        **PPO_8B, "seed": 8, "rollout.vllm.seed": 8, "model.name_or_path": "allenai/Llama-3.1-Tulu-3-70B-DPO",
        "rollout.vllm.tensor_parallel_size": 4, "kl.coef": 0.07, "optim.optimizer.lr": 1e-7,
        "advantage.critic.lr": 1e-7, "optim.scheduler.warmup_ratio": 0.1, "layout.nodes": 6,
        "layout.learner_gpus": 40, "layout.rollout_gpus": 4, "train.total_steps": 625, "train.prompts_per_step": 640,
        "train.mini_batch_size": 640, "train.micro_batch_size": 1, "train.logprob_micro_batch_size": 1,
        "train.eval_every": 208, "train.checkpoint_every": 40, "source.flags.total_episodes": 400_000,
    },
    "open_instruct_grpo_8b": {
        **COMMON, "seed": 1, "rollout.vllm.seed": 1, "rollout.vllm.tensor_parallel_size": 2,
        # ground_truth_utils.py @c8b66a0e3 reads the response as it is (no cut at "<|assistant|>\n", no strip)
        "verifier.kwargs": {**COMMON["verifier.kwargs"], "open_instruct_text": "grpo"},
        "advantage.name": "grpo", "advantage.std": "group", "advantage.unbiased_std": True, "advantage.eps": 1e-8,
        "advantage.whiten": "none", "kl.estimator": "k3", "kl.coef": 0.01, "kl.placement": "loss",
        "kl.log_ratio_clamp": 40.0, "optim.optimizer.lr": 5e-7, "optim.scheduler.name": "constant",
        "optim.scheduler.warmup_ratio": 0.0, "layout.nodes": 1, "layout.gpus_per_node": 8, "layout.learner_gpus": 6,
        "layout.rollout_gpus": 2, "train.total_steps": 13020, "train.prompts_per_step": 48, "train.group_size": 16,
        "train.mini_batch_size": 384, "train.micro_batch_size": 2, "train.ppo_epochs": 1,
        "train.logprob_micro_batch_size": 2, "train.shaping.non_stop_penalty": 0.0, "train.eval_every": 434,
        "train.eval_prompts": 16, "train.checkpoint_every": 40,
    },
}


def _get(cfg, dotted):
    v = OmegaConf.select(cfg, dotted, throw_on_missing=True)
    return OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v


def test_the_three_recipes_are_discovered():
    assert RECIPES == sorted(EXACT) and len(RECIPES) == 3


@pytest.mark.parametrize("name", sorted(EXACT))
def test_recipe_values_are_the_sources(name):
    cfg = compose([f"recipe={name}"])
    wrong = {k: (_get(cfg, k), v) for k, v in EXACT[name].items() if _get(cfg, k) != v}
    assert not wrong, wrong
    assert len(EXACT[name]) > 90
    assert "critic" not in cfg.advantage if cfg.advantage.name == "grpo" else cfg.advantage.critic.lr == \
        cfg.optim.optimizer.lr  # the source's one --learning_rate


@pytest.mark.parametrize("name", sorted(EXACT))
def test_steps_are_the_episodes_over_the_samples_per_step(name):
    """num_training_steps = total_episodes // (rollout_batch_size x number_samples_per_prompt)."""
    t = compose([f"recipe={name}"]).train
    episodes = EXACT[name]["source.flags.total_episodes"]
    assert t.total_steps == episodes // (t.prompts_per_step * t.group_size)


def test_the_tulu_template_renders_prompts_as_open_instruct_does():
    """One user message with the generation prompt: ``<|user|>\\n...\\n<|assistant|>\\n``, no BOS (the template has
    none and apply_chat_template adds no special tokens)."""
    from core.data import prompts as D
    from core.models.loading import build_char_tokenizer

    data = compose(["recipe=open_instruct_rlvr_8b"]).data
    tok = build_char_tokenizer("llama")
    ids = D.tokenize_prompt([{"role": "user", "content": "2+3?"}], data, tok)
    assert tok.decode(ids) == "<|user|>\n2+3?\n<|assistant|>\n"
    system = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    assert tok.decode(D.tokenize_prompt(system, data, tok)) == "<|system|>\nS\n<|user|>\nQ\n<|assistant|>\n"


FIGURES = {
    "open_instruct_rlvr_8b": [
        "7 learner GPU(s) + 1 rollout GPU(s) on 1 node(s) x 8; rollout.engine=vllm_server: 1 vLLM engine(s) x TP 1 (dedicated)",
        "--local_rollout_batch_size: 32 -> 32 x 7 = 224 prompts per step",
        "--local_mini_batch_size: 32 -> 1 mini-batch(es) per epoch",
        "--per_device_train_batch_size: 2 (gradient accumulation 16)",
        "--total_episodes: 10,000,000 -> 10,000,000 // 224 = 44,642 steps (= train.total_steps)",
        "44642 x 4 = 178568 optimiser steps; schedule linear over 178568, warmup 0",
        "note: articles say the 8B run trained about 50,000 episodes"],
    "open_instruct_rlvr_70b": [
        "40 learner GPU(s) + 4 rollout GPU(s) on 6 node(s) x 8; rollout.engine=vllm_server: 1 vLLM engine(s) x TP 4 (dedicated)",
        "--local_rollout_batch_size: 16 -> 16 x 40 = 640 prompts per step",
        "--per_device_train_batch_size: 1 (gradient accumulation 16)",
        "--total_episodes: 400,000 -> 400,000 // 640 = 625 steps (= train.total_steps)",
        "--warmup_ratio: 0.1 -> warmup 250 of 2,500 optimiser steps; --warm_up_steps ignored (warmup_override_bug)",
        "4 GPUs while 4 sit idle"],
    "open_instruct_grpo_8b": [
        "6 learner GPU(s) + 2 rollout GPU(s) on 1 node(s) x 8; rollout.engine=vllm_server: 1 vLLM engine(s) x TP 2 (dedicated)",
        "--local_rollout_batch_size: 8 -> 8 x 6 = 48 prompts per step",
        "--number_samples_per_prompt: 16", "--local_mini_batch_size: 64 -> 2 mini-batch(es) per epoch",
        "--per_device_train_batch_size: 2 (gradient accumulation 32)",
        "--total_episodes: 10,000,000 -> 10,000,000 // 768 = 13,020 steps (= train.total_steps)",
        "the doc's echoed full_bsz = 4 x 16 x 7 x 2 = 896 is stale"],
}


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_explain_reproduces_the_published_figures(name):
    proc = explain(f"recipe={name}")  # offline: the hub rows are not read, explain says so
    assert proc.returncode == 0, proc.stderr[-3000:]
    for line in FIGURES[name]:
        assert line in proc.stdout, (line, proc.stdout)


# recipe, overrides, what the refusal names (each breaks an invariant of the source's arithmetic)
BAD = [
    ("open_instruct_rlvr_8b", ["train.prompts_per_step=230"],
     "= 230 x 1 = 230 completions is not divisible by the world size 7"),
    ("open_instruct_rlvr_8b", ["train.micro_batch_size=3"],
     "train.mini_batch_size=224 is not divisible by train.micro_batch_size x world size = 3 x 7"),
    ("open_instruct_rlvr_70b", ["rollout.vllm.tensor_parallel_size=8"],
     "layout.rollout_gpus=4 is not a multiple of rollout.vllm.tensor_parallel_size=8"),
    ("open_instruct_grpo_8b", ["train.mini_batch_size=360"],
     "48 x 16 = 768 completions is not divisible by train.mini_batch_size=360"),
    ("open_instruct_grpo_8b", ["train.group_size=1", "train.mini_batch_size=48"],
     "train.group_size=1: advantage.name=grpo compares completions of one prompt and needs group_size >= 2"),
]


@pytest.mark.parametrize("name,overrides,reason", BAD, ids=[" ".join(b[1]) for b in BAD])
def test_a_broken_source_invariant_is_refused_with_the_reason(monkeypatch, name, overrides, reason):
    learners = int(compose([f"recipe={name}"]).layout.learner_gpus)
    monkeypatch.setenv("WORLD_SIZE", str(learners))
    with pytest.raises(ConfigError) as err:
        prepare(compose([f"recipe={name}", *overrides]), world=learners, packages=False)
    assert reason in str(err.value)


def _reward(**override):
    """The recipes' reward (verifier.name + kwargs, as recipes/rl.py calls it) on one row per route."""
    from verifiers import get_verifier

    kwargs = OmegaConf.to_container(compose(["recipe=open_instruct_rlvr_8b"]).verifier.kwargs)
    kwargs["routes"]["ifeval"]["kwargs"].update(override)
    placeholders = json.dumps({"func_name": "validate_placeholders", "N": 2, "quantifier": None})
    completions = ["so the answer is 18", "The answer is $\\boxed{\\frac{1}{2}}$", "no placeholders here",
                   "so 17"]
    return get_verifier("routed")(completions, dataset=["gsm8k", "MATH", "ifeval", "gsm8k"],
                                  answer=["18", "\\frac{1}{2}", placeholders, "18"], **kwargs)


def test_the_reward_routes_on_the_dataset_column_times_ten_with_the_placeholder_bug():
    """gsm8k -> gsm8k, MATH -> math_tulu3, ifeval -> the release checkers: 10 for verified; the release's
    placeholder checker passes a response without placeholders, and placeholder_tuple_bug=false fails it."""
    assert _reward() == [10.0, 10.0, 10.0, 0.0]
    assert _reward(placeholder_tuple_bug=False) == [10.0, 10.0, 0.0, 0.0]
    from verifiers import get_verifier

    with pytest.raises(TypeError, match="route 'ifeval' is"):
        get_verifier("routed")(["x"], routes={"ifeval": {"verifier": "ifeval"}}, dataset=["ifeval"], answer=["{}"])


def test_the_tiny_stand_in_holds_the_three_sources_in_the_hub_columns(shared_data, monkeypatch):
    """scale=tiny reads GSM8K and MATH500 rows tagged with ``dataset``, and generated IF rows whose ground truth every
    checker accepts; the prefix the evaluation reads holds all three; the data is the same on every call."""
    import inspect

    from core.data import prompts as D
    from verifiers import get_verifier
    from verifiers.ifeval import RELEASE_CHECKERS

    monkeypatch.setenv("RLR_DATA_DIR", str(shared_data))
    cfg = prepare(compose(["recipe=open_instruct_rlvr_8b", "scale=tiny", f"paths.data_dir={shared_data}"]),
                  world=1).config
    assert cfg.data.source == "rlvr_mixture_tiny" and cfg.advantage.critic.init_from is None
    assert cfg.rollout.engine == "hf" and cfg.rollout.vllm.tensor_parallel_size == 1
    rows, again = D.load_split(cfg.data, "train"), D.load_split(cfg.data, "eval")
    assert rows == again and len(rows) == 3 * 64  # eval_split train: the first rows of the training split
    assert [r["dataset"] for r in rows[:6]] == ["gsm8k", "MATH", "ifeval"] * 2
    assert all(isinstance(r["prompt"], list) and r["prompt"][0]["role"] == "user" for r in rows)
    gsm = [json.loads(line) for line in open(shared_data / "gsm8k" / "train.jsonl")][:64]
    math500 = [json.loads(line) for line in open(shared_data / "math500" / "test.jsonl")][:64]
    by = {tag: [r for r in rows if r["dataset"] == tag] for tag in ("gsm8k", "MATH", "ifeval")}
    reward = get_verifier("routed")
    kwargs = OmegaConf.to_container(cfg.verifier.kwargs)
    sols = [r["answer"] for r in gsm] + [r["solution"] for r in math500]
    scored = reward(sols, dataset=["gsm8k"] * 64 + ["MATH"] * 64,
                    answer=[r["answer"] for r in by["gsm8k"] + by["MATH"]], **kwargs)
    assert sum(s == 10.0 for s in scored[:64]) >= 62 and scored[64:] == [10.0] * 64  # reference solutions pass
    names = set()
    for r in by["ifeval"]:
        truth = json.loads(r["answer"])
        fn = RELEASE_CHECKERS[truth.pop("func_name")]
        args = {k: v for k, v in truth.items() if v is not None}
        inspect.signature(fn).bind("some text", **args)  # the checker takes exactly these arguments
        names.add(fn.__name__)
    assert len(names) >= 15 and "release_validate_placeholders" in names


def test_a_tiny_run_of_the_ppo_recipe_writes_its_row(shared_data, tmp_path):
    """The 8B PPO recipe at scale=tiny, end to end (critic, KL in the reward, GAE, the -10 non-stop penalty, the
    routed reward, generation one step ahead), on the plain engine to stay fast; the ZeRO-3 runs are below."""
    proc = run_cli(tmp_path, "recipe=open_instruct_rlvr_8b", "scale=tiny", "zero=none", "zero.grad_accum_dtype=null",
                   "logger.progress=false", "logger.tensorboard=false", f"paths.data_dir={shared_data}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = results(tmp_path)
    assert row["recipe"] == "open_instruct_rlvr_8b" and row["steps"] == 2 and row["scale"] == "tiny"
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "reward/mean" in m]
    assert len(steps) == 2 and all("value/loss" in m and "kl_reward" in m for m in steps)
    assert [m["rollout/policy_lag"] for m in steps] == [0, 1]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXACT))
def test_each_recipe_runs_at_tiny_scale_as_written(shared_data, tmp_path, name):
    """Every recipe as written (DeepSpeed ZeRO-3 on the CPU, fp32 gradient accumulation), two RL steps."""
    proc = run_cli(tmp_path, f"recipe={name}", "scale=tiny", "logger.progress=false", "logger.tensorboard=false",
                   f"paths.data_dir={shared_data}", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = results(tmp_path)
    assert row["recipe"] == name and row["steps"] == 2
