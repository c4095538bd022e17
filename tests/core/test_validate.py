"""Bad input fails at config validation, naming the keys that clash; every option composes."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from core.algorithms.advantage import ADVANTAGES
from core.algorithms.loss import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
from core.paths import CONF_DIR
from core.config.pipeline import prepare
from core.config.validate import ConfigError


def _error(cfg) -> str:
    """What a loop's checks say of ``cfg`` (core/config/pipeline.py ``prepare``): every problem in one error."""
    with pytest.raises(ConfigError) as e:
        prepare(cfg)
    return str(e.value)


def test_every_config_option_composes_and_validates(compose_cfg):
    groups = {g: sorted(p.stem for p in (Path(CONF_DIR) / g).glob("*.yaml")) for g in ("advantage", "loss", "kl")}
    assert groups["advantage"] == ADVANTAGES.names()  # one option per estimator, named after it
    assert set(groups["loss"]) == set(POLICY_LOSSES.names())
    assert set(groups["kl"]) == set(KL_ESTIMATORS.names())
    count = 0
    for group, options in groups.items():
        for opt in options:
            assert prepare(compose_cfg(f"{group}={opt}")).plan.samples_per_step == 128
            count += 1
    assert count == 11


@pytest.mark.parametrize("key,value,registry", [
    ("advantage.name", "ppo", ADVANTAGES), ("loss.name", "vanilla", POLICY_LOSSES),
    ("loss.aggregation", "mean", AGGREGATIONS), ("kl.estimator", "k4", KL_ESTIMATORS)])
def test_unknown_names_list_the_registered_ones(compose_cfg, key, value, registry):
    msg = _error(compose_cfg(f"{key}={value}"))
    assert f"{key}={value!r}: expected one of {registry.names()}" in msg


def test_registry_get_lists_names():
    with pytest.raises(KeyError, match="registered: dr_grpo, gae, grpo, reinforce_pp"):
        ADVANTAGES.get("nope")


def test_gae_without_a_value_model(compose_cfg):
    msg = _error(compose_cfg("advantage.name=gae"))  # grpo's node has no critic
    assert "advantage.name=gae needs a value model but advantage.critic is not set" in msg


def test_critic_with_an_estimator_that_ignores_values(compose_cfg):
    msg = _error(compose_cfg("advantage=gae", "advantage.name=grpo"))
    assert "advantage.critic is set but advantage.name=grpo" in msg
    assert "advantage.name=grpo needs advantage.std, which this advantage node lacks" in msg


def test_rloo_with_group_size_one(compose_cfg):
    msg = _error(compose_cfg("advantage=rloo", "train.group_size=1", "train.mini_batch_size=16",
                             "train.micro_batch_size=16"))
    assert "train.group_size=1: advantage.name=rloo" in msg and "group_size >= 2" in msg


def _batch(prompts: int, group: int, mini: int, micro: int) -> list[str]:
    return [f"train.prompts_per_step={prompts}", f"train.group_size={group}", f"train.mini_batch_size={mini}",
            f"train.micro_batch_size={micro}"]


# Splits TRL 1.16 accepts (its completions divide over the processes) whose groups span ranks: Open-R1's 7
# learners x per-device 16 with num_generations 7 and 14, and the smallest ones the 2-rank tests train.
SPLIT_GROUPS = [(7, _batch(16, 7, 112, 16)), (7, _batch(8, 14, 112, 16)), (2, _batch(3, 2, 6, 3)),
                (2, _batch(3, 4, 12, 2)), (4, _batch(6, 8, 48, 4))]


@pytest.mark.parametrize("world, batch", SPLIT_GROUPS)
def test_completions_not_prompts_divide_over_ranks(compose_cfg, monkeypatch, world, batch):
    cfg = compose_cfg("advantage=grpo", *batch)
    prompts, group = cfg.train.prompts_per_step, cfg.train.group_size
    assert prompts % world and (prompts * group // world) % group  # a rank's rows are not whole groups
    plan = prepare(cfg, world=_ranks(monkeypatch, world)).plan
    assert plan.world_size == world and plan.samples_per_rank * world == prompts * group
    assert plan.grad_accum * cfg.train.micro_batch_size * world == cfg.train.mini_batch_size


def _ranks(monkeypatch, world: int) -> int:
    """``world`` ranks on one node, as torchrun sets them (layout=single reads them)."""
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(world))
    return world


@pytest.mark.parametrize("world, batch, message", [
    (8, _batch(9, 14, 126, 9), "train.prompts_per_step x train.group_size = 9 x 14 = 126 completions is not "
                               "divisible by the world size 8: each rank takes an equal slice of them"),
    (2, _batch(3, 3, 9, 1), "train.prompts_per_step x train.group_size = 3 x 3 = 9 completions is not divisible "
                            "by the world size 2"),
    (4, _batch(6, 8, 48, 8), "train.mini_batch_size=48 is not divisible by train.micro_batch_size x world size "
                             "= 8 x 4"),
])
def test_completions_that_do_not_divide_over_ranks_are_refused(compose_cfg, monkeypatch, world, batch, message):
    _ranks(monkeypatch, world)
    assert message in _error(compose_cfg(*batch))


def test_score_position_choices(compose_cfg):
    msg = _error(compose_cfg("advantage=gae", "advantage.score_position=eos"))
    assert "advantage.score_position='eos': expected one of ['after_last', 'last']" in msg


def test_none_reward_policy_checked_against_the_estimator(compose_cfg):
    msg = _error(compose_cfg("advantage=rloo", "train.shaping.none_reward=exclude"))
    assert "train.shaping.none_reward=exclude" in msg and "advantage.name=rloo does not support" in msg
    assert "['dr_grpo', 'grpo']" in msg
    assert "train.shaping.none_reward='drop': expected one of ['exclude', 'mask', 'zero']" in _error(
        compose_cfg("train.shaping.none_reward=drop"))
    for ok in ("mask", "zero", "exclude"):
        prepare(compose_cfg(f"train.shaping.none_reward={ok}"))


def test_reference_requested_with_zero_coefficient(compose_cfg):
    msg = _error(compose_cfg("kl.placement=loss", "kl.coef=0", "kl.reference=true"))
    assert "kl.reference=true with kl.coef=0 (kl.placement=loss)" in msg
    assert "kl.reference=false with kl.coef=0.04" in _error(compose_cfg("kl.reference=false"))


def test_adaptive_controller_needs_reward_placement_and_target(compose_cfg):
    msg = _error(compose_cfg("kl.controller=adaptive"))
    assert "kl.controller=adaptive with kl.placement=loss" in msg
    assert "kl.controller=adaptive needs kl.target" in msg
    prepare(compose_cfg("kl=k1", "kl.controller=adaptive", "kl.target=6"))


def test_bad_option_values_are_collected_together(compose_cfg):
    """Every key's own range (the schema) and every clash between keys, all in one error."""
    msg = _error(compose_cfg("kl.placement=both", "loss.dual_clip=0.5", "advantage.whiten=all", "kl.coef=-1"))
    for part in ("kl.placement='both': expected one of ['reward', 'loss']", "loss.dual_clip=0.5: expected a number > 1",
                 "advantage.whiten='all': expected one of ['global', 'local', 'none']",
                 "kl.coef=-1.0: expected a number >= 0"):
        assert part in msg
    msg = _error(compose_cfg("advantage.std=global", "loss.is_correction.mode=token_mask",
                             "loss.is_correction.high=null"))
    for part in ("advantage.std='global' with advantage.name=grpo", "loss.is_correction.mode=token_mask needs"):
        assert part in msg


def test_deepspeed_dtype_keys_compose_validate_and_refuse_by_name(compose_cfg):
    for stage in ("stage1", "stage2", "stage3"):
        cfg = prepare(compose_cfg(f"zero={stage}", "zero.grad_accum_dtype=fp32", "zero.communication_data_type=bf16",
                                  "train.warm_start.steps=0")).config  # no warm start under ZeRO-3
        assert (cfg.zero.grad_accum_dtype, cfg.zero.communication_data_type) == ("fp32", "bf16")
        assert compose_cfg(f"zero={stage}").zero.grad_accum_dtype is None  # null: DeepSpeed's default
    msg = _error(compose_cfg("zero=stage2", "zero.grad_accum_dtype=fp64", "zero.communication_data_type=float32"))
    assert "zero.grad_accum_dtype='fp64': expected one of [None, 'fp16', 'bf16', 'fp32']" in msg
    assert "zero.communication_data_type='float32': expected one of [None, 'fp16', 'bf16', 'fp32']" in msg
    msg = _error(compose_cfg("zero=none", "zero.grad_accum_dtype=fp32"))
    assert "zero.grad_accum_dtype=fp32 with zero.stage=0: it is a DeepSpeed setting" in msg


def test_a_deepspeed_older_than_the_nonfinite_skip_is_refused(compose_cfg, monkeypatch):
    """Below 0.19.8 DeepSpeed steps the optimiser on a NaN gradient under ZeRO-3 and fp32 ZeRO-1/2 (the slow cases of
    tests/core/test_faults.py ``test_a_nan_loss_in_the_reward_model_loop`` fail there): a ZeRO run is refused before
    any model is built, and the engine refuses it too; the plain engine does not need DeepSpeed."""
    import importlib.metadata

    from core.training import engine

    real = importlib.metadata.version
    installed = {"deepspeed": "0.19.7"}
    monkeypatch.setattr(importlib.metadata, "version", lambda name: installed.get(name) or real(name))
    msg = _error(compose_cfg("zero=stage2"))
    assert ("zero.stage=2: DeepSpeed 0.19.7 is installed and ZeRO needs deepspeed>=0.19.8 (pyproject.toml): older "
            "releases step the optimiser on a non-finite gradient") in msg and "or train with zero=none" in msg
    with pytest.raises(RuntimeError, match="DeepSpeed 0.19.7 is installed"):
        engine.DeepSpeedEngine(torch.nn.Linear(2, 2), None, 1, 1, None, 1, False)
    prepare(compose_cfg("zero=none"))
    installed["deepspeed"] = engine.NONFINITE_SKIP_DEEPSPEED
    prepare(compose_cfg("zero=stage2"))


@pytest.mark.parametrize("have", ["flash_attention_2", "flash_attention_3"])
def test_flash_attention_is_looked_for_where_transformers_looks(compose_cfg, monkeypatch, have):
    """transformers runs flash_attention_3 from the flash-attn-3 package (``flash_attn_interface`` in 5.17), not from
    flash-attn's ``flash_attn``: the check asks transformers' own ``is_flash_attn_N_available``, so flash-attn alone
    does not pass FA3 and FA3 alone passes without flash-attn. Its answer is set here (no CUDA on this machine); the
    model loaders ask the same before loading."""
    from transformers import utils

    from core.models.loading import require_attention

    for n in ("2", "3"):
        monkeypatch.setattr(utils, f"is_flash_attn_{n}_available", lambda n=n: have.endswith(n))
    other = "flash_attention_3" if have == "flash_attention_2" else "flash_attention_2"
    prepare(compose_cfg(f"model.attn_implementation={have}", "model.dtype=bfloat16"))
    version = other[-1]
    want = (f"model.attn_implementation={other}: transformers {transformers.__version__} finds no usable "
            f"flash-attention {version} here (transformers.utils.is_flash_attn_{version}_available() is false")
    assert want in _error(compose_cfg(f"model.attn_implementation={other}", "model.dtype=bfloat16"))
    require_attention(have)
    with pytest.raises(ImportError, match=r"flash-attn-3 \(flash-attention's hopper/ build" if version == "3" else
                       r"flash-attn \(the gpu extra"):
        require_attention(other)
