"""Advantage estimators, keyed by ``advantage.name``.

Every estimator takes the same :class:`AdvantageInput` and the ``advantage`` config node and returns
``(advantages [N, R], returns [N, R])``; the call site only looks the name up.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from core.registry import Registry


@dataclass
class AdvantageInput:
    scores: torch.Tensor  # [N] one scalar reward per completion; N = prompts x group_size, group-major
    response_mask: torch.Tensor  # [N, R]
    group_size: int  # G: completions per prompt, consecutive rows
    values: torch.Tensor | None = None  # [N, R] critic values (value-model estimators only)


AdvantageFn = Callable[[AdvantageInput, object], "tuple[torch.Tensor, torch.Tensor]"]
ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")


_STD_SCOPES = {
    "group": lambda r, unbiased: r.std(-1, keepdim=True, unbiased=unbiased),  # [B, 1]
    "batch": lambda r, unbiased: r.flatten().std(unbiased=unbiased).expand(r.shape[0], 1),  # [B, 1]
    "none": None,
}


@ADVANTAGES.register("grpo", min_group_size=2)
def grpo(inp: AdvantageInput, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO group-normalised advantage (Shao et al. 2024, DeepSeekMath eq. 3; TRL ``GRPOTrainer``):
    ``A_i = (r_i - mean_group(r)) / (std + eps)``, broadcast to every response token.

    ``cfg.std``: ``group`` (per-group std, TRL/veRL default), ``batch`` (std over the whole batch,
    TRL ``scale_rewards="batch"``) or ``none`` (no scaling). ``cfg.unbiased_std``: Bessel-corrected
    std (``torch.std``, TRL) or not. ``cfg.eps``: 1e-4 in TRL, 1e-6 in veRL.
    """
    r = inp.scores.float().view(-1, inp.group_size)  # [B, G]
    centred = r - r.mean(-1, keepdim=True)  # [B, G]
    if cfg.std not in _STD_SCOPES:
        raise ValueError(f"advantage.std={cfg.std!r}; expected one of {sorted(_STD_SCOPES)}")
    scope = _STD_SCOPES[cfg.std]
    if scope is None:
        adv = centred.flatten()  # [N] Dr. GRPO-style: no std scaling
    else:
        std = scope(r, bool(cfg.get("unbiased_std", True)))  # [B, 1]
        adv = (centred / (std + float(cfg.eps))).flatten()  # [N]
    adv = adv.unsqueeze(-1) * inp.response_mask  # [N, R]
    return adv, adv
