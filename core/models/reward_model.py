"""Scalar-head reward models: build/load, LoRA, pair batches, the Bradley-Terry loss, reward stats.

The model is a plain ``AutoModelForSequenceClassification(num_labels=1)``, so a trained RM saves and
loads in Hugging Face format and RL recipes can use it as a reward source or a value-model start.
The reward of a sequence is the ``score`` head at its last non-pad token; chosen and rejected go
through one forward pass (``[chosen; rejected]``, as Open-Instruct, OpenRLHF and TRL all do).
"""
from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from core.models.packing import cu_seqlens, varlen_kwargs
from core.registry import Registry
from core.training import distributed
from core.training.device import DTYPES

# Score-head initialisation for a head that the checkpoint does not have (name -> std(hidden)).
HEAD_INITS: Registry = Registry("train.head_init")
HEAD_INITS.register("transformers")(lambda hidden: None)  # keep the library's own init
# Open-Instruct reward_modeling.py layer_init: N(0, 1/sqrt(hidden+1)) (Stiennon et al. 2020, p. 11).
HEAD_INITS.register("inv_sqrt_hidden")(lambda hidden: 1 / math.sqrt(hidden + 1))
# OpenRLHF models/model.py: N(0, 1/(hidden+1)).
HEAD_INITS.register("inv_hidden")(lambda hidden: 1 / (hidden + 1))

# ----------------------------------------------------------------------------- model
def load_reward_model(path: str, model_cfg, head_init: str = "transformers", pad_token_id: int | None = None,
                      writable=contextlib.nullcontext):
    """``AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)`` with dtype, attention
    and gradient checkpointing from ``model_cfg``; a fresh head is initialised per ``head_init``, under
    ``writable(params)``. Under ZeRO-3, call it inside ``Backend.placed()`` with ``Backend.writable``
    (core/training/backend.py)."""
    from transformers import AutoModelForSequenceClassification

    from core.models.loading import require_attention, with_checkpointing

    attn = model_cfg.attn_implementation
    require_attention(attn)
    from core.hub import reading

    with reading("model", "model.name_or_path", path):
        model, info = AutoModelForSequenceClassification.from_pretrained(
            path, num_labels=1, dtype=DTYPES[model_cfg.dtype], attn_implementation=attn, output_loading_info=True)
    if pad_token_id is not None:
        model.config.pad_token_id = pad_token_id  # HF's own pooling finds the last non-pad token with it
    fresh_head = any(k.startswith("score.") for k in info["missing_keys"])
    std = HEAD_INITS.get(head_init)(model.config.hidden_size)
    if fresh_head and std is not None:
        with writable([model.score.weight]):  # ZeRO-3: gathered, initialised on rank 0, partitioned back
            torch.nn.init.normal_(model.score.weight, std=std)
    return with_checkpointing(model, model_cfg)


def _parts(model):
    """(backbone, head) of a sequence-classification model, LoRA-wrapped or not."""
    seq = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(seq, seq.base_model_prefix), seq.score


def sequence_rewards(model, batch: dict) -> torch.Tensor:
    """Reward per sequence ``[N]``: the head at ``batch['last']`` of the backbone's hidden states."""
    backbone, head = _parts(model)
    if "position_ids" in batch:  # padding-free: one row, sequences told apart by position_ids (flash: cu_seqlens)
        varlen = varlen_kwargs(backbone, batch["cu_seqlens"], batch["max_length"])
        out = backbone(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False, **varlen)
        hidden = out.last_hidden_state[0, batch["last"]]  # [N, H]
    else:
        out = backbone(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
        rows = torch.arange(batch["input_ids"].shape[0], device=batch["input_ids"].device)
        hidden = out.last_hidden_state[rows, batch["last"]]  # [N, H]
    return head(hidden).squeeze(-1).float()  # [N]


# ----------------------------------------------------------------------------- LoRA
def model_skeleton(model_cfg, path: str | None = None):
    """The sequence-classification model on the meta device (no weights): for checks before a build."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    if model_cfg.name_or_path or path:
        config = AutoConfig.from_pretrained(path or model_cfg.name_or_path)
    else:
        from core.models.loading import tiny_config

        config = tiny_config(model_cfg)
    config.num_labels = 1
    with torch.device("meta"):
        return AutoModelForSequenceClassification.from_config(config)


def check_lora_targets(lora_cfg, skeleton) -> list[str]:
    """Names of the modules ``lora.target_modules`` matches; a clear error when it matches none."""
    targets = lora_cfg.target_modules
    if targets == "all-linear":  # peft spares the head only for task SEQ_CLS (apply_lora)
        hits = [n for n, m in skeleton.named_modules() if isinstance(m, torch.nn.Linear)
                and not (n.endswith("score") and lora_cfg.task_type == "SEQ_CLS")]
    else:
        names = [targets] if isinstance(targets, str) else list(targets)
        hits = [n for n, _ in skeleton.named_modules() if any(n == t or n.endswith("." + t) for t in names)]
    if not hits:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in skeleton.named_modules() if isinstance(m, torch.nn.Linear)})
        raise ValueError(f"lora.target_modules={targets!r} matches no module of {type(skeleton).__name__}; "
                         f"linear layer names: {linear} (or use all-linear)")
    return hits


def apply_lora(model, lora_cfg):
    """Wrap ``model`` with peft LoRA. ``lora.task_type`` SEQ_CLS: the ``score`` head is one of peft's
    ``modules_to_save`` and trains in full. None, as OpenRLHF builds it (openrlhf/models/model.py:111-120 @06ab51e,
    ``LoraConfig`` without a task type; the same at v0.3.7): ``all-linear`` then matches the head too (peft excludes it
    only for SEQ_CLS, ``_maybe_include_all_linear_layers``), so the head gets a rank-r adapter and its randomly
    initialised base weight stays frozen."""
    from peft import LoraConfig, get_peft_model

    targets = lora_cfg.target_modules
    config = LoraConfig(task_type=lora_cfg.task_type, r=lora_cfg.rank, lora_alpha=int(lora_cfg.alpha),
                        lora_dropout=lora_cfg.dropout, bias="none",
                        target_modules=targets if isinstance(targets, str) else list(targets))
    return get_peft_model(model, config)


def trainable_names(model) -> list[str]:
    return [n for n, p in model.named_parameters() if p.requires_grad]


# ----------------------------------------------------------------------------- batches
def pair_batch(pairs: list[dict], pad_id: int, padding_side: str = "right") -> dict:
    """``[chosen_1..B; rejected_1..B]`` padded to one length: input_ids/attention_mask ``[2B, L]``,
    ``last`` ``[2B]`` (index of each row's last real token) and ``margin`` ``[B]``."""
    seqs = [p["chosen"] for p in pairs] + [p["rejected"] for p in pairs]
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), L), dtype=torch.long)
    for i, s in enumerate(seqs):
        sl = slice(L - len(s), L) if padding_side == "left" else slice(0, len(s))
        ids[i, sl], mask[i, sl] = torch.tensor(s), 1
    last = L - 1 - mask.fliplr().argmax(dim=1)  # [2B] last non-pad position, either padding side
    return {"input_ids": ids, "attention_mask": mask, "last": last,
            "margin": torch.tensor([float(p.get("margin", 0.0)) for p in pairs])}


def packed_batch(pairs: list[dict]) -> dict:
    """Padding-free: every chosen then every rejected sequence in one row ``[1, T]``, with position ids
    restarting at 0 per sequence (attention stays inside each sequence); ``last`` ``[2B]``; the boundaries
    for flash attention (``cu_seqlens`` ``[2B + 1]``, ``max_length`` an int: known here, on the host)."""
    seqs = [p["chosen"] for p in pairs] + [p["rejected"] for p in pairs]
    lens = torch.tensor([len(s) for s in seqs])  # [2B]
    ids = torch.tensor([t for s in seqs for t in s]).unsqueeze(0)  # [1, T]
    pos = torch.cat([torch.arange(len(s)) for s in seqs]).unsqueeze(0)  # [1, T]
    last = torch.cumsum(lens, 0) - 1  # [2B]
    return {"input_ids": ids, "position_ids": pos, "last": last, "cu_seqlens": cu_seqlens(lens),
            "max_length": max(len(s) for s in seqs),
            "margin": torch.tensor([float(p.get("margin", 0.0)) for p in pairs])}


# ----------------------------------------------------------------------------- loss
def bt_loss(r: torch.Tensor, margin: torch.Tensor, loss_cfg) -> tuple[torch.Tensor, dict]:
    """Bradley-Terry on ``r = [r_chosen; r_rejected]`` ``[2B]``: mean ``-log sigmoid(r_c - r_r - m)``
    (m = the margin column when ``use_margin``), plus ``center_coef * mean((r_c + r_r)^2)`` when set."""
    B = r.shape[0] // 2
    rc, rr = r[:B], r[B:]  # [B], [B]
    diff = rc - rr - (margin if loss_cfg.use_margin else 0.0)
    loss = -F.logsigmoid(diff).mean()
    if loss_cfg.center_coef:
        loss = loss + loss_cfg.center_coef * ((rc + rr) ** 2).mean()  # Eisenstein et al. 2023
    return loss, pair_metrics(rc.detach(), rr.detach())


def pair_metrics(rc: torch.Tensor, rr: torch.Tensor) -> dict:
    """Detached scalar tensors on the rewards' device (``core.reporting.metrics.to_floats`` turns them into floats
    once a step, not once a micro-batch)."""
    return {"accuracy": (rc > rr).float().mean(), "margin": (rc - rr).mean(),
            "reward/chosen": rc.mean(), "reward/rejected": rr.mean()}


def reward_stats(rewards: torch.Tensor) -> dict:
    """Mean and std of rewards (OpenRLHF: std clamped at 1e-8); RL divides by them to normalise."""
    return {"mean": rewards.mean().item(), "std": max(rewards.std(unbiased=False).item(), 1e-8)}


# ----------------------------------------------------------------------------- save / use
def save_reward_model(engine, tokenizer, out_dir: Path, stats: dict, writable=contextlib.nullcontext) -> None:
    """A plain HF folder: LoRA merged into the base weights, reward mean/std in ``config.json``
    (``mean``/``std``, OpenRLHF's names) and in ``reward_stats.json``. Collective (every rank calls it).

    Under ZeRO-3 each rank holds a slice of every weight and peft's merge needs whole ones: the merge runs on
    gathered parameters and rank 0's merged weights are partitioned back (``writable``: the backend's,
    :meth:`core.training.backend.Backend.writable`), then saved consolidated. (OpenRLHF's LoRA RM runs ZeRO-2 and
    merges after training, ``save_model``.)"""
    module = engine.module
    if hasattr(module, "merge_and_unload"):
        with writable(module.parameters()):
            merged = module.merge_and_unload()
        engine.module = module = merged
    module.config.mean, module.config.std = stats["mean"], stats["std"]
    engine.save_pretrained(out_dir, tokenizer)  # collective: ZeRO-3 gathers, rank 0 writes
    if distributed.is_main():
        (Path(out_dir) / "reward_stats.json").write_text(json.dumps(stats, indent=1))


@torch.no_grad()
def score_texts(model, tokenizer, texts: list[str], normalize: bool = False, batch_size: int = 16) -> torch.Tensor:
    """Rewards ``[N]`` of finished texts from a saved RM (RL's learned reward source); ``normalize``
    returns ``(r - mean) / std`` with the stats saved beside the model (OpenRLHF --normalize_reward). On the
    model's device."""
    out = []
    for i in range(0, len(texts), batch_size):
        ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts[i:i + batch_size]]
        b = pair_batch([{"chosen": s, "rejected": s} for s in ids], tokenizer.pad_token_id, "right")
        device = next(model.parameters()).device
        out.append(sequence_rewards(model, {k: v.to(device) for k, v in b.items()})[: len(ids)])
    r = torch.cat(out)
    if normalize:
        r = (r - float(model.config.mean)) / float(model.config.std)
    return r
