"""core/planning/step_time.py: each phase answers to the setting that drives it, on stored probe reports (no
probing)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.errors import InputError
from bench import plan_calibration as C
from core.planning.model_figures import figures
from core.planning.step_time import EFFICIENCY, estimate, flop_scale

REPORTS = Path(__file__).with_name("reports")


def _time(key: str, extra: list[str], reading: int = 0, efficiency=None):
    from recipes.probe import prepared_config

    case = next(c for c in C.CASES if c.key == key)
    r = case.readings[reading]
    report = json.loads((REPORTS / C.report_name(case, r)).read_text())
    prepared = prepared_config(C.overrides(case, r) + extra)
    return estimate(prepared.config, prepared.plan, report, efficiency)


def test_parameter_counts_match_the_checkpoints():
    """Counted from config.json alone: Meta-Llama-3-8B has 8,030,261,248 parameters (its safetensors index), Qwen2.5-7B
    7.62B (its model card: "Number of Parameters: 7.61B")."""
    from core.models.shapes import local_config

    assert figures(local_config("meta-llama/Meta-Llama-3-8B")).params == 8_030_261_248
    assert abs(figures(local_config("Qwen/Qwen2.5-7B")).params / 7.61e9 - 1) < 0.005


def test_flop_scale_is_linear_plus_causal_attention():
    from core.models.shapes import local_config

    fig = figures(local_config("Qwen/Qwen2.5-7B"))
    at_cap = flop_scale(fig, 9216, 9216)
    assert 0.8 < at_cap < 1  # the causal half of the attention the probe counts as a full square
    # a short row costs its tokens' share of the matrix FLOPs and little attention
    mat, att = 2 * fig.matmul_params, fig.layers * fig.attn_dim
    want = 1024 / 9216 * (mat + 2 * att * 1024) / (mat + 4 * att * 9216)
    assert flop_scale(fig, 9216, 1024) == pytest.approx(want, rel=1e-12)


def test_compute_phases_scale_with_mfu_and_hbm_and_every_assumption_is_listed():
    """A training pass on the device is its matrix products at mfu plus its other ops' traffic at hbm: halving each
    adds that part once more, so the two additions make up the whole (the 8B reward model under ZeRO-2 is
    device-bound; under its ZeRO-3, micro-batches of one pair, the per-module hooks bind the host longer)."""
    base = _time("open_instruct_rm_8b", ["zero=stage2"])
    mfu, hbm = (_time("open_instruct_rm_8b", ["zero=stage2"], efficiency={k: EFFICIENCY[k][0] / 2})
                for k in ("mfu", "hbm"))
    assert (mfu.phases["update"] - base.phases["update"]) + (hbm.phases["update"] - base.phases["update"]) \
        == pytest.approx(base.phases["update"], rel=1e-9)
    assert mfu.phases["zero_comm"] == pytest.approx(base.phases["zero_comm"], rel=1e-9)
    names = {a[0] for a in base.assumptions}
    assert {f"efficiency.{k}" for k in EFFICIENCY} <= names and "train.expected_len" in names
    assert base.run_hours == pytest.approx(base.steps * base.step_seconds / 3600)


def test_bad_efficiency_is_refused():
    with pytest.raises(InputError, match="efficiency nope"):
        _time("open_instruct_rm_8b", [], efficiency={"nope": 0.5})
    with pytest.raises(InputError, match=r"mfu=1.5: expected a fraction in \(0, 1\]"):
        _time("open_instruct_rm_8b", [], efficiency={"mfu": 1.5})


def test_zero3_gathers_weights_zero2_only_reduces_gradients():
    z3, z2 = _time("open_instruct_rm_8b", []), _time("open_instruct_rm_8b", ["zero=stage2"])
    # per micro-step stage 3 moves the weights three times (forward, recompute, backward) and the gradients once;
    # stage 2 the gradients once, and the weights once per optimiser step
    assert z3.phases["zero_comm"] > 2 * z2.phases["zero_comm"] > 0
    # the same passes on the device; ZeRO-3's per-module hooks add host time only
    assert z3.phases["update"] >= z2.phases["update"]


def test_async_generation_overlaps_the_update():
    """Open-Instruct's async mode (rollout.generate_ahead=1): the step is the longer of generation and the rest."""
    t = _time("open_instruct_rlvr_8b", [])
    rest = sum(v for k, v in t.phases.items() if k != "generate")
    assert t.step_seconds == pytest.approx(max(t.phases["generate"], rest))
    sync = _time("open_instruct_rlvr_8b", ["rollout.generate_ahead=0"])
    assert sync.step_seconds == pytest.approx(sum(sync.phases.values()))


def test_layer_by_layer_generation_under_zero3_crawls():
    """TRL #3858: ZeRO-3 without gathering the model for generation all-gathers every layer at every token (their
    bandwidth over 16 waves x 4096 iterations: about 3.4 h here, 5.6x the gathered model's overhead-bound 37 minutes,
    against the issue's ~10 h first step, whose per-layer collectives are latency-bound: docs/planner.md)."""
    whole = _time("open_r1_4xh100", [], reading=1)
    layered = _time("open_r1_4xh100", ["rollout.gather_for_generation=false"], reading=1)
    assert layered.phases["generate"] > 4 * whole.phases["generate"]
    assert layered.phases["generate"] > 2 * 3600


def test_shorter_expected_completions_shorten_every_token_phase():
    cap = _time("simplerl_zoo_7b", [], reading=0)
    short = _time("simplerl_zoo_7b", [], reading=1)
    for phase in ("generate", "logprobs", "update"):
        assert short.phases[phase] < cap.phases[phase] / 2, phase


def test_fp32_communication_moves_twice_the_gradient_bytes():
    """SimpleRL-Zoo reduces its bf16 gradients in fp32 (zero.communication_data_type, veRL's FSDP reduce_dtype): 4
    bytes an element on the wire against 2 in bf16, so its gradient traffic doubles; the weight gathers do not."""
    from core.planning.memory import comm_dtype_bytes

    fp32, bf16 = _time("simplerl_zoo_7b", []), _time("simplerl_zoo_7b", ["zero.communication_data_type=bf16"])
    assert fp32.phases["zero_comm"] > bf16.phases["zero_comm"]
    from recipes.probe import prepared_config

    assert comm_dtype_bytes(prepared_config(["recipe=simplerl_zoo_7b"]).config) == 4
