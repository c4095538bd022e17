"""Advantage estimators and whitening: hand-computed examples, loop references, properties."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.algorithms.advantage import (ADVANTAGES, WHITENING, AdvantageInput, compute_advantages, discounted_returns,
                            token_rewards, value_mask)
from core.config import schema

CFGS = {
    "grpo": {"name": "grpo", "std": "group", "unbiased_std": True, "eps": 1e-4},
    "dr_grpo": {"name": "dr_grpo"},
    "rloo": {"name": "rloo"},
    "reinforce_pp": {"name": "reinforce_pp", "gamma": 1.0},
    "reinforce_pp_baseline": {"name": "reinforce_pp_baseline"},
    "gae": {"name": "gae", "gamma": 1.0, "lam": 0.95},
}


SCHEMAS = {"grpo": schema.GrpoAdvantageConfig, "reinforce_pp": schema.ReinforcePPAdvantageConfig,
           "gae": schema.GaeAdvantageConfig}


def cfg(name, **kw):
    return schema.node(SCHEMAS.get(name, schema.AdvantageConfig), {**CFGS[name], **kw})


def test_every_estimator_has_a_config_here():
    assert sorted(CFGS) == ADVANTAGES.names()
    assert len(ADVANTAGES.names()) == 6


def _two_groups():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])  # 2 prompts x G=3
    mask = torch.tensor([[1, 1, 0]] * 6)
    return AdvantageInput(scores, mask, 3)


# --------------------------------------------------------------------------- hand-computed examples
def test_grpo_hand_computed():
    adv, ret = ADVANTAGES.get("grpo")(_two_groups(), cfg("grpo"))
    # group 1: mean 1/3, unbiased std sqrt(1/3) = 0.57735; group 2: all equal -> 0
    a = (1 - 1 / 3) / (0.5773503 + 1e-4)
    b = (0 - 1 / 3) / (0.5773503 + 1e-4)
    expect = torch.tensor([[a, a, 0], [b, b, 0], [b, b, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]])
    torch.testing.assert_close(adv, expect, atol=1e-5, rtol=1e-5)
    assert torch.equal(adv, ret)


def test_grpo_std_scopes_hand_computed():
    inp = _two_groups()
    pop = ADVANTAGES.get("grpo")(inp, cfg("grpo", unbiased_std=False, eps=0.0))[0][:, 0]
    torch.testing.assert_close(pop[0], torch.tensor((2 / 3) / (2 ** 0.5 / 3)))  # population std sqrt(2)/3
    none = ADVANTAGES.get("grpo")(inp, cfg("grpo", std="none"))[0][:, 0]
    torch.testing.assert_close(none, torch.tensor([2 / 3, -1 / 3, -1 / 3, 0, 0, 0]))
    batch = ADVANTAGES.get("grpo")(inp, cfg("grpo", std="batch", eps=0.0))[0][:, 0]
    std = torch.tensor([1.0, 0, 0, 1, 1, 1]).std()  # whole batch, unbiased; group means kept
    torch.testing.assert_close(batch, torch.tensor([2 / 3, -1 / 3, -1 / 3, 0, 0, 0]) / std)


def test_excluded_scores_follow_trl_nan_semantics():
    """``none_reward=exclude``: NaN scores leave the group mean and the Bessel std (TRL ``nanmean`` /
    ``nanstd``) and get advantage 0; a group with one scored sample gets 0 everywhere, as in TRL."""
    nan = float("nan")
    scores = torch.tensor([1.0, nan, 0.0, 0.0, nan, nan, 1.0, nan, nan])  # 3 prompts x G=3
    inp = AdvantageInput(scores, torch.ones(9, 2), 3)
    adv = ADVANTAGES.get("grpo")(inp, cfg("grpo"))[0][:, 0]
    # group 1 scored {1, 0}: mean 1/2, unbiased std sqrt(1/2); group 2 {0}: std undefined -> 0; group 3 {1}
    a = 0.5 / (0.5 ** 0.5 + 1e-4)
    torch.testing.assert_close(adv, torch.tensor([a, 0, -a, 0, 0, 0, 0, 0, 0]))
    batch = ADVANTAGES.get("grpo")(inp, cfg("grpo", std="batch", eps=0.0))[0][:, 0]
    std = torch.tensor([1.0, 0.0, 0.0, 1.0]).std()  # the four scored samples of the batch
    torch.testing.assert_close(batch, torch.tensor([0.5, 0, -0.5, 0, 0, 0, 0, 0, 0]) / std)
    dr = ADVANTAGES.get("dr_grpo")(inp, cfg("dr_grpo"))[0][:, 0]
    torch.testing.assert_close(dr, torch.tensor([0.5, 0, -0.5, 0, 0, 0, 0, 0, 0]))
    assert sorted(n for n in ADVANTAGES.names() if ADVANTAGES.meta(n).get("excludes_nan")) == ["dr_grpo", "grpo"]


def test_nan_aware_stats_are_bitwise_plain_without_nans():
    r = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))
    inp = AdvantageInput(r.flatten(), torch.ones(128, 3), 8)
    adv = ADVANTAGES.get("grpo")(inp, cfg("grpo"))[0][:, 0].view(16, 8)
    assert torch.equal(adv, (r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True) + 1e-4))


def test_dr_grpo_rloo_reinforce_hand_computed():
    inp = _two_groups()
    dr = ADVANTAGES.get("dr_grpo")(inp, cfg("dr_grpo"))[0][:, 0]
    torch.testing.assert_close(dr, torch.tensor([2 / 3, -1 / 3, -1 / 3, 0, 0, 0]))
    rl = ADVANTAGES.get("rloo")(inp, cfg("rloo"))[0][:, 0]
    torch.testing.assert_close(rl, torch.tensor([1.0, -0.5, -0.5, 0, 0, 0]))  # 1 - (0+0)/2, 0 - (1+0)/2
    rb = ADVANTAGES.get("reinforce_pp_baseline")(inp, cfg("reinforce_pp_baseline"))[0][:, 0]
    torch.testing.assert_close(rb, dr)
    rp = ADVANTAGES.get("reinforce_pp")(inp, cfg("reinforce_pp"))[0]
    torch.testing.assert_close(rp, inp.scores.unsqueeze(-1) * inp.response_mask)


def test_value_mask_adds_one_token_where_it_fits():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0]])
    assert torch.equal(value_mask(mask, cfg("gae", score_position="last")), mask)
    want = [[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 0, 0]]  # cut at R: unchanged; empty stays empty
    assert value_mask(mask, cfg("gae", score_position="after_last")).tolist() == want


def test_gae_score_after_last_hand_computed():
    """Open-Instruct PPO ``padding_mask_p1``: score one token after the EOS, critic value kept there.
    R = 4, response of 2 tokens, V = [0.5, 0.2, 0.3, 9], score 1, gamma 1, lambda 0.5, no KL."""
    mask = torch.tensor([[1, 1, 0, 0]])
    values = torch.tensor([[0.5, 0.2, 0.3, 9.0]])
    inp = AdvantageInput(torch.tensor([1.0]), mask, 1, values=values)
    # rewards [0, 0, 1, 0]; deltas [-0.3, 0.1, 0.7]; A = [-0.3 + 0.5 * 0.45, 0.1 + 0.5 * 0.7, 0.7]
    adv, ret = compute_advantages(inp, cfg("gae", lam=0.5, score_position="after_last", whiten="none"))
    torch.testing.assert_close(adv, torch.tensor([[-0.075, 0.45, 0.0, 0.0]]))  # policy tokens only
    torch.testing.assert_close(ret, torch.tensor([[0.425, 0.65, 1.0, 0.0]]))  # A + V on the value mask
    # OpenRLHF placement on the EOS: deltas [-0.3, 0.8], A = [-0.3 + 0.5 * 0.8, 0.8]
    adv, ret = compute_advantages(inp, cfg("gae", lam=0.5, score_position="last", whiten="none"))
    torch.testing.assert_close(adv, torch.tensor([[0.1, 0.8, 0.0, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[0.6, 1.0, 0.0, 0.0]]))


def test_reinforce_pp_discounted_with_kl_in_reward_hand_computed():
    mask = torch.tensor([[1, 1, 1, 0]])
    kl = torch.tensor([[-0.1, -0.2, -0.3, 0.0]])  # -beta KL_t
    inp = AdvantageInput(torch.tensor([1.0]), mask, 1, kl_reward=kl)
    adv, _ = ADVANTAGES.get("reinforce_pp")(inp, cfg("reinforce_pp", gamma=0.5))
    r = [-0.1, -0.2, -0.3 + 1.0]  # score at the last valid token
    g2 = r[2]
    g1 = r[1] + 0.5 * g2
    g0 = r[0] + 0.5 * g1
    torch.testing.assert_close(adv, torch.tensor([[g0, g1, g2, 0.0]]))


def test_gae_hand_computed():
    mask = torch.tensor([[1, 1, 0]])
    values = torch.tensor([[0.5, 0.25, 9.0]])  # position 2 is padding: ignored
    inp = AdvantageInput(torch.tensor([1.0]), mask, 1, values=values)
    adv, ret = ADVANTAGES.get("gae")(inp, cfg("gae", gamma=0.9, lam=0.5))
    d1 = 1.0 + 0.9 * 0.0 - 0.25
    d0 = 0.0 + 0.9 * 0.25 - 0.5
    a1, a0 = d1, d0 + 0.9 * 0.5 * d1
    torch.testing.assert_close(adv, torch.tensor([[a0, a1, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[a0 + 0.5, a1 + 0.25, 0.0]]))


def test_reward_clip_applies_after_group_shaping():
    inp = AdvantageInput(torch.tensor([30.0, 0.0]), torch.ones(2, 2, dtype=torch.long), 2, reward_clip=(-10, 10))
    adv = ADVANTAGES.get("dr_grpo")(inp, cfg("dr_grpo"))[0][:, 0]
    torch.testing.assert_close(adv, torch.tensor([10.0, -10.0]))  # shaped +-15, then clipped


def test_gae_without_values_raises():
    with pytest.raises(ValueError, match="critic"):
        ADVANTAGES.get("gae")(_two_groups(), cfg("gae"))


# --------------------------------------------------------------------------- loop references
def _loop_gae(rewards, values, mask, gamma, lam):
    N, R = rewards.shape
    adv = torch.zeros(N, R)
    v, r = values * mask, rewards * mask
    for i in range(N):
        last = 0.0
        for t in reversed(range(R)):
            nv = v[i, t + 1] if t + 1 < R else 0.0
            delta = r[i, t] + gamma * nv - v[i, t]
            last = delta + gamma * lam * last
            adv[i, t] = last
    return adv * mask, (adv + v) * mask


def _loop_groups(scores, G, fn):
    out = []
    for g in range(0, len(scores), G):
        grp = scores[g:g + G].tolist()
        out += [fn(grp, j) for j in range(G)]
    return torch.tensor(out)


def _random_batch(seed, B, G, R):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 3, (B * G,), generator=gen).float()
    lengths = torch.randint(1, R + 1, (B * G,), generator=gen)
    mask = (torch.arange(R).unsqueeze(0) < lengths.unsqueeze(1)).long()
    return scores, mask, torch.randn(B * G, R, generator=gen)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("B,G,R", [(1, 2, 1), (3, 4, 7), (5, 8, 16)])
def test_vectorised_matches_loops(seed, B, G, R):
    scores, mask, rand = _random_batch(seed, B, G, R)
    inp = AdvantageInput(scores, mask, G, values=rand)
    mean = lambda g, j: sum(g) / len(g)  # noqa: E731
    std = lambda g: (sum((x - mean(g, 0)) ** 2 for x in g) / (len(g) - 1)) ** 0.5  # noqa: E731
    expect = {
        "grpo": _loop_groups(scores, G, lambda g, j: (g[j] - mean(g, j)) / (std(g) + 1e-4)),
        "dr_grpo": _loop_groups(scores, G, lambda g, j: g[j] - mean(g, j)),
        "rloo": _loop_groups(scores, G, lambda g, j: g[j] - (sum(g) - g[j]) / (len(g) - 1)),
        "reinforce_pp_baseline": _loop_groups(scores, G, lambda g, j: g[j] - mean(g, j)),
        "reinforce_pp": scores,
    }
    for name, per_seq in expect.items():
        adv, _ = ADVANTAGES.get(name)(inp, cfg(name))
        torch.testing.assert_close(adv, per_seq.unsqueeze(-1) * mask, atol=1e-5, rtol=1e-5, msg=name)
    rewards = token_rewards(inp, scores)
    adv, ret = ADVANTAGES.get("gae")(inp, cfg("gae", gamma=0.97, lam=0.9))
    la, lr = _loop_gae(rewards, rand, mask.float(), 0.97, 0.9)
    torch.testing.assert_close(adv, la, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ret, lr, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_discounted_returns_match_loop(gamma):
    scores, mask, rand = _random_batch(7, 3, 2, 9)
    ret = discounted_returns(rand, mask, gamma)
    expect = torch.zeros_like(rand)
    for i in range(rand.shape[0]):
        acc = 0.0
        for t in reversed(range(rand.shape[1])):
            acc = float(rand[i, t] * mask[i, t]) + gamma * acc
            expect[i, t] = acc
    torch.testing.assert_close(ret, expect * mask, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- properties
@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(2, 6), st.integers(0, 10_000))
def test_group_baselines_sum_to_zero_per_group(B, G, seed):
    scores, mask, _ = _random_batch(seed, B, G, 5)
    inp = AdvantageInput(scores, torch.ones_like(mask), G)
    for name in ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"):
        adv = ADVANTAGES.get(name)(inp, cfg(name))[0][:, 0].view(B, G)
        assert adv.sum(-1).abs().max() < 1e-4, name


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 6), st.integers(0, 10_000))
def test_rloo_baseline_excludes_the_sample_itself(G, seed):
    scores, mask, _ = _random_batch(seed, 1, G, 3)
    adv0 = ADVANTAGES.get("rloo")(AdvantageInput(scores, mask, G), cfg("rloo"))[0][:, 0]
    bumped = scores.clone()
    bumped[0] += 5.0  # sample 0's own reward does not move its baseline: its advantage moves by exactly 5
    adv1 = ADVANTAGES.get("rloo")(AdvantageInput(bumped, mask, G), cfg("rloo"))[0][:, 0]
    torch.testing.assert_close(adv1[0] - adv0[0], torch.tensor(5.0))
    torch.testing.assert_close(adv1[1:] - adv0[1:], torch.full((G - 1,), -5.0 / (G - 1)))


def test_kl_in_reward_changes_returns_only_through_the_penalty():
    inp = _two_groups()
    kl = -0.01 * torch.ones(6, 3)
    plain = ADVANTAGES.get("grpo")(inp, cfg("grpo"))[0]
    with_kl = ADVANTAGES.get("grpo")(AdvantageInput(inp.scores, inp.response_mask, 3, kl_reward=kl), cfg("grpo"))[0]
    torch.testing.assert_close(with_kl - plain, torch.tensor([[-0.02, -0.01, 0.0]] * 6))


# --------------------------------------------------------------------------- whitening
def test_whitening_registry_and_hand_computed():
    assert WHITENING.names() == ["global", "local", "none"]
    adv = torch.tensor([[1.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 0]])
    loc = WHITENING.get("local")(adv, mask, schema.node(schema.AdvantageConfig))
    # mean 2, unbiased var 2 -> (A - 2) / sqrt(2 + 1e-8); padding zeroed
    torch.testing.assert_close(loc, torch.tensor([[-1 / 2 ** 0.5, 1 / 2 ** 0.5, 0.0]]))
    glob = WHITENING.get("global")(adv, mask, schema.node(schema.AdvantageConfig))
    torch.testing.assert_close(glob, torch.tensor([[-1.0, 1.0, 0.0]]))  # population var 1
    centred = WHITENING.get("global")(adv, mask, schema.node(schema.AdvantageConfig, whiten_std=False))
    torch.testing.assert_close(centred, torch.tensor([[-1.0, 1.0, 0.0]]))
    assert torch.equal(WHITENING.get("none")(adv, mask, None), adv)


def test_compute_advantages_whitens_after_the_estimator():
    inp = _two_groups()
    adv, _ = compute_advantages(inp, cfg("reinforce_pp", whiten="global"))
    m = inp.response_mask.bool()
    assert abs(adv[m].mean().item()) < 1e-6
    assert abs(adv[m].var(unbiased=False).item() - 1.0) < 1e-4
