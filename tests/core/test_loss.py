"""Policy losses, IS corrections, KL estimators, aggregations: hand-computed, loops, properties,
and gradient accumulation equal to one big batch for the modes that promise it."""
from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from core.algorithms.loss import (AGGREGATIONS, IS_CORRECTIONS, KL_ESTIMATORS, POLICY_LOSSES, AggContext, LossInput,
                       compute_policy_loss, kl_penalty)
from core.config import schema
from core.config.pipeline import prepare
from core.config.validate import ConfigError

LOSS = schema.node(schema.LossConfig, {"name": "ppo_clip", "clip_low": 0.2, "clip_high": 0.28, "dual_clip": None,
                         "entropy_coef": 0.0, "aggregation": "token_mean", "log_ratio_clamp": None,
                         "is_correction": {"mode": "none", "low": None, "high": 3.0}})
KL = schema.node(schema.KLConfig, {"estimator": "k3", "coef": 0.1, "placement": "loss", "clamp": None,
                                   "log_ratio_clamp": None})


def _inp(ratio, adv, mask=None, **kw):
    ratio, adv = torch.tensor(ratio), torch.tensor(adv)
    old = torch.zeros_like(ratio)
    return LossInput(torch.log(ratio), old, adv, torch.ones_like(ratio) if mask is None else torch.tensor(mask), **kw)


def test_registered_names_are_counted():
    assert POLICY_LOSSES.names() == ["gspo", "ppo_clip"]
    assert KL_ESTIMATORS.names() == ["k1", "k2", "k3"]
    assert AGGREGATIONS.names() == ["seq_mean_token_mean", "seq_mean_token_mean_nonempty", "token_mean",
                                    "token_mean_global", "token_sum_norm"]
    assert IS_CORRECTIONS.names() == ["none", "sequence_geo_mask", "sequence_mask", "sequence_truncate",
                                      "token_mask", "token_truncate"]


# --------------------------------------------------------------------------- policy losses
def test_ppo_clip_asymmetric_hand_computed():
    loss, m = POLICY_LOSSES.get("ppo_clip")(_inp([[1.5, 0.5, 1.1, 0.7]], [[1.0, -1.0, 2.0, 1.0]]), LOSS)
    # 1.5, A>0: clipped at 1.28 -> -1.28; 0.5, A<0: clipped at 0.8 -> min(-0.5, -0.8) = -0.8 -> 0.8
    # 1.1 inside -> -2.2; 0.7, A>0: min(0.7, 0.8) = 0.7 -> -0.7 (unclipped branch)
    torch.testing.assert_close(loss, torch.tensor([[-1.28, 0.8, -2.2, -0.7]]))
    torch.testing.assert_close(m["clip_frac"], torch.tensor([[1.0, 1.0, 0.0, 0.0]]))


def test_dual_clip_hand_computed():
    cfg = OmegaConf.merge(LOSS, {"dual_clip": 3.0, "clip_high": 0.2})
    loss, m = POLICY_LOSSES.get("ppo_clip")(_inp([[5.0, 5.0, 2.0]], [[-1.0, 1.0, -1.0]]), cfg)
    # A<0, ratio 5: PPO gives 5, dual clip caps at 3; A>0 untouched (-1.2); ratio 2 A<0: 2 < 3 kept
    torch.testing.assert_close(loss, torch.tensor([[3.0, -1.2, 2.0]]))
    assert m["clip_frac"][0, 0] == 1.0


def test_gspo_uses_the_sequence_ratio():
    logp = torch.tensor([[math.log(2.0), 0.0, 5.0]])  # last token masked
    inp = LossInput(logp, torch.zeros(1, 3), torch.ones(1, 3), torch.tensor([[1, 1, 0]]))
    cfg = OmegaConf.merge(LOSS, {"clip_low": 0.5, "clip_high": 1.0})
    loss, m = POLICY_LOSSES.get("gspo")(inp, cfg)
    torch.testing.assert_close(m["ratio"][0, :2], torch.full((2,), 2 ** 0.5))  # exp(mean(log 2, 0))
    torch.testing.assert_close(loss[0, :2], torch.full((2,), -(2 ** 0.5)))


@pytest.mark.parametrize("name", ["ppo_clip", "gspo"])
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_clip_fraction_is_zero_and_loss_is_minus_advantage_when_ratio_is_one(name, seed):
    g = torch.Generator().manual_seed(seed)
    adv = torch.randn(4, 6, generator=g)
    logp = torch.randn(4, 6, generator=g)
    loss, m = POLICY_LOSSES.get(name)(LossInput(logp, logp.clone(), adv, torch.ones(4, 6)), LOSS)
    assert m["clip_frac"].sum() == 0
    torch.testing.assert_close(loss, -adv)


@pytest.mark.parametrize("seed", range(3))
def test_ppo_clip_matches_a_scalar_loop(seed):
    g = torch.Generator().manual_seed(seed)
    logp, old, adv = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    cfg = OmegaConf.merge(LOSS, {"dual_clip": 2.0})
    loss, _ = POLICY_LOSSES.get("ppo_clip")(LossInput(logp, old, adv, torch.ones(3, 5)), cfg)
    for i in range(3):
        for t in range(5):
            r, a = math.exp(logp[i, t] - old[i, t]), float(adv[i, t])
            ell = -min(r * a, min(max(r, 0.8), 1.28) * a)
            if a < 0:
                ell = min(ell, -2.0 * a)
            assert abs(float(loss[i, t]) - ell) < 1e-5


# --------------------------------------------------------------------------- log-ratio clamp
# log pi - log pi_old per token, with advantages that keep each token on the unclipped branch (ratio below the
# clip range with A > 0, above it with A < 0), so the loss is -ratio * A and every change of the ratio shows.
LOG_RATIO = torch.tensor([[-30.0, -20.5, -20.0, -3.0, 0.0, 3.0, 19.5, 20.0, 20.5, 30.0, 100.0]])
ADV = torch.where(LOG_RATIO < 0, 1.0, -1.0) * torch.where(LOG_RATIO == 0, 0.0, 1.0)  # [1, 11]


def _ppo_loss_and_grad(clamp):
    logp = LOG_RATIO.clone().requires_grad_(True)
    loss, m = POLICY_LOSSES.get("ppo_clip")(LossInput(logp, torch.zeros_like(logp), ADV, torch.ones_like(logp)),
                                            OmegaConf.merge(LOSS, {"log_ratio_clamp": clamp}))
    loss.sum().backward()
    return loss.detach(), logp.grad, m["ratio"]


def test_log_ratio_clamp_changes_the_loss_exactly_beyond_the_bound():
    free, free_grad, _ = _ppo_loss_and_grad(None)
    clamped, grad, ratio = _ppo_loss_and_grad(20.0)
    beyond = LOG_RATIO.abs() > 20  # [1, 11]
    assert int(beyond.sum()) == 5  # -30, -20.5, 20.5, 30, 100
    assert torch.equal(clamped[~beyond], free[~beyond])  # the same operations on the same numbers
    assert bool((clamped[beyond] != free[beyond]).all())
    bound = torch.exp(torch.tensor(20.0))
    torch.testing.assert_close(ratio[beyond], torch.where(LOG_RATIO[beyond] > 0, bound, 1 / bound))
    torch.testing.assert_close(clamped[beyond], -ratio[beyond] * ADV[beyond])
    # Unclamped, exp(100) overflows float32: an infinite loss and a non-finite gradient (TRL's behaviour).
    assert torch.isinf(free[0, -1]) and not torch.isfinite(free_grad).all()
    assert torch.isfinite(clamped).all() and torch.isfinite(grad).all()
    assert bool((grad[beyond] == 0).all()) and bool((grad[~beyond & (ADV != 0)] != 0).all())


def test_gspo_clamps_the_sequence_mean_log_ratio():
    logp = torch.tensor([[30.0, 20.0, 99.0], [10.0, 20.0, 0.0]])  # row means 25 (two tokens) and 10
    inp = LossInput(logp, torch.zeros(2, 3), -torch.ones(2, 3), torch.tensor([[1, 1, 0], [1, 1, 1]]))
    _, m = POLICY_LOSSES.get("gspo")(inp, OmegaConf.merge(LOSS, {"log_ratio_clamp": 20.0}))
    torch.testing.assert_close(m["ratio"][:, 0], torch.exp(torch.tensor([20.0, 10.0])))


# --------------------------------------------------------------------------- IS corrections
def test_is_corrections_hand_computed():
    old = torch.log(torch.tensor([[1.0, 1.0, 1.0]]))
    roll = torch.log(torch.tensor([[0.5, 2.0, 0.1]]))  # w = old / rollout = 2, 0.5, 10
    inp = LossInput(old.clone(), old, torch.ones(1, 3), torch.ones(1, 3), rollout_logprobs=roll)
    c = schema.node(schema.ISCorrectionConfig, low=0.6, high=3.0)
    torch.testing.assert_close(IS_CORRECTIONS.get("token_truncate")(inp, c), torch.tensor([[2.0, 0.6, 3.0]]))
    torch.testing.assert_close(IS_CORRECTIONS.get("token_mask")(inp, c), torch.tensor([[2.0, 0.0, 0.0]]))
    # sequence weight = 2 * 0.5 * 10 = 10 -> truncated to 3, masked to 0
    torch.testing.assert_close(IS_CORRECTIONS.get("sequence_truncate")(inp, c), torch.full((1, 3), 3.0))
    torch.testing.assert_close(IS_CORRECTIONS.get("sequence_mask")(inp, c), torch.zeros(1, 3))
    # geometric mean 10^(1/3) = 2.154 inside [0.6, 3]: token weights kept
    torch.testing.assert_close(IS_CORRECTIONS.get("sequence_geo_mask")(inp, c), torch.tensor([[2.0, 0.5, 10.0]]))
    assert IS_CORRECTIONS.get("none")(inp, c) is None


def test_is_weight_multiplies_the_policy_term_before_kl():
    inp = _inp([[1.0, 1.0]], [[1.0, 1.0]], ref_logprobs=torch.zeros(1, 2),
               rollout_logprobs=torch.log(torch.tensor([[0.5, 0.5]])))
    cfg = OmegaConf.merge(LOSS, {"is_correction": {"mode": "token_truncate", "low": None, "high": 3.0}})
    loss, m = compute_policy_loss(inp, cfg, KL, AggContext())
    torch.testing.assert_close(loss, torch.tensor(-2.0))  # w = 2 on -A = -1; KL = 0 at ratio 1 vs ref
    assert m["is_weight"] == pytest.approx(2.0)


# --------------------------------------------------------------------------- KL
def test_kl_estimators_hand_computed():
    logp, ref = torch.tensor([0.0, -1.0]), torch.tensor([-1.0, 0.0])
    torch.testing.assert_close(KL_ESTIMATORS.get("k1")(logp, ref), torch.tensor([1.0, -1.0]))
    torch.testing.assert_close(KL_ESTIMATORS.get("k2")(logp, ref), torch.tensor([0.5, 0.5]))
    torch.testing.assert_close(KL_ESTIMATORS.get("k3")(logp, ref),
                               torch.tensor([math.exp(-1) + 1 - 1, math.exp(1) - 1 - 1]))


@settings(max_examples=50, deadline=None)
@given(st.floats(-30, 30), st.floats(-30, 30))
def test_k2_k3_are_non_negative_and_zero_at_equality(a, b):
    logp, ref = torch.tensor([a], dtype=torch.float64), torch.tensor([b], dtype=torch.float64)
    for name in ("k2", "k3"):
        assert KL_ESTIMATORS.get(name)(logp, ref).item() >= 0
        assert KL_ESTIMATORS.get(name)(logp, logp).item() == 0


def test_k1_k3_are_unbiased_estimates_of_the_true_kl():
    p, q = torch.tensor([0.7, 0.2, 0.1]), torch.tensor([0.4, 0.4, 0.2])
    true = (p * (p / q).log()).sum()
    logp, ref = p.log(), q.log()
    for name in ("k1", "k3"):  # E_p[k] = KL(p || q)
        torch.testing.assert_close((p * KL_ESTIMATORS.get(name)(logp, ref)).sum(), true)


def test_kl_clamps():
    logp, ref = torch.tensor([50.0]), torch.tensor([0.0])
    k3 = OmegaConf.merge(KL, {"estimator": "k3"})
    assert kl_penalty(-logp, ref, OmegaConf.merge(k3, {"clamp": 10})).item() == 10.0  # OpenRLHF result clamp
    lrc = kl_penalty(-logp, ref, OmegaConf.merge(k3, {"log_ratio_clamp": 20}))  # veRL clamps d first
    torch.testing.assert_close(lrc, torch.tensor([math.exp(20) - 20 - 1]))
    assert kl_penalty(logp, ref, OmegaConf.merge(KL, {"estimator": "k1"})).item() == 50.0  # TRL: none


def test_kl_in_loss_only_when_placed_there():
    inp = _inp([[1.0]], [[0.0]], ref_logprobs=torch.tensor([[-1.0]]))
    in_loss, m = compute_policy_loss(inp, LOSS, KL, AggContext())
    in_reward, m2 = compute_policy_loss(inp, LOSS, OmegaConf.merge(KL, {"placement": "reward"}), AggContext())
    k3 = math.exp(-1) + 1 - 1
    assert in_loss.item() == pytest.approx(0.1 * k3) and in_reward.item() == 0.0
    assert m["kl"] == pytest.approx(k3) and m2["kl"] == pytest.approx(k3)
    half, _ = compute_policy_loss(inp, LOSS, KL, AggContext(), kl_coef=0.05)  # controller's beta wins
    assert half.item() == pytest.approx(0.05 * k3)


def test_entropy_bonus():
    inp = _inp([[1.0, 1.0]], [[0.0, 0.0]], entropy=torch.tensor([[2.0, 4.0]]))
    loss, m = compute_policy_loss(inp, OmegaConf.merge(LOSS, {"entropy_coef": 0.01}), KL, AggContext())
    assert loss.item() == pytest.approx(-0.03) and m["entropy"] == 3.0


# --------------------------------------------------------------------------- aggregations
X = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
M = torch.tensor([[1, 1, 1], [1, 0, 0]])


def test_aggregations_hand_computed():
    ctx = AggContext(num_micro_batches=2, step_tokens=8, max_tokens=5)
    assert AGGREGATIONS.get("token_mean")(X, M, ctx).item() == pytest.approx(10 / 4 / 2)
    assert AGGREGATIONS.get("token_mean_global")(X, M, ctx).item() == pytest.approx(10 / 8)
    assert AGGREGATIONS.get("seq_mean_token_mean")(X, M, ctx).item() == pytest.approx((2 + 4) / 2 / 2)
    assert AGGREGATIONS.get("token_sum_norm")(X, M, ctx).item() == pytest.approx(10 / (2 * 5) / 2)
    empty = torch.tensor([[1, 1, 1], [0, 0, 0]])  # the second row has no loss tokens
    assert AGGREGATIONS.get("seq_mean_token_mean")(X, empty, ctx).item() == pytest.approx((2 + 0) / 2 / 2)
    assert AGGREGATIONS.get("seq_mean_token_mean_nonempty")(X, empty, ctx).item() == pytest.approx(2 / 1 / 2)
    assert AGGREGATIONS.get("seq_mean_token_mean_nonempty")(X, M, ctx).item() == pytest.approx((2 + 4) / 2 / 2)


def test_gspo_denominators_differ_by_rows_over_non_empty_rows():
    """TRL (loss_type grpo) counts a fully masked row, OpenRLHF and veRL leave it out: 4 rows, 1 empty."""
    g = torch.Generator().manual_seed(0)
    logp, old, adv = (torch.randn(4, 5, generator=g) * 0.01 for _ in range(3))
    mask = torch.ones(4, 5)
    mask[2] = 0  # e.g. a truncated completion under mask_truncated
    inp = LossInput(logp, old, adv, mask)
    ctx = AggContext(num_micro_batches=1)
    gspo = schema.node(schema.LossConfig, name="gspo", clip_low=3e-4, clip_high=4e-4, log_ratio_clamp=None)
    counted, _ = compute_policy_loss(inp, OmegaConf.merge(gspo, {"aggregation": "seq_mean_token_mean"}), KL, ctx)
    skipped, _ = compute_policy_loss(inp, OmegaConf.merge(gspo, {"aggregation": "seq_mean_token_mean_nonempty"}),
                                     KL, ctx)
    assert counted.item() != 0
    assert skipped.item() == pytest.approx(counted.item() * 4 / 3, rel=1e-6)
    mask[2] = 1  # no empty row: the two agree
    full = [compute_policy_loss(inp, OmegaConf.merge(gspo, {"aggregation": a}), KL, ctx)[0].item()
            for a in ("seq_mean_token_mean", "seq_mean_token_mean_nonempty")]
    assert full[0] == pytest.approx(full[1], rel=1e-6)


@pytest.mark.parametrize("override,expected", [
    ("loss.log_ratio_clamp=0", "loss.log_ratio_clamp=0.0: expected a number > 0 or null"),
    ("loss.log_ratio_clamp=-20", "loss.log_ratio_clamp=-20.0: expected a number > 0 or null"),
    ("loss.aggregation=seq_mean_nonempty", "loss.aggregation='seq_mean_nonempty': expected one of"),
])
def test_bad_loss_choices_are_refused_by_name(compose_cfg, override, expected):
    for group in ("loss=ppo_clip", "loss=gspo"):
        with pytest.raises(ConfigError, match=re.escape(expected)):
            prepare(compose_cfg(group, override))


def test_loss_options_name_both_choices(compose_cfg):
    for group in ("ppo_clip", "gspo"):
        cfg = prepare(compose_cfg(f"loss={group}", "loss.log_ratio_clamp=20.0",
                                  "loss.aggregation=seq_mean_token_mean_nonempty")).config
        assert cfg.loss.log_ratio_clamp == 20.0 and cfg.loss.aggregation == "seq_mean_token_mean_nonempty"
    assert compose_cfg("loss=gspo").loss.log_ratio_clamp is None  # null: TRL, the schema default
    assert compose_cfg("loss=gspo").loss.aggregation == "seq_mean_token_mean"


def _grad(name, x, mask, splits, max_tokens=7):
    p = x.clone().requires_grad_(True)
    ctx = AggContext(num_micro_batches=len(splits), step_tokens=float(mask.sum()), max_tokens=max_tokens)
    for sl in splits:
        AGGREGATIONS.get(name)(p[sl] ** 2, mask[sl], ctx).backward()
    return p.grad


@pytest.mark.parametrize("name", AGGREGATIONS.names())
@pytest.mark.parametrize("seed", range(3))
def test_gradient_accumulation_matches_one_big_batch(name, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 6, generator=g)
    lengths = torch.tensor([1, 6, 0, 6, 3, 1, 6, 6])  # unequal token counts per micro-batch, one empty row
    mask = (torch.arange(6) < lengths.unsqueeze(1)).float()
    big = _grad(name, x, mask, [slice(0, 8)])
    accum = _grad(name, x, mask, [slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 8)])
    if AGGREGATIONS.meta(name)["accumulation_exact"]:
        torch.testing.assert_close(accum, big)
    else:  # token_mean weights micro-batches equally, not tokens; _nonempty rows of micro-batches with fewer
        # non-empty rows weigh more: documented, not promised
        assert not torch.allclose(accum, big)


def test_every_aggregation_declares_whether_accumulation_is_exact():
    assert all("accumulation_exact" in AGGREGATIONS.meta(n) for n in AGGREGATIONS.names())


def test_is_correction_refuses_a_rollout_without_sampler_logprobs():
    """A rollout generated without log-probs (``Sampling.logprobs`` false) has None in their place: an importance
    correction asked to weigh it raises, where a weight of 1 would pass for a correction that never ran."""
    inp = _inp([[1.0, 1.0]], [[1.0, 1.0]])  # rollout_logprobs None
    cfg = OmegaConf.merge(LOSS, {"is_correction": {"mode": "token_truncate", "low": None, "high": 3.0}})
    with pytest.raises(ValueError, match="needs the sampler's log-probs"):
        compute_policy_loss(inp, cfg, KL, AggContext())
    assert compute_policy_loss(inp, LOSS, KL, AggContext())[0].isfinite()  # mode none: nothing reads them
