"""The vLLM engine. On CPU: output conversion, and the engine itself on a recording double of ``vllm.LLM``
(``tests/vllm_double.py``) under DeepSpeed ZeRO-3 on 2 gloo ranks (``tests/vllm_worker.py``): the weight push,
tensor-parallel groups and sleep mode. On a GPU (``gpu`` marker): real vLLM against the ``hf`` engine."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from core.config import schema
from core.rollout.batch import from_token_lists
from core.rollout.vllm import VLLMRollout, _chosen_logprob, gather_in_group, tp_groups
from tests.vllm_double import completion

WORKER = Path(__file__).with_name("vllm_worker.py")
TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 64, "tie_word_embeddings": True}


def test_vllm_outputs_become_a_rollout_with_the_shared_layout():
    # two prompts; the first stops on EOS (id 1), the second is cut at 3 tokens
    roll = from_token_lists([[5, 6], [7]], [[9, 1], [9, 8, 9]], [[-0.5, -0.25], [-1.0, -2.0, -3.0]], [1], 0)
    assert roll.input_ids.tolist() == [[5, 6, 9, 1, 0], [0, 7, 9, 8, 9]]
    assert roll.response_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert roll.finish_reason == ["stop", "length"]
    assert roll.logprobs.tolist() == [[-0.5, -0.25, 0.0], [-1.0, -2.0, -3.0]]


def test_chosen_logprob_reads_the_sampled_token():
    step = {4: SimpleNamespace(logprob=-0.25), 7: SimpleNamespace(logprob=-3.0)}
    assert _chosen_logprob(step, 4) == -0.25 and _chosen_logprob(step, 7) == -3.0


def test_tensor_parallel_groups_are_consecutive_ranks_as_in_trl():
    assert tp_groups(8, 2) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert tp_groups(4, 4) == [[0, 1, 2, 3]]
    assert tp_groups(2, 1) == [[0], [1]]
    prompts = [[1, 2], [3]]
    assert gather_in_group(prompts, None) == (prompts, slice(0, 2))  # no group: this rank's prompts alone


def test_the_real_engine_refuses_a_machine_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        VLLMRollout(None, None, schema.node(schema.RolloutConfig, {"vllm": {}}))


@pytest.fixture(autouse=True)
def _rng_put_back():
    """The double seeds the process's generators when an ``LLM`` is built, as vLLM's worker does: the tests of this
    file that build one in this process put them back for the tests after them."""
    from core.training.checkpoint import rng_state, set_rng_state

    state = rng_state()
    yield
    set_rng_state(state)


class _FakeDist:
    """``torch.distributed`` as a single process sees it before the engine starts a world of one; records calls."""

    def __init__(self):
        self.calls, self.env = [], {}

    def is_initialized(self):
        return bool(self.env)

    def init_process_group(self, backend):
        self.calls.append(("init", backend))
        self.env = {k: os.environ[k] for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")}

    def get_rank(self):
        return 0

    def get_world_size(self):
        return 1

    def barrier(self):
        self.calls.append(("barrier",))


@pytest.mark.parametrize("port", ["", "0"])
def test_one_process_world_binds_the_devices_gpu_a_free_port_and_waits_once_vllm_is_built(monkeypatch, port):
    """``device=cuda:3`` in one process: LOCAL_RANK 3 (vLLM's worker binds cuda:LOCAL_RANK), a free MASTER_PORT
    (not a fixed one that a second job on the node holds), and the barrier TRL 1.16 runs after the LLM is built."""
    import socket

    from core.rollout import vllm as engine
    from tests import vllm_double
    from tests.helpers import tiny_model
    from tests.vllm_double import RecordingLLM

    fake, built = _FakeDist(), []
    monkeypatch.setattr(engine, "dist", fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)  # distributed.init set cuda:3 current
    # what had happened when the LLM was built
    monkeypatch.setattr(vllm_double, "LLM", lambda **kw: built.append(list(fake.calls)) or RecordingLLM(**kw))
    for key in ("MASTER_ADDR", "RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MASTER_PORT", port)
    model, tok = tiny_model()
    with socket.socket() as taken:  # the port the engine used to fix, held by another job
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            taken.bind(("", 29517))
            taken.listen()
        except OSError:
            pass  # someone else holds it already
        VLLMRollout(model, tok, schema.node(schema.RolloutConfig, {"vllm": {}}), vllm=vllm_double)
    assert fake.env["LOCAL_RANK"] == "3" and fake.env["RANK"] == "0" and fake.env["WORLD_SIZE"] == "1"
    assert int(fake.env["MASTER_PORT"]) not in (0, 29517)
    assert built == [[("init", "nccl")]] and fake.calls == [("init", "nccl"), ("barrier",)]


def _llm_kwargs(monkeypatch, vllm_node: dict, free: int = 0, total: int = 80 * 2 ** 30) -> dict:
    """The keyword arguments ``vllm.LLM`` gets from a one-process engine on the tiny model, on a faked GPU with
    ``free`` of ``total`` bytes free (``torch.cuda.mem_get_info``), named as an H100."""
    from core.rollout import vllm as engine
    from tests import vllm_double
    from tests.helpers import tiny_model

    built = []
    monkeypatch.setattr(engine, "dist", _FakeDist())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, total))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(vllm_double, "LLM", lambda **kw: built.append(kw) or vllm_double.RecordingLLM(**kw))
    monkeypatch.setenv("MASTER_PORT", "")
    model, tok = tiny_model()
    VLLMRollout(model, tok, schema.node(schema.RolloutConfig, {"vllm": vllm_node}), vllm=vllm_double)
    (kwargs,) = built
    return kwargs


def test_card_passes_the_fraction_of_the_whole_gpu_as_before(monkeypatch):
    """``card`` (the default, stock vLLM's and TRL's meaning): gpu_memory_utilization as configured, no KV size, and
    every argument as the engine passed before the switch existed; the free memory is never read."""
    kwargs = _llm_kwargs(monkeypatch, {"gpu_memory_utilization": 0.45}, free=-1)
    assert {k: v for k, v in kwargs.items() if k != "model"} == {
        "dtype": "bfloat16", "gpu_memory_utilization": 0.45, "tensor_parallel_size": 1, "max_model_len": None,
        "distributed_executor_backend": "external_launcher", "seed": 0, "logprobs_mode": "processed_logprobs",
        "enable_prefix_caching": True, "enable_sleep_mode": False}


def test_free_gives_vllm_the_kv_cache_verl_would_have_sized(monkeypatch):
    """``free``: veRL 0.2's worker sizes the KV cache as the fraction of what is free once vLLM's weights and profile
    run are in. On a faked H100 with 60 of 80 GiB free: the tiny model's bf16 weights (its parameters counted here,
    tied embedding once) and the profile forward's estimate (4096 tokens, 1024 sequences' fp32 logits: vLLM's default
    on a GPU this size), then 0.75 of the rest as ``kv_cache_memory_bytes``; gpu_memory_utilization is the share of
    the card the engine takes, so vLLM's start-up check of that much free memory passes."""
    GiB, free = 2 ** 30, 60 * 2 ** 30
    kwargs = _llm_kwargs(monkeypatch, {"gpu_memory_utilization": 0.75, "gpu_memory_utilization_of": "free",
                                       "max_num_batched_tokens": 4096}, free=free)
    from tests.helpers import tiny_model

    model, _ = tiny_model()
    c = model.config
    weights = 2 * sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    activations = 4096 * (2 * c.hidden_size + 3 * c.intermediate_size) * 2 + 1024 * c.vocab_size * 4
    kv = int(0.75 * (free - weights - activations))
    assert kwargs["kv_cache_memory_bytes"] == kv and 0.74 * free < kv < 0.75 * free
    taken = kwargs["gpu_memory_utilization"] * 80 * GiB
    assert weights + activations + kv - 80 * GiB * 1e-4 < taken <= weights + activations + kv
    assert taken <= free  # vLLM's request_memory: free >= gpu_memory_utilization x the card


def test_free_refuses_a_gpu_with_no_room_left_for_the_kv_cache(monkeypatch):
    with pytest.raises(RuntimeError, match="gpu_memory_utilization_of=free: .* nothing left for its KV cache"):
        _llm_kwargs(monkeypatch, {"gpu_memory_utilization_of": "free"}, free=1024)


# --- the engine on the double, ZeRO-3 on 2 CPU ranks ------------------------------------------------------


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """What each rank of ``tests/vllm_worker.py`` recorded, and the tiny model unpartitioned."""
    from core.models.loading import build_tiny_model_dir, load_causal_lm
    from tests.vllm_worker import MODEL

    model_dir = str(build_tiny_model_dir("qwen2", TINY, 0))
    out = tmp_path_factory.mktemp("vllm") / "out"
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
                           str(WORKER), model_dir, str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = [torch.load(f"{out}.rank{r}.pt", weights_only=False) for r in (0, 1)]
    return got, load_causal_lm(model_dir, MODEL)


@pytest.mark.distributed
def test_zero3_push_sends_every_parameter_whole_with_the_unpartitioned_values(ranks):
    got, full = ranks
    params = dict(full.named_parameters())  # tied weights once: lm_head.weight is embed_tokens.weight
    assert "lm_head.weight" in full.state_dict() and "lm_head.weight" not in params and len(params) == 26
    for rank in got:
        assert rank["whole_at_start"] == 0  # ZeRO-3 partitioned every parameter
        first = rank["tp"]["loads"][:len(params)]
        assert [load["name"] for load in first] == list(params)  # each once, in order, under its HF name
        for load in first:
            assert load["shape"] == tuple(params[load["name"]].shape)
            assert torch.equal(load["values"], params[load["name"]].detach())


@pytest.mark.distributed
def test_zero3_push_gathers_one_parameter_at_a_time_and_generation_gathers_nothing(ranks):
    got, full = ranks
    numel = {name: p.numel() for name, p in full.named_parameters()}
    for rank in got:
        for key in ("tp", "solo"):
            # while vLLM loads a parameter, that parameter alone is whole on the rank
            assert [load["probe"] for load in rank[key]["loads"]] == [numel[load["name"]] for load in rank[key]["loads"]]
            assert rank[key]["generate_probes"] == [0]  # no whole-model gather around vLLM's generate


@pytest.mark.distributed
def test_push_after_an_update_equals_deepspeeds_consolidated_weights(ranks):
    got, full = ranks
    n = len(dict(full.named_parameters()))
    consolidated = got[0]["consolidated"]
    second = [rank["tp"]["loads"][n:] for rank in got]
    assert len(second[0]) == len(second[1]) == n
    moved = 0
    for a, b in zip(*second):
        assert a["name"] == b["name"]
        assert torch.equal(a["values"], consolidated[a["name"]]) and torch.equal(b["values"], a["values"])
        moved += not torch.equal(a["values"], full.get_parameter(a["name"]).detach())
    assert moved == n  # the optimiser step changed every parameter: the push carries the new values


@pytest.mark.distributed
def test_tensor_parallel_group_generates_all_its_prompts_and_each_rank_keeps_its_own(ranks):
    from tests.vllm_worker import PROMPTS, SAMPLING

    got, _ = ranks
    for r, rank in enumerate(got):
        tp = rank["tp"]
        assert tp["collective"] and tp["kwargs"]["tensor_parallel_size"] == 2
        assert tp["kwargs"]["seed"] == 0  # the engine's seed, one per group (TRL's)
        assert tp["prompts"] == [PROMPTS[0] + PROMPTS[1]]  # rank order, unequal counts
        assert len(set(tp["seeds"][0])) == 5  # every request its own seed, counted alike on the group's ranks
        _check_own_completions(tp, PROMPTS[r], slice(3 * r, 3 + 2 * r), SAMPLING.max_new_tokens)
        solo = rank["solo"]
        assert not solo["collective"] and solo["kwargs"]["seed"] == r  # no group: each rank its own stream
        assert solo["prompts"] == [PROMPTS[r]]
        _check_own_completions(solo, PROMPTS[r], slice(0, len(PROMPTS[r])), SAMPLING.max_new_tokens)
        assert rank["refused_tp4"]  # 4 does not divide 2 ranks
    assert got[0]["tp"]["seeds"] == got[1]["tp"]["seeds"] and got[0]["tp"]["outputs"] == got[1]["tp"]["outputs"]
    assert not set(got[0]["solo"]["seeds"][0]) & set(got[1]["solo"]["seeds"][0])  # two engines: two streams


def _check_own_completions(rec: dict, prompts: list[list[int]], mine: slice, max_tokens: int) -> None:
    """This rank's rows of the double's only generate call, sampled at temperature 1 with the seeds it was sent."""
    want = [completion(p, max_tokens, 1.0, seed, rec["vocab"]) for p, seed in zip(prompts, rec["seeds"][0][mine])]
    assert rec["response_ids"] == [tokens for tokens, _ in want]
    assert rec["logprobs"] == [lps for _, lps in want]  # multiples of 1/128: exact in float32


@pytest.mark.distributed
def test_a_batch_seed_seeds_each_row_by_its_index_and_unread_logprobs_are_not_asked_for(ranks):
    """``Sampling(seed=7, first_row=10 r)`` on rank r's engine: row i's request carries ``sampling_seed(7, 10 r + i)``;
    with ``logprobs=False`` vLLM is asked for none (``SamplingParams.logprobs`` None) and the batch holds None."""
    from core.rollout import sampling_seed
    from tests.vllm_worker import PROMPTS

    got, _ = ranks
    for r, rank in enumerate(got):
        seeded = rank["seeded"]
        want = [sampling_seed(7, 10 * r + i) for i in range(len(PROMPTS[r]))]
        assert seeded["seeds"] == want and [p.seed for p in seeded["params"]] == want
        assert all(p.logprobs is None for p in seeded["params"]) and seeded["logprobs"] is None
        assert seeded["response_ids"] == [completion(p, 3, 1.0, s, rank["solo"]["vocab"])[0]
                                          for p, s in zip(PROMPTS[r], want)]


@pytest.mark.distributed
def test_the_loops_tensor_parallel_ranks_sample_alike_and_a_resume_samples_as_the_whole_run(ranks):
    """recipes/rl.py with ``rollout.engine=vllm`` at tensor_parallel_size=2 on 2 ranks (one engine), the double
    sampling as vLLM 0.31.0 does (tests/vllm_double.py: an unseeded request draws its seed from its rank's numpy
    generator, which the loop seeds per rank). Every generate of every run (2 steps; 1 step; that one resumed to
    2): both ranks' engine got the same prompts and seeds and generated the same tokens. The training rollouts
    sampled (not the greedy tokens); step 1 of both runs and step 2 of the whole and the resumed run are the same."""
    got, _ = ranks
    loops = [rank["loop"] for rank in got]
    for run in ("whole", "first", "resumed"):
        calls = loops[0][run]["outputs"]
        assert len(calls) == {"whole": 4, "first": 3, "resumed": 2}[run]  # evaluation, steps, evaluation
        for key in ("outputs", "prompts", "seeds"):
            assert loops[0][run][key] == loops[1][run][key], (run, key)
    whole, first, resumed = (loops[0][run] for run in ("whole", "first", "resumed"))
    for key in ("outputs", "prompts", "seeds"):
        assert whole[key][1] == first[key][1] and whole[key][2] == resumed[key][0], key
    greedy = [[completion(p, 4, vocab=whole["vocab"])[0] for p in call] for call in whole["prompts"]]
    assert whole["outputs"][0] == greedy[0] and whole["outputs"][3] == greedy[3]  # evaluation: greedy
    for step in (1, 2):
        assert len(whole["outputs"][step]) == 16  # 4 prompts x 4, both ranks' rows
        assert whole["outputs"][step] != greedy[step]  # sampled


@pytest.mark.distributed
def test_sleep_mode_follows_trls_sequence(ranks):
    got, full = ranks
    push = [("load_weights", name) for name, _ in full.named_parameters()] + [("reset_prefix_cache",)]
    for rank in got:
        tp = rank["tp"]
        assert tp["kwargs"]["enable_sleep_mode"] and tp["kwargs"]["logprobs_mode"] == "processed_logprobs"
        assert tp["events"] == [
            ("sleep", 2),  # right after it is built
            ("wake_up", ("weights",)), *push,  # each push wakes the weights first
            ("wake_up", ("kv_cache",)), ("generate", 5), ("sleep", 2),  # each generate wakes the cache, then sleeps
            ("wake_up", ("weights",)), *push,
        ]
        assert rank["refused_asleep"]  # level 2 discarded the weights: generate waits for a push
        assert rank["solo"]["events"] == [*push, ("generate", len(tp["response_ids"]))]  # no sleep: no wake
        assert not rank["solo"]["kwargs"]["enable_sleep_mode"]


# --- real vLLM ----------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("vllm") is None,
                    reason="needs a CUDA GPU and the gpu extra (vllm)")
def test_vllm_after_a_push_matches_hf_greedy_and_logprobs_match_a_forward():
    """Sleep mode on (TRL's sequence), the weights moved away from the checkpoint vLLM loaded, pushed through
    the plain engine: greedy tokens equal ``hf``'s on the moved model, log-probs equal a forward's."""
    from core.models.logprobs import response_logprobs
    from core.rollout import Sampling, build_rollout
    from core.training.backend import Backend
    from tests.helpers import tiny_model

    model, tok = tiny_model()
    model = model.cuda()
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in ["1+2=", "10+20=", "99+1="]]
    sp = Sampling(max_new_tokens=8, temperature=0.0)
    vllm = build_rollout("vllm", model, tok, schema.node(schema.RolloutConfig, {
        "vllm": {"dtype": "float32", "enable_sleep_mode": True}}))
    with torch.no_grad():
        gen = torch.Generator(device="cuda").manual_seed(0)
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen, device="cuda"))
    optim = schema.node(schema.OptimConfig, {"optimizer": {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.1}})
    backend = Backend(schema.node(schema.ZeroConfig, stage=0), torch.device("cuda"), model.dtype)
    engine = backend.train_engine(model, optim, 1, 1, 1)
    vllm.sync_weights(engine)
    hf = build_rollout("hf", model, tok, schema.node(schema.RolloutConfig))
    a, b = vllm.generate(prompts, sp), hf.generate(prompts, sp)
    assert a.response_ids.tolist() == b.response_ids.tolist()
    with torch.no_grad():
        lp, _ = response_logprobs(model, a.input_ids, a.attention_mask, a.prompt_length)
    m = a.response_mask.bool()
    torch.testing.assert_close(lp[m], a.logprobs[m], atol=1e-3, rtol=1e-3)
