"""``python -m recipes.plan``, memory side: the model states split as DeepSpeed's estimators sum them, the KV cache
vLLM is left with, the verdict on recipes that do not fit after an override, the knobs measured and ranked, the JSON
and the figure, and bad input refused before any model is built."""
from __future__ import annotations

import json

import pytest
import torch

from core.config.schema import ZeroConfig, node
from core.errors import InputError
from core.planning import memory, states
from core.planning.states import GiB
from recipes import plan as plan_cli
from recipes.plan import measured, plan

TINY_RL = ["recipe=tiny_math_grpo", "data.max_prompt_tokens=48"]
RM_4090_8192 = ["recipe=openrlhf_rm_llama3_8b_4090", "train.max_len=8192"]


class _Model(torch.nn.Module):
    """Two trained layers and one frozen (LoRA's base stands for it): 10 x 10 + 10, 10 x 20 + 20 trained; 20 x 5 + 5
    frozen; the largest layer owns 220 parameters."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(10, 10), torch.nn.Linear(10, 20), torch.nn.Linear(20, 5)
        self.c.requires_grad_(False)


@pytest.mark.parametrize("stage, opt, param", [(0, False, False), (1, False, False), (1, True, False),
                                               (2, False, False), (2, True, False), (3, False, False),
                                               (3, True, False), (3, True, True)])
def test_state_parts_sum_to_deepspeeds_estimate_and_split_it_as_its_comment_says(stage, opt, param):
    """The parts add up to DeepSpeed's own figure (plus the frozen weights' 2 bytes), and the gradients are the
    6 bytes per trained parameter (bf16 + fp32) its ZeRO-2 estimator's comment counts, sharded from stage 2."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    zero, g, n, frozen = node(ZeroConfig, stage=stage, offload_optimizer=opt, offload_param=param), 4, 330, 105
    parts = states.state_parts(_Model(), zero, g)
    want = {3: lambda: estimate_zero3_model_states_mem_needs(n, 220, g, cpu_offload=opt, cpu_offload_params=param)[1],
            2: lambda: estimate_zero2_model_states_mem_needs(n, g, cpu_offload=opt)[1],
            1: lambda: 4 * n + (0 if opt else 16 * n // g), 0: lambda: 20 * n}[stage]()
    assert parts["frozen"] == 2 * frozen // (g if stage == 3 else 1)
    assert sum(parts.values()) - parts["frozen"] == want
    assert parts["gradients"] == (0 if opt and stage >= 2 else {0: 6 * n, 1: 2 * n + (0 if opt else 4 * n // g),
                                                                 2: 6 * n // g, 3: 6 * n // g}[stage])
    assert min(parts.values()) >= 0


def test_kv_cache_of_qwen2_5_7b_and_what_a_larger_reservation_leaves():
    """KV per token from the model config, 2 x 28 layers x 4 KV heads x 128 x 2 bytes (Qwen2.5-7B's config.json),
    halved per GPU by TP 2; a larger gpu_memory_utilization leaves more sequences of 1024 + 8192 tokens."""
    from recipes.probe import prepared_config

    def kv(*extra):  # the whole card's fraction (stock vLLM); the recipe's own meaning, free: the next test
        prepared = prepared_config(["recipe=simplerl_zoo_7b", "rollout.vllm.gpu_memory_utilization_of=card", *extra])
        return memory.kv_cache(prepared.config, prepared.plan)

    base, more = kv(), kv("rollout.vllm.gpu_memory_utilization=0.85")
    assert base["kv_bytes_per_token"] == 2 * 28 * 4 * 128 * 2 == 2 * base["kv_bytes_per_token_per_gpu"]
    assert base["tokens_per_sequence"] == 1024 + 8192 and base["engines"] == 8
    assert base["reservation_bytes"] == int(0.75 * 79.65 * GiB)
    assert base["sequences"] == base["kv_bytes"] // (base["kv_bytes_per_token_per_gpu"] * 9216) > 0
    gained = more["reservation_bytes"] - base["reservation_bytes"]
    assert more["kv_bytes"] - base["kv_bytes"] == gained and more["sequences"] > base["sequences"]


def test_free_sizes_the_kv_cache_from_what_the_trainer_leaves_when_the_engine_starts():
    """simplerl_zoo_7b as the source ran it (gpu_memory_utilization_of=free, veRL 0.2's worker): the KV cache is 0.75 x
    what the card keeps free once the trainer's bytes at the engine's start, vLLM's weights and its profile run are in;
    10 GiB more held by the trainer then is 7.5 GiB less KV cache; the reservation is the parts' sum."""
    from recipes.probe import prepared_config

    prepared = prepared_config(["recipe=simplerl_zoo_7b"])
    light, heavy = (memory.kv_cache(prepared.config, prepared.plan, held * GiB) for held in (10, 20))
    card = int(79.65 * GiB)
    assert light["fraction_of"] == "free" and light["weights_bytes"] == 7_615_616_512 * 2 // 2  # Qwen2.5-7B, TP 2
    assert light["kv_bytes"] == int(0.75 * (card - 10 * GiB - light["weights_bytes"] - light["activation_bytes"]))
    assert abs(light["kv_bytes"] - heavy["kv_bytes"] - 0.75 * 10 * GiB) <= 1
    assert light["reservation_bytes"] == sum(light[k] for k in ("weights_bytes", "activation_bytes",
                                                                "cuda_graph_bytes", "kv_bytes"))
    assert heavy["sequences"] < light["sequences"]


def test_the_4090_reward_model_at_8192_tokens_does_not_fit():
    """OpenRLHF issue #354's 6 x RTX 4090 at max_len 8192 with the recipe's ZeRO-2: the frozen 8B base stays whole on
    every GPU (2 bytes x 7.5B, LM head gone, score head kept) and 8192-token pairs' activations come on top."""
    from core.models.shapes import local_config
    from core.planning.model_figures import figures

    out = plan(RM_4090_8192, knobs=False)
    mem = out["memory"]
    assert not out["fits"] and mem["verdict"] == "does not fit" and mem["short_bytes"] > 1 * GiB
    c = local_config("OpenRLHF/Llama-3-8b-sft-mixture")
    base = figures(c).params - c.vocab_size * c.hidden_size + c.hidden_size  # no LM head; the frozen original score
    parts = mem["phases"]["rm_update"]
    assert parts["weights"] == 2 * base and 0 < parts["lora"] < 1 * GiB
    assert parts["activations"] > 5 * GiB and out["per_gpu_gib"] == pytest.approx(mem["totals"]["rm_update"] / GiB)
    assert sum(parts.values()) == mem["per_gpu_bytes"] > out["hardware"]["memory_gib"] * GiB


@pytest.mark.slow
def test_the_4090_knobs_are_the_articles_advice_ranked_by_measured_memory():
    """Each knob re-probed: ZeRO-3 and max_len 4096 (the maintainer's advice) make it fit; the list is sorted by the
    figure each gives, and each figure is the plan of the recipe with that override."""
    out = plan(RM_4090_8192, knobs=True)
    knobs = {k["knob"]: k for k in out["knobs"]}
    assert knobs["zero_stage"]["overrides"] == ["zero=stage3"] and knobs["zero_stage"]["verdict"] != "does not fit"
    assert knobs["shorter_lengths"]["overrides"] == ["train.max_len=4096"]
    assert knobs["shorter_lengths"]["verdict"] != "does not fit"
    figures = [k["per_gpu_bytes"] for k in out["knobs"] if "refused" not in k]
    assert figures == sorted(figures) and figures[0] < out["memory"]["per_gpu_bytes"]
    assert "lora" not in knobs and "gradient_checkpointing" not in knobs  # the recipe has both already


@pytest.mark.slow
def test_simplerl_zoo_7b_with_32k_responses_does_not_fit():
    """SimpleRL-Zoo 7B as published fits its 16 H100s; with 32768-token responses its no-grad log-prob chunk of 10
    rows does not, and halving that chunk is among the knobs that help."""
    assert plan(["recipe=simplerl_zoo_7b"], knobs=False)["fits"]
    out = plan(["recipe=simplerl_zoo_7b", "rollout.max_new_tokens=32768", "rollout.vllm.max_model_len=33792"])
    assert not out["fits"] and out["memory"]["peak_phase"] == "logprobs"
    better = [k["knob"] for k in out["knobs"] if k.get("per_gpu_bytes", 1 << 62) < out["memory"]["per_gpu_bytes"]]
    assert "logprob_micro_batch" in better and "shorter_lengths" in better


def test_knobs_are_measured_ranked_and_each_the_plan_of_its_override():
    """A tiny reward model on a card too small for it: every knob it can take is re-probed, the list is sorted by the
    per-GPU figure, and a knob's figure is exactly what the plan of the recipe with that override says."""
    base = ["recipe=tiny_rm", "hardware.memory_gib=0.5"]
    out = plan(base)
    assert out["verdict"] == "does not fit" and out["knobs"]
    figures = [k["per_gpu_bytes"] for k in out["knobs"]]
    assert figures == sorted(figures)
    shorter = next(k for k in out["knobs"] if k["knob"] == "shorter_lengths")
    assert shorter["overrides"] == ["train.max_len=32"]
    again = plan(base + shorter["overrides"], knobs=False)
    assert again["memory"]["per_gpu_bytes"] == shorter["per_gpu_bytes"]
    assert again["memory"]["phases"]["rm_update"]["activations"] < out["memory"]["phases"]["rm_update"]["activations"]


def test_phase_totals_are_the_probes_peak_plus_the_overhead():
    prepared, report = measured(TINY_RL)
    mem = memory.breakdown(prepared.config, prepared.plan, report)
    for name, parts in mem["phases"].items():
        extra = parts["cuda_context"] + parts["nccl"] + parts["zero_buckets"] + parts["fragmentation"]
        assert mem["totals"][name] - extra == report["phases"][name]["peak_bytes"]
        assert parts["fragmentation"] == int(memory.FRAGMENTATION * report["phases"][name]["peak_bytes"])
    assert mem["verdict"] == "fits" and mem["kv_cache"] is None  # the tiny recipe generates with HF


def test_json_has_the_scripts_keys_and_plot_writes_a_png(tmp_path, capsys):
    png = tmp_path / "plan.png"
    plan_cli.main([*TINY_RL, "--json", "--plot", str(png)])
    out = json.loads(capsys.readouterr().out)
    assert out["fits"] is True and out["per_gpu_gib"] > 0 and out["step_seconds"] > 0 and out["run_hours"] > 0
    assert {"memory", "time", "assumptions"} <= set(out) and "knobs" not in out  # a fitting plan measures none
    assert any(name == "memory.cuda_context_gib" for name, _, _ in out["assumptions"])
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 10_000


@pytest.mark.parametrize("overrides, says", [
    (["recipe=simplerl_zoo_7b", "hardware=tpu_v9"], "hardware=tpu_v9: no such hardware; available: a100_80g_1x8"),
    (["recipe=simplerl_zoo_7b", "model.name_or_path=org/unknown-7b"],
     "model.name_or_path=org/unknown-7b: no local config.json of that checkpoint; known: OpenRLHF/"),
    (["recipe=simplerl_zoo_7b", "hardware=rtx4090_24g_1x6"],
     "layout.learner_gpus + layout.rollout_gpus = 16 + 0 = 16 GPUs but hardware=rtx4090_24g_1x6 has 1 x 6 = 6"),
    (["recipe=simplerl_zoo_7b", "hardware=rtx4090_24g_1x6"],
     "layout.gpus_per_node=8 but hardware=rtx4090_24g_1x6 has 6 GPUs per node"),
    (["recipe=simplerl_zoo_7b", "hardware=h100_80g_1x4", "rollout.vllm.tensor_parallel_size=8"],
     "rollout.vllm.tensor_parallel_size=8 is wider than a node of hardware=h100_80g_1x4 (4 GPUs)"),
], ids=["hardware", "model", "gpus", "gpus-per-node", "tp"])
def test_bad_input_is_refused_before_any_model_is_built(overrides, says, monkeypatch):
    import recipes.probe

    monkeypatch.setattr(recipes.probe, "probe_prepared", lambda *a, **k: pytest.fail("a model was built"))
    with pytest.raises(InputError) as e:
        plan(overrides)
    assert says in str(e.value)
