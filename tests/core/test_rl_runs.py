"""Two-step runs of the tiny recipe (scale=tiny) with every estimator and every aggregation.

In-process through ``recipes.rl.main(cfg, run_dir)`` on configs composed from conf/ (about a second
each); one run goes through the real CLI in a subprocess.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys

import pytest

from core.algorithms.advantage import ADVANTAGES
from core.algorithms.loss import AGGREGATIONS, AggContext
from core.config.pipeline import prepare
from core.config.validate import ConfigError
from core.paths import PROJECT_ROOT
from recipes import rl, rl_update

BASE = ("scale=tiny", "recipe_name=tiny_math_grpo", "train.warm_start.steps=0", "logger.progress=false",
        "logger.tensorboard=false", "train.eval_prompts=4")
# options that only make sense with some estimators ride along with them
EXTRA = {
    "gae": ("kl=k1", "train.ppo_epochs=2", "loss.dual_clip=3", "train.shaping.non_stop_penalty=-1",
            "advantage.score_position=after_last", "train.shuffle_mini_batches=true"),
    "reinforce_pp": ("kl=k1", "kl.controller=adaptive", "kl.target=0.01", "train.shaping.reward_clip=[-1,1]"),
    "reinforce_pp_baseline": ("loss=gspo", "loss.is_correction.mode=sequence_mask"),
    "rloo": ("kl=k2", "train.shaping.mask_truncated=true"),
    "dr_grpo": ("kl.coef=0", "train.shaping.overlong_buffer=4"),
    "grpo": ("loss.entropy_coef=0.01", "loss.is_correction.mode=token_truncate"),
}


def _metrics(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r]


def test_extras_cover_every_estimator():
    assert sorted(EXTRA) == ADVANTAGES.names()


@pytest.mark.parametrize("aggregation", AGGREGATIONS.names())
@pytest.mark.parametrize("estimator", ADVANTAGES.names())
def test_two_step_run(compose_cfg, tmp_path, estimator, aggregation):
    cfg = compose_cfg(*BASE, f"advantage={estimator}", *EXTRA[estimator], f"loss.aggregation={aggregation}",
                      f"paths.results_dir={tmp_path}")
    rl.main(cfg, run_dir=str(tmp_path / "run"))
    steps = _metrics(tmp_path / "run")
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"])
        assert ("value/loss" in r) == (estimator == "gae")
    assert (tmp_path / "run" / "model" / "config.json").exists()


def test_cli_two_step_ppo_run(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "recipes.run", *BASE[:1], *BASE[2:], "advantage=gae", "kl=k1",
         f"paths.results_dir={tmp_path}", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    steps = _metrics(tmp_path / "run")
    assert len(steps) == 2 and all(math.isfinite(r["value/loss"]) for r in steps)
    assert all(r["kl/beta"] == 0.01 for r in steps)


def test_ppo_resume_restores_critic_and_beta(compose_cfg, tmp_path):
    common = (*BASE, "advantage=gae", "kl=k1", "kl.controller=adaptive", "kl.target=0.001",
              "train.checkpoint_every=1", f"paths.results_dir={tmp_path}")
    rl.train(rl.setup(compose_cfg(*common), run_dir=str(tmp_path / "run")))  # killed before its save
    ckpt = tmp_path / "run" / "checkpoint-2"
    assert (ckpt / "critic" / "engine.pt").exists()
    saved = json.loads((ckpt / "trainer.json").read_text())
    assert saved["step"] == 2 and saved["kl_beta"] != 0.01  # the adaptive controller moved beta
    run = rl.setup(compose_cfg(*common, "resume=true", "train.total_steps=3"), run_dir=str(tmp_path / "run"))
    assert run.step == 2 and run.kl_ctl.beta == saved["kl_beta"]


@pytest.mark.parametrize("aggregation", [n for n in AGGREGATIONS.names() if AGGREGATIONS.meta(n)["accumulation_exact"]])
def test_loop_gradient_accumulation_equals_one_batch(compose_cfg, tmp_path, aggregation):
    """Through the real micro-step (model forward, KL, entropy): 8 micro-batches of 2 rows, which split
    the groups, give the gradient of one 16-row batch."""
    import torch

    from core.rollout import Sampling

    cfg = compose_cfg(*BASE, f"loss.aggregation={aggregation}", f"paths.results_dir={tmp_path}")
    run = rl.setup(cfg, run_dir=str(tmp_path / "run"))
    prompts = [run.data.train_ids[i] for i in range(4) for _ in range(4)]
    roll = run.rollout.generate(prompts, Sampling.from_cfg(cfg.rollout))
    fw = rl.rollout_forwards(run, roll)
    mask = roll.response_mask
    adv = torch.randn(mask.shape, generator=torch.Generator().manual_seed(0)) * mask
    grads = []
    for micro in (16, 2):
        run.engine.module.zero_grad()
        agg = AggContext(num_micro_batches=16 // micro, step_tokens=float(mask.sum()), max_tokens=16)
        for u0 in range(0, 16, micro):
            rl_update.micro_step(run, roll, slice(u0, u0 + micro), mask, adv, adv, fw, agg)
        grads.append([p.grad.clone() for p in run.engine.module.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("shuffle", [False, True])
def test_mini_batch_order_per_epoch(compose_cfg, tmp_path, monkeypatch, shuffle):
    """Each PPO epoch visits every completion once; with ``shuffle_mini_batches`` in a fresh seeded
    permutation per epoch (Open-Instruct PPO), otherwise in rollout order (veRL)."""
    cfg = compose_cfg(*BASE, "train.ppo_epochs=3", "train.mini_batch_size=8", "train.micro_batch_size=4",
                      f"train.shuffle_mini_batches={shuffle}", f"paths.results_dir={tmp_path}")
    run = rl.setup(cfg, run_dir=str(tmp_path / "run"))
    seen, real = [], rl_update.micro_step

    def recording(run, roll, rows, *a):
        seen.append(rows.tolist())
        return real(run, roll, rows, *a)

    monkeypatch.setattr(rl_update, "micro_step", recording)
    rl.rl_step(run)
    t = run.cfg.train  # after scale=tiny
    n = int(t.prompts_per_step) * int(t.group_size)
    per_epoch = n // int(t.micro_batch_size)
    assert int(t.ppo_epochs) == 3 and per_epoch > 1 and len(seen) == 3 * per_epoch
    epochs = [sum(seen[e * per_epoch:(e + 1) * per_epoch], []) for e in range(3)]
    assert all(sorted(e) == list(range(n)) for e in epochs)  # every row once per epoch
    if shuffle:
        assert len({tuple(e) for e in epochs}) == 3 and epochs[0] != list(range(n))
        order = rl_update.epoch_order
        assert order(run, n, 1).tolist() == order(run, n, 1).tolist()  # seeded, repeatable
        run.step += 1
        assert order(run, n, 1).tolist() != epochs[1]  # a new draw at the next RL step
    else:
        assert all(e == list(range(n)) for e in epochs)


@pytest.mark.parametrize("policy", ["mask", "zero", "exclude"])
def test_none_rewards_through_a_step(compose_cfg, tmp_path, policy):
    """A verifier that cannot score some samples (None) trains under every ``none_reward`` policy."""
    cfg = compose_cfg(*BASE, f"train.shaping.none_reward={policy}", f"paths.results_dir={tmp_path}")
    run = rl.setup(cfg, run_dir=str(tmp_path / "run"))
    verify = run.verifier.train

    def some_none(texts, **kw):
        s = verify(texts, **kw)
        rewards = [None if i % 3 == 0 else r for i, r in enumerate(s.rewards)]
        return dataclasses.replace(s, rewards=rewards, accuracy=rewards)

    run.verifier = run.verifier._replace(train=some_none)
    m = rl.rl_step(run)
    n = int(run.cfg.train.prompts_per_step) * int(run.cfg.train.group_size)
    assert m["reward/skipped"] == len(range(0, n, 3))
    assert math.isfinite(m["accuracy"])  # over the completions the verifier judged
    assert math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"])


def test_bf16_run_keeps_fp32_master_weights_and_a_bf16_reference(compose_cfg, tmp_path):
    """model.dtype=bfloat16 on the plain engine: bf16 policy and reference, fp32 master weights and optimiser
    state, and at the first step the reference equals the policy (KL 0), as under DeepSpeed's bf16 mode."""
    import torch

    from tests.helpers import FAST

    cfg = compose_cfg(*FAST, "recipe_name=tiny_math_grpo", "model.dtype=bfloat16", "kl.coef=0.04",
                      "verifier.name=tests.stub_rewards:gold_parity", "advantage=reinforce_pp",
                      f"paths.results_dir={tmp_path}")
    run = rl.setup(cfg, run_dir=str(tmp_path / "run"))
    assert {p.dtype for p in run.engine.module.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in run.ref.module.parameters()} == {torch.bfloat16}
    assert {m.dtype for m in run.engine.master.master} == {torch.float32}
    state = run.engine.optimizer.state_dict()["param_groups"][0]["params"]
    assert len(state) == len(run.engine.master.master)  # the optimiser steps the fp32 copies
    first = rl.rl_step(run)
    assert first["kl"] == 0.0 and math.isfinite(first["loss"]) and first["grad_norm"] > 0
    second = rl.rl_step(run)
    assert second["kl"] > 0  # the policy moved away from its reference


def test_the_rng_after_setup_does_not_depend_on_a_cached_warm_start(compose_cfg, tmp_path, monkeypatch):
    """Building the warm start trains a model; a run whose warm start is cached skips that. Either way the
    run must sample the same completions, so the build leaves the run's RNG streams as it found them."""
    import torch

    from core import paths
    from tests.helpers import FAST

    monkeypatch.setattr(paths, "DEFAULT_CACHE_DIR", str(tmp_path / "cache"))  # nothing cached yet
    # seed 1: not the warm start's own seed (0), which a build would leave the generator at
    cfg = compose_cfg(*FAST, "recipe_name=tiny_math_grpo", "seed=1", "train.warm_start.eval_every=2",
                      f"paths.results_dir={tmp_path}")
    states = []
    for i in range(2):  # the first builds the warm start, the second finds it cached
        rl.setup(cfg, run_dir=str(tmp_path / f"run{i}"))
        states.append(torch.get_rng_state())
    assert len(list((tmp_path / "cache" / "warm_start").glob("*/DONE"))) == 1
    assert torch.equal(states[0], states[1])


def test_epochs_derive_the_steps_from_the_filtered_rows(compose_cfg, tmp_path):
    """``train.epochs`` (TRL num_train_epochs, veRL total_epochs): rows // prompts_per_step RL steps per pass, the
    last partial batch dropped; the saved config records the derived count. Both or neither length key: refused."""
    small = ("recipe_name=tiny_math_grpo", "train.warm_start.steps=0", "logger.progress=false",
             "logger.tensorboard=false", "data.generator.num_train=14", "data.generator.num_eval=4",
             "train.prompts_per_step=4", "train.group_size=2", "train.mini_batch_size=8", "train.micro_batch_size=4",
             "train.eval_prompts=4", "rollout.max_new_tokens=4", f"paths.results_dir={tmp_path}")
    epochs = compose_cfg("train.total_steps=null", "train.epochs=2", *small)
    assert prepare(epochs).plan.total_steps is None and prepare(epochs).plan.for_rows(14).total_steps == 6
    rl.main(epochs, run_dir=str(tmp_path / "run"))
    assert [r["step"] for r in _metrics(tmp_path / "run")] == [1, 2, 3, 4, 5, 6]  # 2 x (14 // 4)
    assert "total_steps: 6" in (tmp_path / "run" / "config.yaml").read_text()
    for both in (("train.epochs=2",), ("train.total_steps=null",)):
        with pytest.raises(ConfigError, match=r"set exactly one \(epochs derives the RL steps"):
            rl.main(compose_cfg(*both, *small), run_dir=str(tmp_path / "bad"))


def test_keep_best_saves_the_best_evaluated_policy_and_reports_it_beside_the_last(compose_cfg, tmp_path):
    cfg = compose_cfg(*BASE, "train.keep_best=true", "train.eval_every=1", *(f"{k}.total_steps=3" for k in
                      ("train", "scale")), f"paths.results_dir={tmp_path}")
    rl.main(cfg, run_dir=str(tmp_path / "run"))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    after_rl = [(s, a) for s, a in evals if s >= 1]
    assert [s for s, _ in after_rl] == [1, 2, 3]
    best = max(after_rl, key=lambda sa: (sa[1], -sa[0]))  # the first of equals
    (row,) = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert (row["best_step"], row["eval_best"]) == best and row["eval_after"] == after_rl[-1][1]
    assert (tmp_path / "run" / "best" / "config.json").exists()


@pytest.mark.parametrize("deterministic", [False, True])
def test_setup_honours_the_deterministic_key(compose_cfg, tmp_path, deterministic):
    """``deterministic`` reaches torch through the loop's setup (no hidden default inside seed_everything)."""
    import torch

    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(not deterministic)
    try:
        rl.setup(compose_cfg(*BASE, f"deterministic={deterministic}", f"paths.results_dir={tmp_path}"),
                 run_dir=str(tmp_path / "run"))
        assert torch.are_deterministic_algorithms_enabled() is deterministic
    finally:
        torch.use_deterministic_algorithms(was, warn_only=True)


def _host_syncs_of_one_update(compose_cfg, tmp_path, monkeypatch, micro: int) -> tuple[int, dict]:
    """Calls that copy a tensor to the host (``item``, ``tolist``, ``float(t)``) during one ``update`` of a PPO
    step (policy and critic, KL in the loss, entropy) whose 16 rows are one optimiser step of ``micro``-row
    micro-batches; and the metrics it returns."""
    import torch

    from core.rollout import Sampling

    cfg = compose_cfg(*BASE, "advantage=gae", "kl=k1", "train.prompts_per_step=4", "train.group_size=4",
                      "train.mini_batch_size=16", f"train.micro_batch_size={micro}", f"paths.results_dir={tmp_path}")
    run = rl.setup(cfg, run_dir=str(tmp_path / f"run{micro}"))
    assert run.plan.grad_accum == 16 // micro
    prompts = [run.data.train_ids[i] for i in range(4) for _ in range(4)]
    roll = run.rollout.generate(prompts, Sampling.from_cfg(cfg.rollout))
    fw = rl.rollout_forwards(run, roll)
    adv = torch.randn(roll.response_mask.shape, generator=torch.Generator().manual_seed(0)) * roll.response_mask
    calls = [0]
    for name in ("item", "tolist", "__float__"):
        real = getattr(torch.Tensor, name)

        def counted(self, *a, _real=real, **k):
            calls[0] += 1
            return _real(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    metrics = rl.update(run, roll, roll.response_mask, adv, adv, fw)
    monkeypatch.undo()
    return calls[0], metrics


def test_update_syncs_with_the_host_per_step_not_per_micro_batch(compose_cfg, tmp_path, monkeypatch):
    """The micro-batches' loss and metrics stay on the device until the update ends (on a GPU each ``.item()``
    waits for every queued kernel): 8 micro-batches copy to the host as often as 2 do, and the metrics are floats."""
    few, metrics = _host_syncs_of_one_update(compose_cfg, tmp_path, monkeypatch, micro=8)
    many, _ = _host_syncs_of_one_update(compose_cfg, tmp_path, monkeypatch, micro=2)
    assert many == few, f"{few} host copies with 2 micro-batches, {many} with 8"
    assert {"loss", "kl", "entropy", "clip_frac", "value/loss", "value/mean", "grad_norm"} <= set(metrics)
    assert all(type(v) is float for v in metrics.values())


def test_the_warm_start_trains_fp32_without_flash_attention():
    """flash-attn runs in float16/bfloat16 only and the warm start trains float32: a flash-attention model is
    warm-started with sdpa; eager and sdpa are kept, so the cached starts built with them stay valid."""
    from core.config import schema
    from core.config.frozen import freeze
    from core.models.warm_start import warm_start_model_cfg

    for attn, want in (("flash_attention_2", "sdpa"), ("flash_attention_3", "sdpa"), ("sdpa", "sdpa"),
                       ("eager", "eager")):
        model = freeze(schema.node(schema.ModelConfig, dtype="bfloat16", attn_implementation=attn))
        got = warm_start_model_cfg(model)
        assert (got.dtype, got.attn_implementation, got.arch) == ("float32", want, model.arch)


@pytest.mark.parametrize("mode", ["none", "token_truncate"])
def test_rollout_logprobs_are_asked_for_only_when_the_loss_reads_them(compose_cfg, tmp_path, monkeypatch, mode):
    """The sampler's log-probs feed the importance correction alone (``loss.is_correction``): with it off the loop asks
    no engine for them and its batches hold None, so nothing can read stand-in numbers; with it on they are there.
    Held-out evaluation scores texts and never asks. Every generate of a 1-step run is recorded."""
    from core.rollout.hf import HFGenerateRollout

    calls, real = [], HFGenerateRollout.generate

    def recording(self, prompts, sampling):
        batch = real(self, prompts, sampling)
        calls.append((sampling.temperature > 0, sampling.logprobs, batch.logprobs))
        return batch

    monkeypatch.setattr(HFGenerateRollout, "generate", recording)
    cfg = compose_cfg(*BASE, "train.total_steps=1", f"loss.is_correction.mode={mode}", "loss.is_correction.high=2.0",
                      f"paths.results_dir={tmp_path}")
    run = rl.setup(cfg, run_dir=str(tmp_path / "run"))
    assert run.plan.rollout_logprobs == (mode != "none")
    rl.train(run)
    sampled = [c for c in calls if c[0]]
    assert len(sampled) == 1 and len(calls) == 3  # evaluation before, the step, evaluation after
    for is_step, asked, lps in calls:
        assert asked == (is_step and mode != "none") and (lps is None) == (not asked)
