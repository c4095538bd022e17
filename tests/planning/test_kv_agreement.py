"""One model of vLLM's reservation for the memory side and the time side of ``recipes.plan``: the sequences the time
side decodes at once (core/planning/phases.py ``_concurrency``) are the ones the memory side's KV cache holds
(core/planning/memory.py ``kv_cache``), capped by the same ``max_num_seqs``, for every named recipe that generates
with vLLM and under both meanings of ``gpu_memory_utilization``."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from core.paths import CONF_DIR
from core.planning import memory
from core.planning.phases import _concurrency
from core.planning.states import GiB

REPORTS = Path(__file__).with_name("reports")
RECIPES = sorted(p.stem for p in (CONF_DIR / "recipe").rglob("*.yaml"))
SLOW = {"open_instruct_rlvr_70b"}  # preparing the 70B config takes ~15 s here
# each case prepares two configs (2-5 s): a colocated and a dedicated recipe run in make test, every one in test-slow
FAST = {"simplerl_zoo_7b", "open_r1_grpo_math_7b"}
VLLM_RECIPES = ["open_instruct_grpo_8b", "open_instruct_rlvr_70b", "open_instruct_rlvr_8b", "open_r1_grpo_1_5b",
                "open_r1_grpo_code_1_5b", "open_r1_grpo_codeforces_7b", "open_r1_grpo_distill_1_5b",
                "open_r1_grpo_math_7b", "simplerl_zoo_14b", "simplerl_zoo_32b", "simplerl_zoo_7b"]


@pytest.mark.slow
def test_the_list_is_every_named_recipe_that_generates_with_vllm():
    from recipes.probe import prepared_config

    rl = [n for n in RECIPES if n not in SLOW and not n.startswith(("open_instruct_rm", "openrlhf_rm", "tiny_rm"))]
    engines = {n: prepared_config([f"recipe={n}"]).config.rollout.engine for n in rl}
    assert sorted(n for n, e in engines.items() if e in ("vllm", "vllm_server")) == sorted(set(VLLM_RECIPES) - SLOW)
    assert len(RECIPES) == 17 and engines["tiny_math_grpo"] == "hf"


@pytest.mark.parametrize("fraction_of", ["card", "free"])
@pytest.mark.parametrize("name", [pytest.param(n, marks=[] if n in FAST else [pytest.mark.slow])
                                  for n in VLLM_RECIPES])
def test_time_side_decodes_what_the_memory_sides_kv_cache_holds(name, fraction_of):
    from recipes.probe import prepared_config

    engine = prepared_config([f"recipe={name}"]).config.rollout.engine
    if fraction_of == "free" and engine == "vllm_server":
        pytest.skip("a server's GPU is its own: free is a colocated engine's meaning (refused by the checks)")
    prepared = prepared_config([f"recipe={name}", f"rollout.vllm.gpu_memory_utilization_of={fraction_of}"])
    cfg, plan, held = prepared.config, prepared.plan, 20 * GiB
    kv = memory.kv_cache(cfg, plan, held)
    ctx = SimpleNamespace(cfg=cfg, plan=plan, report={"trainer_bytes_at_vllm_start": held})
    seqs, per_token = memory.max_num_seqs(cfg), kv["kv_bytes_per_token_per_gpu"]
    for tokens in (kv["tokens_per_sequence"], kv["tokens_per_sequence"] // 3):
        slots = _concurrency(ctx, 10 ** 6, tokens)
        if tokens == kv["tokens_per_sequence"]:
            assert slots == max(1, min(seqs, kv["sequences"]))
        if 1 < slots < seqs:  # bound by the KV cache: as many as it holds, and no more
            assert slots * per_token * tokens <= kv["kv_bytes"] < (slots + 1) * per_token * tokens
        else:
            assert slots == seqs or kv["kv_bytes"] < 2 * per_token * tokens
        assert _concurrency(ctx, 3, tokens) == min(3, slots)


def test_the_probe_records_what_the_trainer_holds_when_the_engine_starts():
    """simplerl_zoo_7b's stored report (bench/plan_calibration.py): under ZeRO-3 DeepSpeed has allocated every state
    of the policy when the engine is built, so the trainer holds the policy's model states and the overhead (CUDA
    context, NCCL, buckets), not the reference, which goes onto the device after the engine."""
    from recipes.probe import prepared_config

    report = json.loads((REPORTS / "simplerl_zoo_7b.json").read_text())
    prepared = prepared_config(["recipe=simplerl_zoo_7b"])
    overhead = sum(b for _, b, _ in memory.overhead(prepared.config, prepared.plan, report["hardware"]["gpus"]))
    res = report["resident_bytes"]
    assert report["trainer_bytes_at_vllm_start"] == res["model_states"] + overhead and res["reference"] > 0
    kv = memory.breakdown(prepared.config, prepared.plan, report)["kv_cache"]
    assert kv["free_at_start_bytes"] == int(79.65 * GiB) - report["trainer_bytes_at_vllm_start"]
    assert res["vllm_awake"] == kv["reservation_bytes"]
