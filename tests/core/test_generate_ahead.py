"""Generation one step ahead (``rollout.generate_ahead``, core/rollout/ahead.py): which weights sampled the
batch each step trains, when weights are pushed, the policy lag, and a killed run resuming bit for bit.

``generate_ahead: 0`` is the loop's old behaviour; the existing run and resume tests cover it unchanged.
"""
from __future__ import annotations

import copy
import hashlib
import json
import shutil

import pytest
import torch

from core.models.logprobs import chunked_logprobs
from core.rollout.ahead import GenerationAhead
from core.rollout.hf import HFGenerateRollout
from core.training.manifest import write_manifest
from recipes import rl
from tests.core.test_rl_runs import BASE

# The policy must move every step for "which weights sampled this batch" to be decidable: rewards that differ
# inside the batch by construction, an estimator without group centring, a learning rate that moves it.
MOVING = (*BASE, "verifier.name=tests.stub_rewards:gold_parity", "advantage=reinforce_pp", "kl=k1",
          "optim.optimizer.lr=1e-2")


def _steps(n: int) -> tuple[str, str]:
    return f"train.total_steps={n}", f"scale.total_steps={n}"  # scale=tiny would cap it at 2


def _rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _digest(model) -> str:
    return hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters())).hexdigest()


def test_ahead_trains_each_step_on_the_batch_sampled_by_the_weights_of_two_steps_before(compose_cfg, tmp_path,
                                                                                          monkeypatch):
    """hf engine: the sampler's own log-probs of the batch trained at step t are those of the policy after step
    t - 2 (after step 0 at steps 1 and 2), to float rounding, and are far from every other version's. The loop asks
    for the sampler's log-probs only when the loss reads them: an importance correction does (its weights change the
    updates, not which weights sampled)."""
    cfg = compose_cfg(*MOVING, *_steps(4), "rollout.generate_ahead=1", "loss.is_correction.mode=token_truncate",
                      "loss.is_correction.high=2.0", f"paths.results_dir={tmp_path}")
    run = rl.setup(cfg, run_dir=str(tmp_path / "run"))
    versions, trained, lags, forwards = [copy.deepcopy(run.engine.module.state_dict())], {}, [], rl.rollout_forwards

    def recording_forwards(run, roll):  # the batch the step trains on
        trained[run.step + 1] = roll
        return forwards(run, roll)

    monkeypatch.setattr(rl, "rollout_forwards", recording_forwards)
    for _ in range(4):
        lags.append(rl.rl_step(run)["rollout/policy_lag"])
        run.step += 1
        versions.append(copy.deepcopy(run.engine.module.state_dict()))
    assert lags == [0, 1, 1, 1] and sorted(trained) == [1, 2, 3, 4]
    model = copy.deepcopy(run.engine.module)
    for t, roll in trained.items():
        gaps = []
        for state in versions[:t]:  # every version that existed when step t trained
            model.load_state_dict(state)
            lp = chunked_logprobs(model, roll.input_ids, roll.attention_mask, roll.prompt_length, 1.0, 64)  # [N, R]
            gaps.append(((lp - roll.logprobs).abs() * roll.response_mask).max().item())
        sampled_by = max(t - 2, 0)
        assert gaps[sampled_by] < 1e-4, (t, gaps)
        assert all(g > 1e-2 for v, g in enumerate(gaps) if v != sampled_by), (t, gaps)


class DeferredCopy:
    """A rollout-engine double shaped like a generation server: it samples from its own copy of the weights (as
    vLLM holds one), and its ``start_generate`` handle generates only when ``result()`` is called (as a server
    answers later), so a push between the two would change what the batch was sampled with; it refuses that
    push. Without ``keeps_weights`` it drops its weights after each generation and refuses to generate until the
    next push, as vLLM at sleep level 2. It records each push and generation with the digest of its weights."""

    gathers_policy, collective = False, False

    def __init__(self, model, tokenizer, cfg, keeps: bool):
        self.inner = HFGenerateRollout(copy.deepcopy(model), tokenizer, cfg)
        if keeps:
            self.keeps_weights = True
        self.in_flight, self.dropped, self.events, self.made_by = 0, False, [], {}

    def sync_weights(self, engine) -> None:
        assert not self.in_flight, "weights pushed while a generation is in flight"
        self.inner.model.load_state_dict(engine.module.state_dict())
        self.dropped = False
        self.events.append(("push", _digest(self.inner.model)))

    def generate(self, prompts, sampling):
        assert not self.dropped, "generate on dropped weights: a push was skipped"
        batch = self.inner.generate(prompts, sampling)
        self.made_by[id(batch)] = _digest(self.inner.model)
        self.events.append(("generate", self.made_by[id(batch)]))
        self.dropped = not getattr(self, "keeps_weights", False)
        return batch

    def start_generate(self, prompts, sampling):
        self.in_flight += 1
        double = self

        class Handle:
            def result(self):
                batch = double.generate(prompts, sampling)
                double.in_flight -= 1
                return batch

        return Handle()


@pytest.mark.parametrize("ahead, keeps", [(0, True), (1, True), (1, False)])
def test_pushes_with_evaluations_against_a_deferred_sampler(compose_cfg, tmp_path, monkeypatch, ahead, keeps):
    """Three steps with an evaluation after each, the sampler a :class:`DeferredCopy`: no push while a generation
    is pending (evaluation settles it first); an engine that keeps its weights is pushed once per policy version,
    so evaluation's push is not repeated by the next step; one that drops them is pushed before every
    generation; the batch trained at step t was sampled by version t - 1 (ahead 0) or t - 2 (ahead 1)."""
    cfg = compose_cfg(*MOVING, *_steps(3), "train.eval_every=1", f"rollout.generate_ahead={ahead}",
                      f"paths.results_dir={tmp_path}")
    run = rl.setup(cfg, run_dir=str(tmp_path / "run"))
    run.rollout = DeferredCopy(run.engine.module, run.tokenizer, run.cfg.rollout, keeps)
    run.gen = GenerationAhead(run.rollout)
    versions, trained, step, forwards = [], [], rl.rl_step, rl.rollout_forwards

    def recording_step(run):  # the policy version each step trains
        versions.append(_digest(run.engine.module))
        return step(run)

    def recording_forwards(run, roll):  # the batch it trains on
        trained.append(roll)
        return forwards(run, roll)

    monkeypatch.setattr(rl, "rl_step", recording_step)
    monkeypatch.setattr(rl, "rollout_forwards", recording_forwards)
    rl.train(run)
    versions.append(_digest(run.engine.module))
    assert len(set(versions)) == 4  # the policy moved at every step
    pushes = [d for kind, d in run.rollout.events if kind == "push"]
    if keeps:
        assert pushes == versions
    else:  # every generation right after a push (DeferredCopy refuses otherwise), and never an older version
        assert len(pushes) == sum(kind == "generate" for kind, _ in run.rollout.events)
        assert [versions.index(d) for d in pushes] == sorted(versions.index(d) for d in pushes)
    sampled_by = [versions.index(run.rollout.made_by[id(roll)]) for roll in trained]
    assert sampled_by == ([0, 1, 2] if ahead == 0 else [0, 0, 1])
    lags = [r["rollout/policy_lag"] for r in _rows(tmp_path / "run") if "loss" in r]
    assert lags == [t - v for t, v in enumerate(sampled_by)]
    assert run.gen.pending is None and not run.rollout.in_flight  # the last step started nothing


class Killed(Exception):
    pass


def _comparable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "memory/"))} for r in rows]


def test_a_run_killed_after_a_checkpoint_resumes_on_the_batch_it_generated_ahead(compose_cfg, tmp_path, monkeypatch):
    """Killed right after the checkpoint of step 2 (which holds the batch generated for step 3 by the weights
    after step 1), resumed: metrics, samples and final weights equal the uninterrupted run's, each step logged
    once. Resumed without that file, step 3 trains on another batch: the saved batch is what makes it equal."""
    common = (*MOVING, *_steps(4), "rollout.generate_ahead=1", "train.checkpoint_every=1", "train.eval_every=2",
              "logger.samples_every=1", f"paths.results_dir={tmp_path}")
    rl.main(compose_cfg(*common), run_dir=str(tmp_path / "straight"))
    save = rl.save_training_state

    def killed_after_step_2(run_dir, engines, extra, local=None, **kw):
        save(run_dir, engines, extra, local=local, **kw)
        if extra["step"] == 2:
            raise Killed

    monkeypatch.setattr(rl, "save_training_state", killed_after_step_2)
    with pytest.raises(Killed):
        rl.main(compose_cfg(*common), run_dir=str(tmp_path / "killed"))
    monkeypatch.undo()
    pending = torch.load(tmp_path / "killed" / "checkpoint-2" / "local.pt", weights_only=False)
    # step 3's rows (scale=tiny: 4 prompts x 4 completions), sampled after step 1
    assert pending["version"] == 1 and len(pending["key"]) == 4 * 4
    shutil.copytree(tmp_path / "killed", tmp_path / "without")
    (tmp_path / "without" / "checkpoint-2" / "local.pt").unlink()
    write_manifest(tmp_path / "without" / "checkpoint-2", 2)  # still a checkpoint that verifies, without the batch
    for name in ("killed", "without"):
        rl.main(compose_cfg(*common, "resume=true"), run_dir=str(tmp_path / name))
    straight, resumed = _rows(tmp_path / "straight"), _rows(tmp_path / "killed")
    assert [r["step"] for r in resumed] == [r["step"] for r in straight]
    assert [r["step"] for r in resumed if "loss" in r] == [1, 2, 3, 4]
    assert _comparable(resumed) == _comparable(straight)
    samples = [(tmp_path / name / "samples.jsonl").read_text() for name in ("straight", "killed")]
    assert samples[0] == samples[1]
    from safetensors.torch import load_file

    weights = [load_file(tmp_path / name / "model" / "model.safetensors") for name in ("straight", "killed")]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    without = [r for r in _rows(tmp_path / "without") if r.get("step") == 3 and "loss" in r]
    assert without[0]["rollout/policy_lag"] == 0  # generated at step 3 instead
    assert _comparable(without) != _comparable([r for r in straight if r.get("step") == 3 and "loss" in r])
