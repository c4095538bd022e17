"""Reward shaping applied to the verifier's scalar scores before any advantage estimator.

Order (OpenRLHF ``OpenRLHF/OpenRLHF@3c3be62`` ``experience_maker.py``): what a ``None`` reward
becomes, then these score-level edits (overlong penalty, non-stop penalty, truncation mask), then the
estimator's group shaping, then the reward clip, the placement at the last token and the per-token
KL penalty (``core/algorithms/advantage.py``). Keys live in ``train.shaping`` (conf/train/grpo.yaml).
"""
from __future__ import annotations

import torch


# What a ``None`` reward (the verifier could not score the sample) becomes, named by
# ``train.shaping.none_reward``: the score used in group statistics and whether the sample stays in the loss.
NONE_REWARDS = (
    # Ours: score 0 in the group statistics, the sample's tokens dropped from the loss and its counts.
    "mask",
    # TRL 0.18 (huggingface/trl@v0.18.0 ``grpo_trainer.py``): None -> NaN, then ``nansum`` over the
    # reward functions gives 0, which enters the group mean/std and the loss like any other score.
    "zero",
    # TRL >= 1.x (``_compute_advantages``: unscorable rows NaN, ``nanmean``/``nanstd`` baselines,
    # advantage forced to 0): left out of its group's statistics, kept in the loss with advantage 0
    # (its tokens still carry the KL term and count in the token denominators).
    "exclude",
)


def none_rewards(scores: torch.Tensor, valid: torch.Tensor, mask: torch.Tensor, policy: str):
    """Apply ``policy`` (one of :data:`NONE_REWARDS`) to the rows where ``valid [N]`` is False.
    Returns ``(scores [N], mask [N, R])``; ``exclude`` marks the score NaN for the estimator, whose
    group statistics then skip it (estimators registered with ``excludes_nan=True``)."""
    if policy not in NONE_REWARDS:
        raise ValueError(f"train.shaping.none_reward={policy!r}; choose one of {sorted(NONE_REWARDS)}")
    if policy == "exclude":
        return scores.float().masked_fill(~valid, float("nan")), mask
    scores = scores.float().masked_fill(~valid, 0.0)  # [N]
    return scores, (mask * valid.unsqueeze(-1).to(mask.dtype) if policy == "mask" else mask)  # [N, R]


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


def shape(scores: torch.Tensor, valid: torch.Tensor, mask: torch.Tensor, stopped: torch.Tensor, max_len: int,
          cfg):
    """All score-level shaping of ``cfg`` (``train.shaping``) of the verifier's ``scores [N]`` (any
    value where ``valid [N]`` is False: the verifier said None). Returns ``(scores [N], mask [N, R])``.
    The penalties edit scored samples only: an unscored one keeps what ``none_reward`` made of it."""
    unscored, mask = none_rewards(scores, valid, mask, cfg.none_reward)  # [N], [N, R]
    shaped = overlong_penalty(scores.float(), mask.sum(-1), max_len, cfg.overlong_buffer,
                              cfg.overlong_factor)
    shaped = non_stop_penalty(shaped, stopped, cfg.non_stop_penalty)
    scores = torch.where(valid, shaped, unscored)  # [N]
    return scores, truncation_mask(mask, stopped, cfg.mask_truncated)
