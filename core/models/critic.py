"""The critic for PPO with GAE: a scalar value head on the policy architecture, and its loss.

The critic is an ``AutoModelForSequenceClassification`` with ``num_labels = 1`` whose score head is
applied to *every* position, as Open-Instruct does (allenai/open-instruct@3dd7a07d
``model_utils.get_reward``: backbone hidden states -> ``model.score``). It is loaded from
``advantage.critic.init_from`` (a reward-model folder, Open-Instruct's and OpenRLHF's default) or
else from the policy checkpoint with a fresh head (OpenRLHF ``critic_pretrain`` = actor; head
initialised N(0, 1/(hidden+1)), ``openrlhf/models/model.py``).
"""
from __future__ import annotations

import contextlib

import torch

from core.models import packing as packing_lib
from core.models.loading import with_checkpointing
from core.training.device import DTYPES, fork_rng


def load_critic(policy_path: str, critic_cfg, model_cfg, writable=contextlib.nullcontext):
    """The value model, in the policy's dtype and with the policy's gradient checkpointing (``model``): from
    ``critic_cfg.init_from`` if set, else the policy weights plus a new head, initialised under ``writable(params)``.
    Under ZeRO-3, call it inside ``Backend.placed()`` with ``Backend.writable`` (core/training/backend.py)."""
    from transformers import AutoModelForSequenceClassification

    from core.hub import reading

    path = critic_cfg.init_from or policy_path
    with reading("model", "advantage.critic.init_from" if critic_cfg.init_from else "model.name_or_path", path):
        model = AutoModelForSequenceClassification.from_pretrained(
            str(path), num_labels=1, attn_implementation=model_cfg.attn_implementation,
            dtype=DTYPES[model_cfg.dtype])
    if not critic_cfg.init_from:
        head = model.score.weight
        with torch.no_grad(), fork_rng(head.device), writable([head]):
            torch.manual_seed(critic_cfg.head_seed)
            head.normal_(0.0, 1.0 / (model.config.hidden_size + 1))
    model.config.pad_token_id = model.config.pad_token_id or 0
    return with_checkpointing(model, model_cfg)


def token_values(critic, input_ids, attention_mask, prompt_length: int, packing="auto") -> torch.Tensor:
    """``V(s_t)`` for each response position ``t``: the head on the hidden state that predicts token
    ``P + t`` (positions ``P - 1 .. T - 2``, aligned with the log-probs). Returns ``[N, R]``. Packed when
    :func:`core.models.packing.packs` says so: zero where the input token is padding (every value mask
    lies inside the real inputs, the slot after the EOS included)."""
    P, (N, T) = prompt_length, input_ids.shape
    backbone = getattr(critic, critic.base_model_prefix)
    if T > P and packing_lib.packs(critic, packing):
        rows = packing_lib.pack(input_ids, attention_mask, P, attention_mask[:, P:T - 1])
        hidden = backbone(input_ids=rows.input_ids, position_ids=rows.position_ids, use_cache=False,
                          **rows.attention_kwargs(critic)).last_hidden_state[0, rows.source]  # [J, H]
        return packing_lib.unpack(critic.score(hidden).squeeze(-1).float(), rows)  # [N, R]
    hidden = backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                      position_ids=packing_lib.position_ids(attention_mask)).last_hidden_state  # [N, T, H]
    return critic.score(hidden[:, P - 1:-1]).squeeze(-1).float()  # [N, R]


@torch.no_grad()
def chunked_values(critic, input_ids, attention_mask, prompt_length: int, micro_batch_size: int,
                   packing="auto"):
    """No-grad :func:`token_values` in chunks (the rollout-phase critic forward). ``[N, R]``."""
    was_training = critic.training
    critic.eval()
    outs = [token_values(critic, input_ids[i:i + micro_batch_size], attention_mask[i:i + micro_batch_size],
                         prompt_length, packing) for i in range(0, input_ids.shape[0], micro_batch_size)]
    critic.train(was_training)
    return torch.cat(outs)  # [N, R]


def value_loss(values, old_values, returns, clip) -> torch.Tensor:
    """Per-token clipped value loss (OpenRLHF ``models/loss.py::ValueLoss``, Open-Instruct PPO):
    ``0.5 * max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2)``; ``clip`` null = unclipped.
    Returns ``[N, R]``; the caller aggregates and multiplies by ``critic.coef``."""
    unclipped = (values - returns) ** 2  # [N, R]
    if not clip:
        return 0.5 * unclipped  # [N, R]
    v_clip = old_values + (values - old_values).clamp(-float(clip), float(clip))  # [N, R]
    return 0.5 * torch.maximum(unclipped, (v_clip - returns) ** 2)  # [N, R]
