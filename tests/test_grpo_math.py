"""Hand-computed checks of the GRPO slice: advantage, clipped loss, k3 KL, gradient direction."""
from __future__ import annotations

import math

import pytest
import torch

from core.algorithms.advantage import ADVANTAGES, AdvantageInput
from core.algorithms.loss import AggContext, LossInput, compute_policy_loss
from core.config import schema

ADV_CFG = schema.node(schema.GrpoAdvantageConfig, {"name": "grpo", "std": "group", "unbiased_std": True, "eps": 1e-4})
LOSS_CFG = schema.node(schema.LossConfig, {"name": "ppo_clip", "clip_low": 0.2, "clip_high": 0.2, "entropy_coef": 0.0,
                             "aggregation": "token_mean", "log_ratio_clamp": None})
KL_CFG = schema.node(schema.KLConfig, {"estimator": "k3", "coef": 0.1, "placement": "loss", "clamp": None})


def test_grpo_advantage_hand_computed():
    scores = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])  # two groups of G = 4
    mask = torch.ones(8, 3)
    mask[0, 2] = 0
    adv, ret = ADVANTAGES.get("grpo")(AdvantageInput(scores, mask, 4), ADV_CFG)
    # group 1: mean 0.25, unbiased std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5
    # group 2: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.57735
    s2 = math.sqrt(1 / 3)
    want = [0.75 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001,
            0.5 / (s2 + 1e-4), 0.5 / (s2 + 1e-4), -0.5 / (s2 + 1e-4), -0.5 / (s2 + 1e-4)]
    torch.testing.assert_close(adv[:, 0], torch.tensor(want))
    assert adv[0, 2] == 0  # masked token carries no advantage
    torch.testing.assert_close(adv[:, 1], adv[:, 0])  # broadcast to every token
    assert torch.equal(adv, ret)


def test_grpo_identical_rewards_give_zero_advantage():
    adv, _ = ADVANTAGES.get("grpo")(AdvantageInput(torch.ones(6), torch.ones(6, 2), 3), ADV_CFG)
    assert torch.equal(adv, torch.zeros(6, 2))


def _inp(logp, old, adv, mask=None, ref=None):
    mask = torch.ones_like(logp) if mask is None else mask
    return LossInput(logp, old, adv, mask, ref, None)


def test_clipped_loss_hand_computed():
    logp = torch.log(torch.tensor([[1.0, 1.5, 0.5, 1.1]]))  # ratios against old = 0
    adv = torch.tensor([[2.0, 1.0, -1.0, -3.0]])
    loss, m = compute_policy_loss(_inp(logp, torch.zeros(1, 4), adv), LOSS_CFG, KL_CFG, AggContext())
    # -min(r A, clip(r) A): [-2, -1.2 (clipped at 1.2), 0.8 (clipped at 0.8), 3.3]
    assert loss.item() == pytest.approx((-2.0 - 1.2 + 0.8 + 3.3) / 4, abs=1e-6)
    assert m["clip_frac"] == pytest.approx(0.5)


def test_token_mean_divides_by_accumulation_and_skips_masked_tokens():
    logp = torch.zeros(2, 3)
    adv = torch.tensor([[1.0, 1.0, 1.0], [4.0, 4.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    loss, m = compute_policy_loss(_inp(logp, logp, adv, mask), LOSS_CFG, KL_CFG, AggContext(num_micro_batches=2))
    assert loss.item() == pytest.approx(-(3 * 1.0 + 2 * 4.0) / 5 / 2)
    assert m["clip_frac"] == 0.0  # ratio 1: nothing clipped


def test_k3_kl_hand_computed_and_added_to_loss():
    logp, ref = torch.zeros(1, 1), torch.log(torch.tensor([[0.5]]))
    loss, m = compute_policy_loss(_inp(logp, logp, torch.zeros(1, 1), ref=ref), LOSS_CFG, KL_CFG, AggContext())
    k3 = 0.5 - math.log(0.5) - 1  # exp(d) - d - 1 with d = log 0.5
    assert m["kl"] == pytest.approx(k3) and loss.item() == pytest.approx(0.1 * k3)


def test_gradient_raises_logprob_of_positive_advantage_tokens():
    logits = torch.zeros(2, 5, requires_grad=True)  # two tokens, vocab 5
    tokens = torch.tensor([1, 3])
    logp = torch.log_softmax(logits, -1).gather(-1, tokens[:, None]).T  # [1, 2]
    adv = torch.tensor([[1.0, -1.0]])
    loss, _ = compute_policy_loss(_inp(logp, logp.detach(), adv), LOSS_CFG, KL_CFG, AggContext())
    loss.backward()
    with torch.no_grad():
        new = torch.log_softmax(logits - 1.0 * logits.grad, -1).gather(-1, tokens[:, None]).T
    assert new[0, 0] > logp[0, 0] and new[0, 1] < logp[0, 1]
