"""Issue 36's accounting findings: the probe's verdict carries the overhead the plan adds (one function for both), a
sleeping colocated vLLM keeps its CUDA graphs, and a wider ``zero.communication_data_type`` widens DeepSpeed's
reduction (memory and traffic)."""
from __future__ import annotations

import pytest

from core.planning import memory, states
from core.planning.states import GiB
from recipes.plan import measured
from recipes.probe import prepared_config, probe

TINY_RL = ["recipe=tiny_math_grpo", "data.max_prompt_tokens=48", "zero=stage2", "train.warm_start.steps=0"]


def test_probe_verdict_counts_the_overhead_the_plan_adds():
    """A card between the allocated peak and the plan's total: the probe said it fits; with the CUDA context, the
    buckets and fragmentation it does not, and its totals are the plan's, phase by phase."""
    prepared, report = measured(TINY_RL)
    mem = memory.breakdown(prepared.config, prepared.plan, report)
    card = (report["per_gpu_bytes"] + mem["per_gpu_bytes"]) / 2 / GiB
    tight = probe([*TINY_RL, f"hardware.memory_gib={card}"])
    assert tight["per_gpu_bytes"] < card * GiB < mem["per_gpu_bytes"]
    assert not tight["fits"]
    for name, phase in tight["phases"].items():
        assert phase["peak_bytes"] + phase["overhead_bytes"] == mem["totals"][name]


def test_a_sleeping_vllm_keeps_its_cuda_graphs():
    """vLLM's sleep frees what its CuMemAllocator holds (weights, KV cache); the CUDA graph pool stays."""
    prepared = prepared_config(["recipe=simplerl_zoo_7b", "rollout.vllm.enable_sleep_mode=true"])
    awake, asleep = states.vllm_bytes(prepared.config)
    assert asleep == int(memory.VLLM_CUDA_GRAPHS) and awake > asleep
    kept = prepared_config(["recipe=simplerl_zoo_7b", "rollout.vllm.enable_sleep_mode=false"])
    assert states.vllm_bytes(kept.config) == (awake, awake)


@pytest.mark.parametrize("stage, overlap, comm, want", [
    (2, False, None, 2 * 500_000_000),
    (2, False, "fp32", 2 * 500_000_000 + 4 * 500_000_000),  # the bf16 bucket and its fp32 copy at the reduction
    (2, True, "fp32", 2 * 2 * 500_000_000 + 4 * 500_000_000),  # overlap_comm: two buckets
    (3, False, "fp32", 2 * (500_000_000 + 50_000_000) + 4 * 500_000_000),
    (3, False, "bf16", 2 * (500_000_000 + 50_000_000)),
])
def test_zero_buckets_in_the_communication_dtype(stage, overlap, comm, want):
    extra = [f"zero=stage{stage}", f"zero.communication_data_type={comm or 'null'}", "model.dtype=bfloat16"]
    extra += ["+zero.options.overlap_comm=true"] if overlap else []
    prepared = prepared_config([*TINY_RL, *extra])
    at = {phase: {n: b for n, b, _ in memory.overhead(prepared.config, prepared.plan, 1, phase)}["zero_buckets"]
          for phase in ("update", "logprobs")}
    assert at["update"] == want
    # the copy lives only while a backward reduces: not in a no-grad phase, not when a colocated vLLM starts
    assert at["logprobs"] == want - (4 * 500_000_000 if comm == "fp32" else 0)
