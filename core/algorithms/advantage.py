"""Advantage estimators and advantage whitening, keyed by ``advantage.name`` / ``advantage.whiten``.

Every estimator takes the same :class:`AdvantageInput` and the ``advantage`` config node and returns
``(advantages [N, R], returns [N, R])``; :func:`compute_advantages` is the one call site (estimator,
then whitening). The pipeline is the one OpenRLHF documents (``OpenRLHF/OpenRLHF@3c3be62``
``trainer/ppo_utils/experience_maker.py::compute_advantages_and_returns``):

1. group shaping of the scalar score (the estimator's baseline: GRPO z-score, RLOO leave-one-out, ...);
2. reward clipping (``reward_clip``, applied *after* group shaping);
3. the score placed at the last response token plus ``-beta * KL_t`` on every token (KL in reward);
4. returns ``G_t = sum_{k>=t} gamma^(k-t) r_k`` (or GAE with a critic), then optional whitening.

Data parallel: each rank holds a contiguous slice of the step's group-major rows, so a group may span
ranks (TRL 1.16 ``grpo_trainer.py`` ``process_slice``). Step 1 runs on the whole step's scores, gathered
from every rank (:func:`_on_groups`); steps 2-4 and the critic's values stay per rank, on its own rows.

Without KL-in-reward, step 3-4 reduce to broadcasting the shaped score to every response token,
which is what TRL, veRL and Open-Instruct GRPO do; the two forms agree exactly (tested).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from core.training import distributed
from core.registry import Registry


@dataclass
class AdvantageInput:
    scores: torch.Tensor  # [N] one scalar reward per completion: this rank's contiguous slice of the step's rows
    response_mask: torch.Tensor  # [N, R] 1 on tokens that count
    group_size: int  # G: completions per prompt, consecutive rows of the step (every rank's, in rank order)
    values: torch.Tensor | None = None  # [N, R] critic values V(s_t) (value-model estimators only)
    kl_reward: torch.Tensor | None = None  # [N, R] -beta * KL_t per token (KL placement "reward")
    reward_clip: tuple[float, float] | None = None  # clamp of the shaped score (OpenRLHF (-10, 10))


AdvantageFn = Callable[[AdvantageInput, object], "tuple[torch.Tensor, torch.Tensor]"]
WhitenFn = Callable[[torch.Tensor, torch.Tensor, object], torch.Tensor]
ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")
WHITENING: Registry[WhitenFn] = Registry("advantage whitening")


# ----------------------------------------------------------------------------------- shared steps
def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last 1 in each row of ``mask [N, R]`` (0 for an all-zero row)."""
    R = mask.shape[1]
    pos = torch.arange(R, device=mask.device).expand_as(mask)  # [N, R]
    return (pos * (mask > 0)).amax(-1)  # [N]


SCORE_POSITIONS = ("last", "after_last")


def value_mask(mask: torch.Tensor, cfg) -> torch.Tensor:
    """Tokens that carry rewards and critic values. ``advantage.score_position``: ``last`` (OpenRLHF:
    the response mask, score on the EOS) or ``after_last`` (Open-Instruct PPO ``padding_mask_p1``,
    allenai/open-instruct@3dd7a07d ``ppo_vllm_thread_ray_gtrl.py``: one more token after the last
    response token where it fits inside ``R``, so the score sits one step after the EOS and the critic
    is trained there too; a completion cut at ``R`` keeps its mask). Returns ``[N, R]``."""
    if cfg.score_position == "last":
        return mask
    nxt = (last_token_index(mask) + 1).clamp(max=mask.shape[1] - 1)  # [N]
    grow = (mask.sum(-1) > 0).to(mask.dtype)  # [N] an all-masked row stays empty
    return mask.scatter(1, nxt.unsqueeze(-1), torch.maximum(mask.gather(1, nxt.unsqueeze(-1)), grow.unsqueeze(-1)))


def token_rewards(inp: AdvantageInput, shaped: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """OpenRLHF ``models/utils.py::compute_reward``: clip the shaped score, put it at the last token of
    ``mask`` (default the response mask: the EOS when there is one), add the per-token KL penalty.
    Returns ``[N, R]``."""
    mask = (inp.response_mask if mask is None else mask).float()  # [N, R]
    r = shaped.float()  # [N]
    if inp.reward_clip is not None:
        r = r.clamp(float(inp.reward_clip[0]), float(inp.reward_clip[1]))  # [N]
    rewards = torch.zeros_like(mask)  # [N, R]
    rewards.scatter_(1, last_token_index(mask).unsqueeze(-1), r.unsqueeze(-1))  # [N, R]
    if inp.kl_reward is not None:
        rewards = rewards + inp.kl_reward.float()  # [N, R]
    return rewards * mask  # [N, R]


def _discount_matrix(R: int, factor: float, device) -> torch.Tensor:
    """``M[k, t] = factor^(k - t)`` for ``k >= t`` else 0, so ``x @ M`` is a discounted suffix sum."""
    k = torch.arange(R, device=device, dtype=torch.float64)
    expo = k.view(-1, 1) - k.view(1, -1)  # [R, R] k - t
    return torch.where(expo >= 0, factor ** expo.clamp(min=0), torch.zeros_like(expo))  # [R, R]


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """``G_t = sum_{k>=t} gamma^(k-t) r_k`` (OpenRLHF ``get_cumulative_returns``), vectorised."""
    rewards = rewards.float() * mask  # [N, R]
    if gamma == 1.0:
        return rewards.flip(-1).cumsum(-1).flip(-1) * mask  # [N, R]
    M = _discount_matrix(rewards.shape[1], gamma, rewards.device)  # [R, R]
    return (rewards.double() @ M).float() * mask  # [N, R]


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float):
    """Generalised advantage estimation (Schulman et al. 2016) as OpenRLHF ``get_advantages_and_returns``
    and Open-Instruct PPO compute it: values and rewards zeroed outside the mask, ``V_{R} = 0``,
    ``delta_t = r_t + gamma V_{t+1} - V_t``, ``A_t = sum_{k>=t} (gamma lam)^(k-t) delta_k``, ``R = A + V``."""
    mask = mask.float()  # [N, R]
    v = values.float() * mask  # [N, R]
    r = rewards.float() * mask  # [N, R]
    v_next = torch.cat([v[:, 1:], torch.zeros_like(v[:, :1])], 1)  # [N, R]
    delta = r + gamma * v_next - v  # [N, R]
    M = _discount_matrix(delta.shape[1], gamma * lam, delta.device)  # [R, R]
    adv = (delta.double() @ M).float()  # [N, R]
    return adv * mask, (adv + v) * mask


def _outcome(inp: AdvantageInput, shaped: torch.Tensor, gamma: float = 1.0):
    """Outcome-reward estimators: returns of the shaped score (with KL penalty); advantage = return."""
    ret = discounted_returns(token_rewards(inp, shaped), inp.response_mask, gamma)  # [N, R]
    return ret, ret


def _on_groups(inp: AdvantageInput, fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``fn`` (whole groups ``[B, G]`` -> shaped scores ``[B, G]``) on the step's groups; returns this rank's
    rows ``[N]`` of the result. Ranks hold contiguous slices of the group-major rows, so a group may span
    ranks: as TRL 1.16 does (``grpo_trainer.py``: ``rewards_per_func = gather(...)`` before the group
    mean/std, then ``advantages[process_slice]``), every rank's scores are gathered, always, not only when
    a group spans ranks: one path for every split, the same numbers, and a batch-scope statistic reads the
    same gathered scores. The cost is one all-gather of a float per completion. A world of one: no gather."""
    r = distributed.gather_rows(inp.scores.float())  # [N_step] every rank's rows in rank order = the step's order
    out = fn(r.view(-1, inp.group_size)).flatten()  # [N_step]
    return out[distributed.own_rows(r.shape[0])]  # [N] this rank's rows


def _mean(r: torch.Tensor, dim=None) -> torch.Tensor:
    """Mean over ``dim`` that skips NaN scores (``train.shaping.none_reward=exclude``), as TRL's
    ``nanmean``; the plain mean when there is none, so nothing changes bit-wise without them."""
    if not r.isnan().any():
        return r.mean() if dim is None else r.mean(dim, keepdim=True)
    return r.nanmean() if dim is None else r.nanmean(dim, keepdim=True)


def _std(r: torch.Tensor, dim=None, unbiased: bool = True) -> torch.Tensor:
    """Std that skips NaN scores (TRL ``trainer/utils.py::nanstd``: Bessel-corrected over the
    non-NaN count); the plain ``torch.std`` when there is none."""
    if not r.isnan().any():
        return r.std(unbiased=unbiased) if dim is None else r.std(dim, keepdim=True, unbiased=unbiased)
    n = (~r.isnan()).sum() if dim is None else (~r.isnan()).sum(dim, keepdim=True)
    var = _mean((r - _mean(r, dim)) ** 2, dim)
    return (var * n / (n - 1) if unbiased else var).sqrt()


def _excluded_zero(shaped: torch.Tensor) -> torch.Tensor:
    """An excluded (NaN) sample's advantage is 0 (TRL ``nan_to_num(advantages, nan=0.0)``); so is a
    group with one scored sample, whose Bessel std is undefined, as in TRL."""
    return shaped.masked_fill(shaped.isnan(), 0.0)


# ----------------------------------------------------------------------------------- estimators
_STD_SCOPES = {
    "group": lambda r, unbiased: _std(r, -1, unbiased),  # [B, 1]
    # the whole step's scores, every rank's (TRL gathers the rewards of all processes before "batch")
    "batch": lambda r, unbiased: _std(r.flatten(), None, unbiased).expand(r.shape[0], 1),  # [B, 1]
    "none": None,
}


@ADVANTAGES.register("grpo", min_group_size=2, excludes_nan=True, choices={"std": tuple(_STD_SCOPES)})
def grpo(inp: AdvantageInput, cfg):
    """GRPO group-normalised advantage (Shao et al. 2024, DeepSeekMath eq. 3):
    ``A_i = (r_i - mean_group(r)) / (std + eps)``, broadcast to every response token.

    ``cfg.std``: ``group`` (TRL ``scale_rewards="group"``, veRL, Open-Instruct), ``batch`` (std over the
    whole batch, group mean kept: TRL ``scale_rewards="batch"``) or ``none`` (TRL ``"none"``).
    ``cfg.unbiased_std``: Bessel-corrected ``torch.std`` (TRL, veRL, Open-Instruct gtrl) or population
    std (Open-Instruct ``grpo_fast`` numpy). ``cfg.eps``: 1e-4 TRL (``huggingface/trl@f2cd577``
    ``grpo_trainer.py``), 1e-6 veRL (``core_algos.compute_grpo_outcome_advantage``), 1e-8 Open-Instruct,
    1e-9 OpenRLHF ``group_norm``.
    """
    scope = _STD_SCOPES[cfg.std]

    def normalised(r: torch.Tensor) -> torch.Tensor:  # [B, G] -> [B, G]
        centred = r - _mean(r, -1)  # [B, G]
        return centred if scope is None else centred / (scope(r, cfg.unbiased_std) + cfg.eps)

    return _outcome(inp, _excluded_zero(_on_groups(inp, normalised)))


@ADVANTAGES.register("dr_grpo", min_group_size=2, excludes_nan=True)
def dr_grpo(inp: AdvantageInput, cfg):
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): ``A_i = r_i - mean_group(r)``,
    no std division (OpenRLHF ``dr_grpo``, TRL ``scale_rewards="none"``, veRL
    ``norm_adv_by_std_in_grpo=False``). Pair with aggregation ``token_sum_norm`` for the paper's loss."""
    return _outcome(inp, _excluded_zero(_on_groups(inp, lambda r: r - _mean(r, -1))))  # [B, G] -> [B, G]


@ADVANTAGES.register("rloo", min_group_size=2)
def rloo(inp: AdvantageInput, cfg):
    """RLOO (Ahmadian et al. 2024): baseline is the mean of the *other* G-1 samples of the group,
    ``A_i = r_i - (sum_g r - r_i) / (G - 1)`` (OpenRLHF ``rloo``)."""
    G = inp.group_size
    return _outcome(inp, _on_groups(inp, lambda r: r - (r.sum(-1, keepdim=True) - r) / (G - 1)))  # [B, G]


@ADVANTAGES.register("reinforce_pp", min_group_size=1)
def reinforce_pp(inp: AdvantageInput, cfg):
    """REINFORCE++ (Hu 2025, arXiv 2501.03262; OpenRLHF ``reinforce``): no baseline, advantage is the
    discounted return ``G_t`` of the per-token rewards (score at the end, ``-beta KL_t`` on every
    token); OpenRLHF then whitens globally (``advantage.whiten: global``)."""
    return _outcome(inp, inp.scores.float(), cfg.gamma)


@ADVANTAGES.register("reinforce_pp_baseline", min_group_size=2)
def reinforce_pp_baseline(inp: AdvantageInput, cfg):
    """REINFORCE++-baseline (OpenRLHF ``reinforce_baseline``): score minus the group mean, then the
    (gamma = 1) return with the KL penalty, then global whitening."""
    return _outcome(inp, _on_groups(inp, lambda r: r - r.mean(-1, keepdim=True)))  # [B, G] -> [B, G]


@ADVANTAGES.register("gae", min_group_size=1, needs_values=True, choices={"score_position": SCORE_POSITIONS})
def gae_estimator(inp: AdvantageInput, cfg):
    """PPO with a critic: GAE over per-token rewards (score at the last token of :func:`value_mask`,
    ``-beta KL_t`` per response token) with ``cfg.gamma`` / ``cfg.lam`` (Open-Instruct PPO gamma 1,
    lambda 0.95; OpenRLHF 1, 1.0). Advantages and returns live on the value mask; the caller whitens
    and masks the advantages with the response mask (Open-Instruct ``masked_whiten(adv, ~padding_mask)``)."""
    if inp.values is None:
        raise ValueError("advantage.name=gae needs critic values (set advantage.critic)")
    vmask = value_mask(inp.response_mask, cfg)  # [N, R]
    rewards = token_rewards(inp, inp.scores, vmask)  # [N, R]
    return gae(rewards, inp.values, vmask, cfg.gamma, cfg.lam)


# ----------------------------------------------------------------------------------- whitening
def _reduce(*xs: torch.Tensor) -> list[torch.Tensor]:
    """Sum over data-parallel ranks (a no-op in a world of one)."""
    return [distributed.all_sum(x) for x in xs]


@WHITENING.register("none")
def whiten_none(adv: torch.Tensor, mask: torch.Tensor, cfg) -> torch.Tensor:
    return adv


@WHITENING.register("local")
def whiten_local(adv: torch.Tensor, mask: torch.Tensor, cfg) -> torch.Tensor:
    """Open-Instruct ``model_utils.masked_whiten`` (allenai/open-instruct@3dd7a07d): masked mean and
    Bessel-corrected masked variance over *this learner's* batch, ``(A - mu) * rsqrt(var + 1e-8)``."""
    m = mask.float()  # [N, R]
    n = m.sum()
    mean = (adv * m).sum() / n
    var = (((adv - mean) ** 2) * m).sum() / n * (n / (n - 1).clamp(min=1))
    return (adv - mean) * torch.rsqrt(var + 1e-8) * m  # [N, R]


@WHITENING.register("global")
def whiten_global(adv: torch.Tensor, mask: torch.Tensor, cfg) -> torch.Tensor:
    """OpenRLHF (``experience_maker.py``, v0.9+): token-weighted mean/var over the whole rollout batch
    of all ranks, population variance clamped at 1e-8; ``advantage.whiten_std: false`` keeps only
    the centring (``--no_advantage_std_norm``)."""
    m = mask.float()  # [N, R]
    s, n = _reduce((adv * m).sum(), m.sum())
    mean = s / n
    out = adv - mean  # [N, R]
    if cfg.whiten_std:
        (sq,) = _reduce((((adv - mean) ** 2) * m).sum())
        out = out * (sq / n).clamp(min=1e-8).rsqrt()
    return out * m  # [N, R]


def compute_advantages(inp: AdvantageInput, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """The one call site: the estimator named ``cfg.name``, then the whitening named ``cfg.whiten``."""
    adv, ret = ADVANTAGES.get(cfg.name)(inp, cfg)  # [N, R], [N, R]
    adv = WHITENING.get(cfg.whiten)(adv, inp.response_mask, cfg)  # [N, R]
    return adv * inp.response_mask, ret
