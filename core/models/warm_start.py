"""Supervised warm start: next-token training on (prompt, target) pairs until the model earns reward.

Used by recipes that start RL from a base model too weak to earn any reward (the CPU demo). A fixed
step count is a knife's edge on a tiny model: how far 400 steps get depends on the float rounding of the
machine's kernels (greedy accuracy after them ranged 0.055-0.26 across CPUs and thread counts), and RL
from a start that almost never earns reward learns nothing. So the warm start trains in rounds of
``eval_every`` steps and stops at the first round whose greedy accuracy on held-out *training* prompts
(the last ``holdout`` rows, never trained on; the run's eval split stays untouched) reaches
``target_accuracy``, or after ``steps``. The warm-started model is cached like a built model, keyed by
everything that determines it, the machine's kernel choice and thread count included.
"""
from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import torch

from core.config.frozen import FrozenConfig
from core.config.schema import RolloutConfig, node
from core.models.loading import cached_build, load_causal_lm, load_tokenizer, save_from_any_rank
from core.models.packing import position_ids
from core.rollout.batch import Sampling, left_pad
from core.training.device import fork_rng

log = logging.getLogger(__name__)


def sft_batch(pairs: list[tuple[list[int], list[int]]], pad_id: int, device):
    """Left-padded ``ids [B, T]``, ``mask [B, T]`` and ``labels [B, T]`` (-100 except on targets)."""
    ids, mask = left_pad([p + t for p, t in pairs], pad_id)
    labels = torch.full_like(ids, -100)
    for i, (_, t) in enumerate(pairs):
        labels[i, ids.shape[1] - len(t):] = torch.tensor(t)
    return ids.to(device), mask.to(device), labels.to(device)


def sft_steps(model, opt, pairs, steps: int, batch_size: int, rng: random.Random, pad_id: int) -> list[float]:
    """``steps`` AdamW steps of the next-token loss on the target tokens; returns the loss per step."""
    device = next(model.parameters()).device
    model.train()
    losses = []
    for _ in range(steps):
        ids, mask, labels = sft_batch(rng.sample(pairs, min(batch_size, len(pairs))), pad_id, device)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).logits
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def greedy_accuracy(model, tokenizer, prompts: list[list[int]], answers: list[str], verifier,
                    max_new_tokens: int) -> float:
    """Share of ``prompts`` whose greedy completion the verifier calls correct: ``verifier(texts, answer=...)``
    returns scores whose ``correct`` holds each one's verdict by the correctness term (verifiers/correctness.py)."""
    from core.rollout.hf import HFGenerateRollout

    engine = HFGenerateRollout(model, tokenizer, node(RolloutConfig))  # the schema's defaults
    roll = engine.generate(prompts, Sampling(max_new_tokens=max_new_tokens, temperature=0.0))
    ids = roll.response_ids.masked_fill(roll.response_mask == 0, tokenizer.pad_token_id)
    texts = tokenizer.batch_decode(ids.tolist(), skip_special_tokens=True)
    return sum(1 for ok in verifier(texts, answer=answers).correct if ok) / len(prompts)


def warm_start_model_cfg(model_cfg) -> FrozenConfig:
    """``model`` for the warm start's pass: float32 (plain AdamW on the weights), so flash attention, which runs
    in float16/bfloat16 only, becomes sdpa; eager and sdpa are kept (the cached starts built with them stay
    valid). The saved weights do not depend on the kernel's name: the RL run loads them with its own choice."""
    attn = model_cfg.attn_implementation
    return FrozenConfig({**model_cfg, "dtype": "float32",
                         "attn_implementation": "sdpa" if attn.startswith("flash_attention") else attn})


def warm_started_dir(base_dir: str, model_cfg, ws_cfg, prompts: list[list[int]], answers: list[str],
                     device: torch.device, verifier, max_new_tokens: int) -> Path:
    """Folder of ``base_dir`` after the warm start of ``ws_cfg`` (``train.warm_start``) on
    ``target.format(answer=...)``, with ``warm_start.json`` saying how it went.

    Seeded by ``ws_cfg.seed``, not the run seed: the warm start is part of the starting policy, so
    a seed sweep measures RL's variance from one fixed start (and builds the start once).
    """
    hold = ws_cfg.holdout
    if hold >= len(prompts):
        raise ValueError(f"train.warm_start.holdout={hold} leaves no training rows of {len(prompts)}")
    # thread count, kernel choice and device set the float rounding that the outcome depends on; ``enabled`` says
    # whether it runs, not what it builds (auto and true share an entry, and those built before the key stay valid)
    ws = {k: v for k, v in ws_cfg.items() if k != "enabled"}
    key = {"base": base_dir, "ws": ws, "n": len(prompts), "data": [prompts[:50], answers[:50]],
           "threads": torch.get_num_threads(), "cpu": torch.backends.cpu.get_cpu_capability(), "device": device.type,
           "max_new_tokens": max_new_tokens}

    def build(out: Path) -> None:
        tok = load_tokenizer(base_dir)
        model = load_causal_lm(base_dir, warm_start_model_cfg(model_cfg)).to(device)
        eos = [tok.eos_token_id]
        pairs = [(p, tok(ws_cfg.target.format(answer=a), add_special_tokens=False)["input_ids"] + eos)
                 for p, a in zip(prompts[:-hold], answers[:-hold])]
        torch.manual_seed(ws_cfg.seed)
        rng = random.Random(ws_cfg.seed)
        opt = torch.optim.AdamW(model.parameters(), lr=ws_cfg.lr)
        losses, rounds = [], []
        while len(losses) < ws_cfg.steps:
            losses += sft_steps(model, opt, pairs, min(ws_cfg.eval_every, ws_cfg.steps - len(losses)),
                                ws_cfg.batch_size, rng, tok.pad_token_id)
            acc = greedy_accuracy(model, tok, prompts[-hold:], answers[-hold:], verifier, max_new_tokens)
            rounds.append({"step": len(losses), "accuracy": acc})
            log.info("warm start: step %d/%d, loss %.4f, held-out training accuracy %.3f (target %s)", len(losses),
                     ws_cfg.steps, losses[-1], acc, ws_cfg.target_accuracy)
            if acc >= ws_cfg.target_accuracy:
                break
        save_from_any_rank(model, out)
        tok.save_pretrained(out)
        (out / "warm_start.json").write_text(json.dumps({"rounds": rounds, "loss": losses}, indent=1))

    def isolated(out: Path) -> None:  # the run's RNG streams must not depend on whether the start was cached
        with fork_rng(device):
            build(out)

    return cached_build("warm_start", key, isolated)
