"""The RM recipes: exact published values, a source comment each, and an end-to-end run at
``scale=tiny`` that saves a Hugging Face RM with reward mean/std (slow: the learning evidence)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from core.paths import CONF_DIR, PROJECT_ROOT

from core.config.composition import compose

RM_RECIPES = sorted(p.stem for p in (CONF_DIR / "recipe").glob("*.yaml") if "\nloop: rm" in p.read_text()
                    or p.stem.startswith("openrlhf_rm_"))

# Values from ../shared/reference/open_instruct.md 1.1 and openrlhf.md 1a, 1b, 1d.
EXACT = {
    "open_instruct_rm_8b": {
        "seed": 1, "model.name_or_path": "allenai/Llama-3.1-Tulu-3-8B-SFT", "model.gradient_checkpointing": True,
        "data.hub_name": "allenai/llama-3.1-tulu-3-8b-preference-mixture",
        "data.eval_hub_name": "allenai/ultrafeedback_binarized_cleaned", "data.eval_split": "test_prefs",
        "data.eval_max_pairs": 100, "data.too_long": "drop", "data.max_prompt_tokens": 2048,
        "data.length_filter_bug": True, "data.bad_rows": "keep", "layout.learner_gpus": 8,
        "train.batch_size": 256, "train.micro_batch_size": 1,
        "train.epochs": 1, "train.max_len": 2048, "train.padding_side": "right", "train.head_init": "transformers",
        "train.lora.rank": 0, "optim.optimizer.lr": 3e-6, "optim.optimizer.eps": 1e-5,
        "optim.optimizer.weight_decay": 0.01, "optim.optimizer.betas": [0.9, 0.999], "optim.max_grad_norm": 1.0,
        "optim.scheduler.name": "linear", "optim.scheduler.warmup_steps": 0, "optim.scheduler.warmup_ratio": 0.0,
        "zero.stage": 3, "model.dtype": "bfloat16",
    },
    "openrlhf_rm_llama3_8b": {
        "seed": 42, "model.name_or_path": "OpenRLHF/Llama-3-8b-sft-mixture",
        "model.attn_implementation": "flash_attention_2", "model.dtype": "bfloat16",
        "model.gradient_checkpointing": True, "data.hub_name": "OpenRLHF/preference_dataset_mixture2_and_safe_pku",
        "data.eval": "train_head", "data.eval_fraction": 0.01, "data.force_eos": True, "data.too_long": "truncate",
        "data.eos_separator": " ", "data.bad_rows": "keep", "data.max_prompt_tokens": None,
        "data.length_filter_bug": False, "data.chat_template_override": None, "layout.learner_gpus": 8,
        "train.lora.task_type": None, "train.batch_size": 256, "train.micro_batch_size": 1, "train.epochs": 1,
        "train.max_len": 8192, "train.padding_side": "left", "train.head_init": "inv_hidden", "train.packing": True,
        "train.loss.use_margin": False, "train.lora.rank": 0, "optim.optimizer.lr": 9e-6,
        "optim.optimizer.betas": [0.9, 0.95], "optim.optimizer.eps": 1e-8, "optim.optimizer.weight_decay": 0.0,
        "optim.max_grad_norm": 1.0, "optim.scheduler.name": "cosine_with_min_lr",
        "optim.scheduler.warmup_ratio": 0.03, "optim.scheduler.kwargs": {"min_lr_rate": 0.1},
        "zero.stage": 3,
    },
}
EXACT["openrlhf_rm_llama3_8b_4090"] = {
    **EXACT["openrlhf_rm_llama3_8b"], "train.batch_size": 126, "train.max_len": 4096, "zero.stage": 2,
    "train.lora.rank": 64, "train.lora.alpha": 64, "train.lora.dropout": 0.0, "train.lora.target_modules": "all-linear",
    "layout.learner_gpus": 6,
}
# The command issue #354 reported, before the maintainer's advice: 8192 tokens, ZeRO-3, no packing (v0.3.5 had none).
EXACT["openrlhf_rm_llama3_8b_4090_8192_zero3"] = {
    **EXACT["openrlhf_rm_llama3_8b_4090"], "train.max_len": 8192, "zero.stage": 3, "train.packing": False,
}


def _get(cfg, dotted):
    from omegaconf import OmegaConf

    v = OmegaConf.select(cfg, dotted)
    return OmegaConf.to_container(v) if hasattr(v, "_metadata") else v


def test_every_rm_recipe_is_discovered_and_cites_a_source():
    assert set(EXACT) <= set(RM_RECIPES) and "tiny_rm" in RM_RECIPES and len(RM_RECIPES) >= 4
    for name in EXACT:
        text = (CONF_DIR / "recipe" / f"{name}.yaml").read_text()
        assert "Source:" in text and any(c in text for c in ("3dd7a07d", "06ab51e", "#354")), name


@pytest.mark.parametrize("name", sorted(EXACT))
def test_recipe_values_match_the_source(name):
    cfg = compose([f"recipe={name}"])
    assert cfg.loop == "rm"
    wrong = {k: (_get(cfg, k), v) for k, v in EXACT[name].items() if _get(cfg, k) != v}
    assert not wrong, wrong


def _run(recipe: str, tmp_path: Path, *extra: str) -> dict:
    cmd = [sys.executable, "-m", "recipes.run", f"recipe={recipe}", "logger.progress=false",
           "logger.tensorboard=false", f"hydra.run.dir={tmp_path / 'run'}", f"paths.results_dir={tmp_path}", *extra]
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((tmp_path / "run" / "summary.json").read_text())


def _check_saved_rm(run_dir: Path, summary: dict) -> None:
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(run_dir / "model")
    assert model.config.num_labels == 1 and not any("lora" in n for n, _ in model.named_parameters())
    stats = json.loads((run_dir / "model" / "reward_stats.json").read_text())
    assert model.config.mean == pytest.approx(summary["reward_mean"]) == pytest.approx(stats["mean"])
    assert model.config.std == pytest.approx(stats["std"]) and stats["std"] > 0


# Every discovered RM recipe runs; the official OpenRLHF one (ZeRO-3 under DeepSpeed, ~40 s) is slow-marked
# to keep the fast suite short: its 4090 variant (same data path, ZeRO-2 + LoRA) runs in the fast set.
# The two ZeRO-3 recipes at tiny scale take 1-2 minutes each on 2 CPU cores (DeepSpeed's stage-3 setup); the
# stage-3 engine is tested in test_zero.py, and these runs go to `make test-slow`.
SLOW_TINY = ("openrlhf_rm_llama3_8b", "openrlhf_rm_llama3_8b_4090", "open_instruct_rm_8b",
             "openrlhf_rm_llama3_8b_4090_8192_zero3")
TINY_RUNS = [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_TINY else n for n in RM_RECIPES]


@pytest.mark.parametrize("name", TINY_RUNS)
def test_recipe_runs_at_tiny_scale_and_saves_a_loadable_rm(name, tmp_path, shared_data):
    s = _run(name, tmp_path, "scale=tiny")
    assert s["steps"] == 4 and s["scale"] == "tiny" and 0.0 <= s["eval_after"] <= 1.0
    _check_saved_rm(tmp_path / "run", s)
    rows = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert [r["recipe"] for r in rows] == [name]
    d = s["data"]["train"]
    if name.startswith("openrlhf"):  # OpenRLHF truncates long pairs (and forces EOS); counted
        assert d["data/train/truncated"] > 0 and d["data/train/too_long_dropped"] == 0
    elif name.startswith("open_instruct"):  # Open-Instruct drops long prompts only; counted; its template saved
        assert d["data/train/too_long_dropped"] > 0 and d["data/train/truncated"] == 0
        from transformers import AutoTokenizer

        assert AutoTokenizer.from_pretrained(tmp_path / "run" / "model").chat_template.startswith(
            "{% for message in messages %}{% if message['role'] == 'system' %}")


@pytest.mark.slow
def test_tiny_rm_reaches_90_percent_held_out_accuracy(tmp_path):
    s = _run("tiny_rm", tmp_path)
    assert s["eval_before"] < 0.6 and s["eval_after"] >= 0.9, s
    _check_saved_rm(tmp_path / "run", s)


@pytest.mark.slow
def test_hh_rlhf_trains_end_to_end_with_a_real_held_out_accuracy(tmp_path, shared_data):
    s = _run("tiny_rm", tmp_path, "data=pairs_hh_rlhf", "train.max_len=1024", "train.batch_size=16",
             "train.micro_batch_size=16", "train.max_steps=40", "train.eval_every=0", "train.eval_batch_size=32")
    assert s["eval_pairs"] > 100 and 0.0 < s["eval_after"] < 1.0 and s["reward_std"] > 1e-4, s
    assert s["data"]["train"]["data/train/too_long_dropped"] > 0
