"""Prompt groups split across data-parallel ranks as TRL 1.16 splits them (``process_slice``: contiguous slices
of the step's group-major rows): on 2 gloo ranks, each holding its slice, every estimator gives each rank
the single-process advantages and returns of its rows, also where a group spans the two ranks."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from core.algorithms.advantage import ADVANTAGES, AdvantageInput, compute_advantages
from core.training import distributed
from tests.helpers import group_option

WORLD, R = 2, 6
# (prompts, group size): 3 x 2 and 3 x 4 put a group on both ranks; 2 x 4 gives each rank one whole group.
LAYOUTS = [(3, 2), (3, 4), (2, 4)]
# Every estimator once, grpo in each std scope; group statistics with excluded (NaN) scores where an
# estimator takes them; global whitening, a cross-rank reduction of its own, where OpenRLHF uses it.
VARIANTS = [("grpo", {}, False), ("grpo", {"std": "batch"}, True), ("grpo", {"std": "none", "unbiased_std": False},
            False), ("grpo", {"unbiased_std": False}, True), ("dr_grpo", {}, True), ("rloo", {}, False),
            ("reinforce_pp", {"gamma": 0.9, "whiten": "global"}, False),
            ("reinforce_pp_baseline", {"whiten": "global"}, False), ("gae", {"lam": 0.9, "whiten": "global"}, False)]
CASES = {f"{name}-{'-'.join(f'{k}={v}' for k, v in kw.items())}-nan={nan}-{P}x{G}": (name, kw, nan, P, G)
         for name, kw, nan in VARIANTS for P, G in LAYOUTS}


def _input(nan: bool, P: int, G: int) -> AdvantageInput:
    """The step's rows: scores with ties and spread, uneven lengths, critic values and a KL-in-reward term."""
    gen = torch.Generator().manual_seed(P * 100 + G)
    N = P * G
    scores = torch.randint(0, 4, (N,), generator=gen).float()  # [N]
    scores[1], scores[2 * G - 1] = 7.0, 9.0  # the first two groups (the second spans ranks) have unequal scores
    if nan:  # one excluded score: in the spanning group where it leaves a scored row on each rank
        scores[G + 1 if G > 2 else 0] = float("nan")
    lengths = torch.randint(1, R + 1, (N,), generator=gen)  # [N]
    mask = (torch.arange(R) < lengths.unsqueeze(-1)).float()  # [N, R]
    values, kl = torch.randn(N, R, generator=gen), -0.05 * torch.rand(N, R, generator=gen)  # [N, R] x2
    return AdvantageInput(scores, mask, G, values=values, kl_reward=kl, reward_clip=(-5.0, 5.0))


def _cfg(name: str, kw: dict):
    """The estimator's option (conf/advantage/<name>.yaml) with ``kw`` over it."""
    return group_option(f"advantage/{name}", kw)


def _rows(inp: AdvantageInput, sl: slice) -> AdvantageInput:
    return AdvantageInput(inp.scores[sl], inp.response_mask[sl], inp.group_size, inp.values[sl], inp.kl_reward[sl],
                          inp.reward_clip)


def _worker(rank: int, init: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    got = {}
    for key, (name, kw, nan, P, G) in CASES.items():
        inp = _input(nan, P, G)
        got[key] = compute_advantages(_rows(inp, distributed.own_rows(P * G)), _cfg(name, kw))  # this rank's rows
    torch.save(got, f"{out}.{rank}")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("groups")
    mp.spawn(_worker, args=(f"file://{tmp / 'store'}", str(tmp / "out")), nprocs=WORLD, join=True)
    return [torch.load(tmp / f"out.{rank}") for rank in range(WORLD)]


def test_the_cases_cover_every_estimator_and_split_groups():
    assert sorted({name for name, *_ in CASES.values()}) == ADVANTAGES.names() and len(ADVANTAGES.names()) == 6
    assert len(CASES) == len(VARIANTS) * len(LAYOUTS) == 27
    assert [(P * G // WORLD) % G != 0 for P, G in LAYOUTS] == [True, True, False]  # two layouts split a group


@pytest.mark.distributed
@pytest.mark.parametrize("key", CASES)
def test_each_rank_gets_the_single_process_rows(two_ranks, key):
    name, kw, nan, P, G = CASES[key]
    inp = _input(nan, P, G)
    want_adv, want_ret = compute_advantages(inp, _cfg(name, kw))  # one process, the whole step: [N, R] x2
    n = P * G // WORLD
    for rank, got in enumerate(two_ranks):
        adv, ret = got[key]
        assert adv.shape == (n, R)
        torch.testing.assert_close(adv, want_adv[rank * n:(rank + 1) * n], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ret, want_ret[rank * n:(rank + 1) * n], rtol=1e-5, atol=1e-6)
    if n % G:  # a group spans the ranks: its rows G..2G-1 lie on both sides of row n, with a signal on each
        assert want_adv[G:n].abs().sum() > 0 and want_adv[n:2 * G].abs().sum() > 0
