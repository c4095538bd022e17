"""Reward shaping, KL controllers, the critic and chunked forwards."""
from __future__ import annotations

import pytest
import torch

from core.algorithms import shaping
from core.algorithms.kl_control import KL_CONTROLLERS, KLController
from core.models.loading import build_tiny_model_dir, load_causal_lm
from core.models.logprobs import chunked_logprobs, response_logprobs
from core.models.critic import chunked_values, load_critic, token_values, value_loss
from core.config import schema

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 512, "tie_word_embeddings": True}


def test_non_stop_penalty_replaces_the_score():
    out = shaping.non_stop_penalty(torch.tensor([10.0, 10.0, 0.0]), torch.tensor([True, False, False]), -10)
    torch.testing.assert_close(out, torch.tensor([10.0, -10.0, -10.0]))
    assert torch.equal(shaping.non_stop_penalty(torch.ones(2), torch.tensor([False, True]), None), torch.ones(2))


def test_soft_overlong_penalty_hand_computed():
    # max 20, buffer 4: penalty starts after 16 tokens, -(len - 16)/4 * factor, capped at -factor
    out = shaping.overlong_penalty(torch.zeros(4), torch.tensor([10, 17, 18, 20]), 20, 4, 0.5)
    torch.testing.assert_close(out, torch.tensor([0.0, -0.125, -0.25, -0.5]))


def test_mask_truncated_and_shape_order():
    mask = torch.ones(2, 3, dtype=torch.long)
    stopped = torch.tensor([True, False])
    cfg = schema.node(schema.ShapingConfig, {"none_reward": "mask", "non_stop_penalty": -1.0, "mask_truncated": True,
                                              "overlong_buffer": 0, "overlong_factor": 1.0, "reward_clip": None})
    scores, m = shaping.shape(torch.tensor([1.0, 1.0]), torch.tensor([True, True]), mask, stopped, 3, cfg)
    torch.testing.assert_close(scores, torch.tensor([1.0, -1.0]))
    assert m.tolist() == [[1, 1, 1], [0, 0, 0]]


def test_kl_controllers():
    assert KL_CONTROLLERS.names() == ["adaptive", "fixed"]
    fixed = KLController(schema.node(schema.KLConfig, {"coef": 0.1, "controller": "fixed"}))
    assert fixed.update(5.0, 100) == 0.1
    ada = KLController(schema.node(schema.KLConfig, coef=0.1, controller="adaptive", target=1.0, horizon=1000))
    # KL 3x target -> error clipped to +0.2; beta * (1 + 0.2 * 100 / 1000)
    assert ada.update(3.0, 100) == pytest.approx(0.1 * 1.02)
    assert ada.update(0.95, 100) == pytest.approx(0.1 * 1.02 * (1 - 0.05 * 0.1))


def test_value_loss_hand_computed():
    v, old, ret = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0]), torch.tensor([0.0, 1.0])
    # sample 0: unclipped (1-0)^2 = 1, clipped V = 0.2 -> 0.04; max = 1 -> 0.5
    # sample 1: unclipped 1, clipped V = 0 -> 1 -> 0.5
    torch.testing.assert_close(value_loss(v, old, ret, 0.2), torch.tensor([0.5, 0.5]))
    v2 = torch.tensor([-1.0, 0.5])
    # sample 0: (-1-0)^2 = 1 vs clipped -0.2 -> 0.04: 0.5; sample 1: 0.25 vs clipped 0.2 -> 0.64: 0.32
    torch.testing.assert_close(value_loss(v2, old, ret, 0.2), torch.tensor([0.5, 0.32]))
    torch.testing.assert_close(value_loss(v2, old, ret, None), torch.tensor([0.5, 0.125]))


@pytest.fixture(scope="module")
def tiny_dir():
    return str(build_tiny_model_dir("qwen2", TINY, 0))


def _batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 60, (5, 11), generator=g)
    am = torch.ones_like(ids)
    am[0, :3] = 0  # left padding
    am[1, 9:] = 0  # right padding after EOS
    return ids, am


def test_chunked_logprobs_equal_one_forward(tiny_dir):
    model = load_causal_lm(tiny_dir, schema.node(schema.ModelConfig, dtype="float32"))
    ids, am = _batch()
    full, _ = response_logprobs(model.eval(), ids, am, 4, 0.7)
    for mb in (1, 2, 5):
        torch.testing.assert_close(chunked_logprobs(model, ids, am, 4, 0.7, mb), full.detach(), atol=1e-5, rtol=1e-5)


def test_critic_from_policy_and_from_a_reward_model_folder(tiny_dir, tmp_path):
    fp32 = schema.node(schema.ModelConfig, dtype="float32")
    critic = load_critic(tiny_dir, schema.node(schema.CriticConfig, head_seed=0), fp32)
    ids, am = _batch()
    v = token_values(critic.eval(), ids, am, 4)
    assert v.shape == (5, 7)
    torch.testing.assert_close(chunked_values(critic, ids, am, 4, 2), v.detach(), atol=1e-5, rtol=1e-5)
    critic.score.weight.data.fill_(0.01)
    critic.save_pretrained(tmp_path)  # stands in for a reward-model folder
    again = load_critic(tiny_dir, schema.node(schema.CriticConfig, init_from=str(tmp_path)), fp32)
    assert torch.all(again.score.weight == 0.01)


def test_none_reward_policies_hand_computed():
    scores, valid = torch.tensor([1.0, 5.0, 0.0]), torch.tensor([True, False, True])
    mask = torch.ones(3, 2)
    s, m = shaping.none_rewards(scores, valid, mask, "zero")  # TRL 0.18: 0 everywhere
    assert s.tolist() == [1.0, 0.0, 0.0] and torch.equal(m, mask)
    s, m = shaping.none_rewards(scores, valid, mask, "mask")  # ours: 0 in stats, out of the loss
    assert s.tolist() == [1.0, 0.0, 0.0] and m.tolist() == [[1, 1], [0, 0], [1, 1]]
    s, m = shaping.none_rewards(scores, valid, mask, "exclude")  # TRL 1.x: NaN for the estimator
    assert s[0] == 1.0 and s[1].isnan() and s[2] == 0.0 and torch.equal(m, mask)
    with pytest.raises(ValueError, match="train.shaping.none_reward='nope'; choose one of"):
        shaping.none_rewards(scores, valid, mask, "nope")


def test_penalties_edit_scored_samples_only():
    mask = torch.ones(3, 4)
    stopped = torch.tensor([False, False, True])
    valid = torch.tensor([True, False, False])
    for policy, unscored in (("zero", 0.0), ("exclude", float("nan"))):
        cfg = schema.node(schema.ShapingConfig, {"none_reward": policy, "non_stop_penalty": -10.0,
                                                  "mask_truncated": False, "overlong_buffer": 2, "overlong_factor": 1.0,
                                                  "reward_clip": None})
        s, _ = shaping.shape(torch.tensor([1.0, 1.0, 1.0]), valid, mask, stopped, 4, cfg)
        assert s[0] == -10.0  # scored and did not stop: replaced by the penalty
        torch.testing.assert_close(s[1:], torch.full((2,), unscored), equal_nan=True)


