"""Models as the loops train them: train mode, so gradient checkpointing runs in every training forward (one
checkpointed call per decoder layer) and none in the no-grad passes; dropout per ``train.disable_dropout``;
RNG forks of the device in use only."""
from __future__ import annotations

from collections import Counter

import pytest
import torch
import transformers.modeling_utils

from core.models import critic as C
from core.models import loading
from core.training import device as D
from recipes import rl, rl_models, rm
from tests.core.test_rl_runs import BASE


@pytest.fixture
def checkpointed(monkeypatch):
    """Counts checkpointed calls per decoder layer: transformers hands each layer's call to the ``checkpoint``
    that ``gradient_checkpointing_enable`` finds in ``transformers.modeling_utils`` (patched before loading)."""
    calls, real = Counter(), transformers.modeling_utils.checkpoint

    def counting(fn, *args, **kwargs):
        calls[id(fn.args[0])] += 1  # fn = partial(forward, layer, ...)
        return real(fn, *args, **kwargs)

    monkeypatch.setattr(transformers.modeling_utils, "checkpoint", counting)
    return calls


def _layer_calls(calls: Counter, model) -> list[int]:
    return [calls[id(layer)] for layer in getattr(model, model.base_model_prefix).layers]


def _counting_forwards(engine, monkeypatch) -> list[int]:
    count, forward = [0], engine.forward

    def counted(*args, **kwargs):
        count[0] += 1
        return forward(*args, **kwargs)

    monkeypatch.setattr(engine, "forward", counted)
    return count


def test_rl_step_checkpoints_each_layer_of_every_training_forward(compose_cfg, tmp_path, checkpointed, monkeypatch):
    """A PPO step (critic, reference, old-policy pass, 2 PPO epochs) with ``model.gradient_checkpointing``: every
    training forward of the policy and of the critic checkpoints each decoder layer once; the rollout-phase
    no-grad passes (old policy, reference, values) and generation checkpoint nothing."""
    cfg = compose_cfg(*BASE, "advantage=gae", "kl=k1", "train.ppo_epochs=2", "model.gradient_checkpointing=true",
                      f"paths.results_dir={tmp_path}")
    run = rl.setup(cfg, run_dir=str(tmp_path / "run"))
    policy_fw, critic_fw = _counting_forwards(run.engine, monkeypatch), _counting_forwards(run.critic, monkeypatch)
    rl.rl_step(run)
    assert policy_fw[0] > 0 and critic_fw[0] == policy_fw[0]
    assert _layer_calls(checkpointed, run.engine.module) == [policy_fw[0]] * 2  # the tiny model's 2 layers
    assert _layer_calls(checkpointed, run.critic.module) == [critic_fw[0]] * 2
    assert _layer_calls(checkpointed, run.ref.module) == [0, 0]
    assert run.engine.module.training and run.critic.module.training and not run.ref.module.training


def test_reward_model_training_forward_checkpoints_each_layer(compose_cfg, checkpointed):
    """The reward-model loop's model (``recipes.rm.build_model``) checkpoints each layer in a training forward."""
    from core.models import reward_model as RM

    cfg = compose_cfg("recipe=tiny_rm", "model.gradient_checkpointing=true")
    path = loading.model_dir(cfg.model)
    model = rm.build_model(path, cfg, loading.load_tokenizer(path))
    ids = torch.randint(3, 20, (2, 6))
    RM.sequence_rewards(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                "last": torch.tensor([5, 5])}).sum().backward()
    assert _layer_calls(checkpointed, model) == [1] * model.config.num_hidden_layers


def _with_dropout(load):
    """``load`` whose model has attention dropout 0.1 (the real checkpoints' is 0.0, so a test sets one)."""
    def loaded(*args):
        model = load(*args)
        for m in model.modules():
            if hasattr(m, "attention_dropout"):
                m.attention_dropout = 0.1
        return model
    return loaded


@pytest.mark.parametrize("disable", [True, False])
def test_disable_dropout_reaches_the_policy_and_critic(compose_cfg, tmp_path, monkeypatch, disable):
    """``train.disable_dropout`` zeroes the attention dropout that transformers' attention modules read in train
    mode; false keeps the checkpoint's, active in the training forwards."""
    monkeypatch.setattr(rl_models, "load_causal_lm", _with_dropout(rl_models.load_causal_lm))
    monkeypatch.setattr(rl_models, "load_critic", _with_dropout(rl_models.load_critic))
    cfg = compose_cfg(*BASE, "advantage=gae", f"train.disable_dropout={disable}", f"paths.results_dir={tmp_path}")
    run = rl.setup(cfg, run_dir=str(tmp_path / "run"))
    for model in (run.engine.module, run.critic.module):
        rates = {m.attention_dropout for m in model.modules() if hasattr(m, "attention_dropout")}
        assert model.training and rates == ({0.0} if disable else {0.1})


def test_rng_forks_only_the_device_in_use(monkeypatch, tmp_path):
    """``torch.random.fork_rng`` without ``devices`` saves every visible GPU's generator: the critic's fresh head
    (on the CPU here) and the tiny-model build fork the CPU alone, a GPU device only its own."""
    seen, real = [], torch.random.fork_rng

    def recording(devices=None, **kwargs):
        seen.append(devices)
        return real(devices=[], **kwargs)  # this machine has no GPU to fork

    monkeypatch.setattr(torch.random, "fork_rng", recording)
    from core.config import schema
    from tests.helpers import TINY

    model_cfg = schema.node(schema.ModelConfig, name_or_path=None, arch="qwen2", tiny=TINY, dtype="float32")
    monkeypatch.setattr(loading.paths, "cache_dir", lambda: tmp_path)  # the tiny model is built here, not cached
    C.load_critic(loading.model_dir(model_cfg), schema.node(schema.CriticConfig), model_cfg)
    with D.fork_rng(torch.device("cuda", 3)):
        pass
    with D.fork_rng(torch.device("meta")):
        pass
    assert seen == [[], [], [torch.device("cuda", 3)], []]  # build, critic head, a GPU, the meta device


def test_checkpointing_is_enabled_without_transformers_deprecation_warnings(compose_cfg, recwarn):
    """``model.gradient_checkpointing`` enables transformers' activation checkpointing by its current name: the old
    ``gradient_checkpointing_enable`` warns (FutureWarning) once per model built, on every run (issue 27, noise)."""
    cfg = compose_cfg("scale=tiny", "model.gradient_checkpointing=true")
    model = loading.load_causal_lm(loading.model_dir(cfg.model), cfg.model)
    assert model.is_activation_checkpointing and not model.config.use_cache
    assert not [w for w in recwarn if issubclass(w.category, FutureWarning)], [str(w.message) for w in recwarn]
