"""Reward shaping applied to the verifier's scalar scores before any advantage estimator.

Order (OpenRLHF ``OpenRLHF/OpenRLHF@3c3be62`` ``experience_maker.py``): these score-level edits first
(overlong penalty, non-stop penalty, truncation mask), then the estimator's group shaping, then the
reward clip, the placement at the last token and the per-token KL penalty (``core/advantage.py``).
Keys live in ``train.shaping`` (conf/train/grpo.yaml).
"""
from __future__ import annotations

import torch


def non_stop_penalty(scores: torch.Tensor, stopped: torch.Tensor, penalty) -> torch.Tensor:
    """Open-Instruct (allenai/open-instruct@3dd7a07d ``ppo_vllm_thread_ray_gtrl.py``,
    ``--non_stop_penalty --penalty_reward_value -10``): the score of a completion that emitted no EOS
    is *replaced* by ``penalty``. ``None`` = off."""
    if penalty is None:
        return scores
    return torch.where(stopped, scores, torch.full_like(scores, float(penalty)))  # [N]


def overlong_penalty(scores: torch.Tensor, lengths: torch.Tensor, max_len: int, buffer: int,
                     factor: float) -> torch.Tensor:
    """DAPO soft overlong punishment (Yu et al. 2025 eq. 13; OpenRLHF ``--overlong_buffer_len``):
    ``-min(len - (max_len - buffer), buffer) / buffer * factor`` added when ``len > max_len - buffer``."""
    if not buffer:
        return scores
    excess = (lengths.float() - (max_len - buffer)).clamp(min=0)  # [N]
    return scores - excess.clamp(max=buffer) / buffer * factor  # [N]


def truncation_mask(mask: torch.Tensor, stopped: torch.Tensor, enabled: bool) -> torch.Tensor:
    """DAPO overlong filtering (TRL ``mask_truncated_completions``): completions that did not stop
    get an all-zero mask, so they count neither in the loss nor in its token denominators."""
    return mask * stopped.unsqueeze(-1).to(mask.dtype) if enabled else mask  # [N, R]


def shape(scores: torch.Tensor, mask: torch.Tensor, stopped: torch.Tensor, max_len: int, cfg):
    """All score-level shaping of ``cfg`` (``train.shaping``). Returns ``(scores [N], mask [N, R])``."""
    scores = overlong_penalty(scores, mask.sum(-1), max_len, int(cfg.get("overlong_buffer", 0) or 0),
                              float(cfg.get("overlong_factor", 1.0)))
    scores = non_stop_penalty(scores, stopped, cfg.get("non_stop_penalty"))
    return scores, truncation_mask(mask, stopped, bool(cfg.get("mask_truncated", False)))
