"""Supervised warm start: a few steps of next-token training on (prompt, target) pairs.

Used by recipes that start RL from a base model too weak to earn any reward (the CPU demo): the
warm-started model is cached like a built model, keyed by everything that determines it.
"""
from __future__ import annotations

import random
from pathlib import Path

import torch

from core.models import cached_build, load_causal_lm, load_tokenizer
from core.policy import position_ids
from core.rollout import left_pad


def sft_batch(pairs: list[tuple[list[int], list[int]]], pad_id: int):
    """Left-padded ``ids [B, T]``, ``mask [B, T]`` and ``labels [B, T]`` (-100 except on targets)."""
    ids, mask = left_pad([p + t for p, t in pairs], pad_id)
    labels = torch.full_like(ids, -100)
    for i, (_, t) in enumerate(pairs):
        labels[i, ids.shape[1] - len(t):] = torch.tensor(t)
    return ids, mask, labels


def train_sft(model, pairs, steps: int, batch_size: int, lr: float, seed: int, pad_id: int) -> list[float]:
    """Plain AdamW next-token loss on the target tokens; returns the loss per step."""
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    losses = []
    for _ in range(steps):
        ids, mask, labels = sft_batch(rng.sample(pairs, min(batch_size, len(pairs))), pad_id)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).logits
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def warm_started_dir(base_dir: str, model_cfg, ws_cfg, prompts: list[list[int]], answers: list[str]) -> Path:
    """Folder of ``base_dir`` after ``ws_cfg.steps`` SFT steps on ``target.format(answer=...)``.

    Seeded by ``ws_cfg.seed``, not the run seed: the warm start is part of the starting policy, so
    a seed sweep measures RL's variance from one fixed start (and builds the start once).
    """
    seed = int(ws_cfg.seed)
    # the thread count is part of the key: it sets the GEMMs' float rounding, and the outcome of 400
    # SFT steps on a tiny model depends on it (conf/recipe/tiny_math_grpo.yaml, cpu_threads)
    key = {"base": base_dir, "ws": dict(ws_cfg), "n": len(prompts),
           "data": [prompts[:50], answers[:50]], "threads": torch.get_num_threads()}

    def build(out: Path) -> None:
        tok = load_tokenizer(base_dir)
        model = load_causal_lm(base_dir, model_cfg)
        eos = [tok.eos_token_id]
        pairs = [(p, tok(ws_cfg.target.format(answer=a), add_special_tokens=False)["input_ids"] + eos)
                 for p, a in zip(prompts, answers)]
        torch.manual_seed(seed)
        losses = train_sft(model, pairs, int(ws_cfg.steps), int(ws_cfg.batch_size), float(ws_cfg.lr), seed,
                           tok.pad_token_id)
        model.save_pretrained(out)
        tok.save_pretrained(out)
        (out / "sft_loss.txt").write_text("\n".join(f"{x:.5f}" for x in losses))

    return cached_build("warm_start", key, build)
