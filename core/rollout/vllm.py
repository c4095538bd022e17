"""vLLM rollout engine (``rollout.engine=vllm``; GPU only, ``pip install -e '.[gpu]'``).

A ``vllm.LLM`` in each trainer process, on that rank's GPU, driven the way TRL 1.16 drives its colocate
mode (``trl/generation/vllm_generation.py``, ``VLLMGeneration``):

- ``distributed_executor_backend="external_launcher"``: vLLM joins the trainer's process group. Prompts go
  in as token ids, one completion per prompt (groups are repeated prompts, as on the other engines).
- Weights (:meth:`VLLMRollout.sync_weights`): every rank pushes into its own vLLM through
  ``model_runner.model.load_weights``, one parameter at a time, from the optimiser engine's
  ``named_full_parameters()``. Under ZeRO-3 that gathers each parameter alone and releases it before the
  next (TRL: ``GatheredParameters([param])`` per parameter), so a rank holds at most one whole parameter
  beyond its shard; the whole-model gather the ``hf`` engine generates under is never entered. Tied
  weights go once, under the first name: ``named_parameters`` skips the tied copy, as in TRL, and vLLM's
  ``load_weights`` skips ``lm_head`` for tied models. The prefix cache is reset after the push.
- Tensor parallelism (``rollout.vllm.tensor_parallel_size`` = k > 1): ranks ``[0..k-1], [k..2k-1], ...``
  form one vLLM instance each (:func:`tp_groups`, ``new_subgroups_by_enumeration`` as in TRL), and every
  rank of a group must send it the same prompts. So each rank's prompts are all-gathered within its group
  and generated together, and each rank keeps its own slice, in order. Counts may differ between ranks;
  TRL slices assuming equal counts. The engine's ``seed`` is ``seed + rank // k`` (TRL: ``process_index // tp``).
- Sampling seeds: every request carries its own ``SamplingParams.seed`` (:func:`core.rollout.batch.row_seeds`: a
  hash of the batch's seed and the row's index among every rank's rows), and a group's ranks send the same list.
  Under ``external_launcher`` each rank of a group runs its own scheduler and sampler in the trainer's process,
  so they must draw alike; unseeded, vLLM 0.31.0 draws from the process's generators, which the loop seeds per
  rank and a resume restores per rank. Seeded, a row's draws depend on nothing else: the ranks agree, and a
  resumed run samples what the uninterrupted one would. vLLM 0.31.0's default GPU runner (Model Runner V2) keys
  its Gumbel noise by ``(seed, position, token)`` (``vllm/v1/worker/gpu/sample/gumbel.py``); an unseeded request
  gets a seed from numpy's global generator when it is added (``sample/states.py`` ``add_request``), so seeds cost
  it nothing per step. The V1 runner (``VLLM_USE_V2_MODEL_RUNNER=0``) draws unseeded rows from the device's default
  generator in one ``exponential_`` and seeded rows one ``torch.Generator`` each, one launch per row per decode
  step (``vllm/v1/sample/ops/topk_topp_sampler.py`` ``random_sample``). Seeding the default generators alike within
  a group for each ``generate`` and restoring each rank's after was the alternative: it depends on the order vLLM
  schedules and admits requests (a resumed run starts with a cold prefix cache) and on which generator the runner
  reads, so it was not taken. A caller without a batch seed (``Sampling.seed`` None) gets one counted from the
  engine's seed, its group and its calls: its ranks agree, a resume does not replay it. docs/vllm.md.
- Sleep mode (``rollout.vllm.enable_sleep_mode``): the engine is built, then put to sleep. Each push first
  wakes the weights (after ``torch.cuda.empty_cache()``). Each ``generate`` wakes the KV cache and sleeps
  again at ``sleep_level``; at 2, TRL's level, weights and KV cache are discarded and the next push
  refills the weights. The training phases get that memory back.

- Memory (:func:`memory_args`, ``rollout.vllm.gpu_memory_utilization_of``): ``card`` passes
  ``gpu_memory_utilization``, the whole GPU's share (stock vLLM, TRL); ``free`` measures the free memory just before
  the build and passes the KV cache veRL 0.2's worker would size from it as ``kv_cache_memory_bytes``.

Log-probs: ``logprobs_mode="processed_logprobs"``, i.e. after temperature (and top-p/top-k) processing,
which equals the ``hf`` engine's temperature-scaled log-probs when top-p = 1 and top-k is off. vLLM is asked for
them (``logprobs=0``: the sampled token's) only when the caller reads them (``Sampling.logprobs``); otherwise the
batch's ``logprobs`` is None.

How far exercised (docs/vllm.md): on CPU, everything above runs against a recording double of
``vllm.LLM`` (``tests/vllm_double.py``) under DeepSpeed ZeRO-3 on 2 gloo ranks. Real vLLM, NCCL and GPUs
have not run it; its ``gpu``-marked test is written for the first GPU.
"""
from __future__ import annotations

import importlib
import math
import os
import socket

import torch
import torch.distributed as dist

from core.errors import InputError
from core.rollout import vllm_memory as vm
from core.rollout.batch import RolloutBatch, Sampling, eos_token_ids, from_token_lists, row_seeds, sampling_seed


def _ensure_process_group(device: torch.device) -> None:
    """``external_launcher`` needs torch.distributed and the rank variables, and vLLM's worker binds
    ``cuda:LOCAL_RANK``: LOCAL_RANK is this rank's resolved device (``device=cuda:N`` in one process is GPU N), as
    TRL 1.16 sets it from the process it runs in. A single process gets a world of one on the MASTER_PORT it was
    given, else a free one (TRL ``ensure_master_addr_port``): a fixed port would collide between jobs on a node."""
    if device.type == "cuda":
        os.environ["LOCAL_RANK"] = str(device.index)
    if dist.is_initialized():  # vLLM reads RANK whatever the group (DeepSpeed's world of one sets none)
        os.environ.setdefault("RANK", str(dist.get_rank()))
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if os.environ.get("MASTER_PORT", "").strip().lower() in ("", "0", "auto"):
        os.environ["MASTER_PORT"] = str(free_port())
    os.environ.update(RANK="0", WORLD_SIZE="1")
    os.environ.setdefault("LOCAL_RANK", "0")
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")


def free_port() -> int:
    """A TCP port nothing listens on now (the OS's pick)."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def tp_groups(world: int, tp: int) -> list[list[int]]:
    """Consecutive ranks in groups of ``tp``: world 8, tp 2 gives [0, 1], [2, 3], [4, 5], [6, 7]."""
    return [list(range(start, start + tp)) for start in range(0, world, tp)]


class VLLMRollout:
    """``vllm.LLM`` colocated with the trainer; ``rollout.vllm`` holds its settings."""

    gathers_policy = False  # generation runs on vLLM's copy of the weights, never on the training model

    def __init__(self, model, tokenizer, cfg, vllm=None):
        """``vllm``: the module providing ``LLM`` and ``SamplingParams``; None imports vLLM (tests pass a double)."""
        if vllm is None:
            if not torch.cuda.is_available():
                raise RuntimeError("rollout.engine=vllm needs a CUDA GPU; use rollout.engine=hf on CPU")
            vllm = importlib.import_module("vllm")
        if hasattr(model, "peft_config"):  # TRL merges adapters under a whole-model gather; no RL policy here is one
            raise NotImplementedError("rollout.engine=vllm with a PEFT policy: adapters would be pushed unmerged")
        # this rank's GPU: distributed.init made the resolved device current
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else \
            torch.device("cpu")
        _ensure_process_group(self.device)
        v, rank, world = cfg.vllm, dist.get_rank(), dist.get_world_size()
        tp = int(v.tensor_parallel_size)
        if world % tp:
            raise InputError(f"rollout.vllm.tensor_parallel_size={tp} must divide the number of ranks ({world})")
        # collective on every rank, groups or not
        self.tp_group = dist.new_subgroups_by_enumeration(tp_groups(world, tp))[0] if tp > 1 else None
        self.collective = tp > 1  # a group's ranks generate together: each must call generate, prompts or not
        self.sleep_level = int(v.sleep_level) if v.enable_sleep_mode else 0  # 0: never asleep
        # pushed weights stay until the next push unless sleep puts them away: a push is what wakes them
        self.keeps_weights = not self.sleep_level
        self._vllm, self.tokenizer = vllm, tokenizer
        self.seed, self.calls = int(v.seed) + rank // tp, 0  # the engine's seed (TRL's); generate calls so far
        self.eos_ids = eos_token_ids(tokenizer, model, cfg.stop_token_ids)
        self.llm = vllm.LLM(
            model=model.name_or_path,
            dtype=str(v.dtype),
            **memory_args(v, model, tp, self.device, self.tp_group),
            tensor_parallel_size=tp,
            max_model_len=v.max_model_len,
            distributed_executor_backend="external_launcher",
            seed=self.seed,
            logprobs_mode="processed_logprobs",
            enable_prefix_caching=bool(v.enable_prefix_caching),
            enable_sleep_mode=bool(v.enable_sleep_mode),
            **{k: int(v[k]) for k in ("max_num_seqs", "max_num_batched_tokens") if v[k] is not None},
        )
        if self.sleep_level:
            self.llm.sleep(level=self.sleep_level)
        self._weights_asleep = bool(self.sleep_level)
        # every rank waits for the others' vLLM: ranks left apart by its start-up hang DeepSpeed's (TRL 1.16
        # VLLMGeneration: accelerator.wait_for_everyone() after the LLM is built)
        dist.barrier()

    def sync_weights(self, engine) -> None:
        """Push the optimiser engine's current weights into vLLM, one parameter at a time. Collective under
        ZeRO-3: every rank calls it and walks every parameter."""
        if self.sleep_level:
            torch.cuda.empty_cache()  # as TRL: the trainer's cached blocks would crowd the weights waking up
            self.llm.wake_up(tags=["weights"])
            self._weights_asleep = False
        runner = self.llm.llm_engine.model_executor.driver_worker.model_runner
        with torch.no_grad():
            for name, tensor in engine.named_full_parameters():
                runner.model.load_weights([(name, tensor)])
        self.llm.reset_prefix_cache()  # cached prefixes were computed with the old weights

    def generate(self, prompts: list[list[int]], sampling: Sampling) -> RolloutBatch:
        if self._weights_asleep:
            raise RuntimeError("vLLM's weights are asleep: call sync_weights(engine) before generate")
        own = row_seeds(sampling, len(prompts)) or [None] * len(prompts)
        rows, mine = gather_in_group(list(zip(prompts, own)), self.tp_group)  # the group's, the same on its ranks
        self.calls += 1
        if sampling.seed is None:  # counted alike on a group's ranks: they call generate together
            base = sampling_seed("vllm", self.seed, self.calls)
            rows = [(p, sampling_seed(base, j)) for j, (p, _) in enumerate(rows)]
        if self.sleep_level:
            self.llm.wake_up(tags=["kv_cache"])
        outs = self.llm.generate([{"prompt_token_ids": p} for p, _ in rows],
                                 sampling_params=[self._params(sampling, seed) for _, seed in rows],
                                 use_tqdm=False)[mine]
        if self.sleep_level:
            self.llm.sleep(level=self.sleep_level)
            self._weights_asleep = True
        resp = [list(o.outputs[0].token_ids) for o in outs]
        lps = [[_chosen_logprob(step, tok) for step, tok in zip(o.outputs[0].logprobs or [], r)]
               for o, r in zip(outs, resp)] if sampling.logprobs else None
        return from_token_lists(prompts, resp, lps, self.eos_ids, self.tokenizer.pad_token_id, self.device)

    def _params(self, sampling: Sampling, seed: int):
        """One request's ``SamplingParams``: its own seed; the sampled token's log-prob only when asked for."""
        greedy = sampling.temperature <= 0
        return self._vllm.SamplingParams(
            n=1, temperature=0.0 if greedy else sampling.temperature, top_p=1.0 if greedy else sampling.top_p,
            top_k=-1 if greedy or sampling.top_k <= 0 else sampling.top_k, max_tokens=sampling.max_new_tokens,
            logprobs=0 if sampling.logprobs else None, stop_token_ids=self.eos_ids, skip_special_tokens=False,
            seed=seed,
        )


def memory_args(v, model, tp: int, device: torch.device, group=None) -> dict:
    """vLLM's memory arguments for ``rollout.vllm.gpu_memory_utilization_of`` (core/rollout/vllm_memory.py).

    ``card``: ``gpu_memory_utilization`` as given, the whole GPU's fraction vLLM may use (stock vLLM, TRL). ``free``:
    the KV cache veRL 0.2's worker would have sized, ``fraction x`` the memory free once vLLM's weights and profile run
    are in, passed as ``kv_cache_memory_bytes`` (vLLM PR #21489: a KV size per GPU that "ignores
    gpu_memory_utilization"; in the pinned vLLM 0.31.0 the worker's ``determine_available_memory`` returns it instead
    of profiling). vLLM 0.31.0 still refuses to start when less than ``gpu_memory_utilization x the card`` is free at
    its start (vllm/v1/worker/utils.py ``request_memory``, called in ``init_device`` whatever kv_cache_memory_bytes
    says), so that fraction is passed as the share of the card the engine takes: weights, activations, KV cache.
    The ranks of a tensor-parallel group take the smallest budget among them, as veRL's worker all-reduces the block
    count (MIN over the TP group): the engine's ranks must hold the same number of blocks."""
    fraction = float(v.gpu_memory_utilization)
    if v.gpu_memory_utilization_of == "card":
        return {"gpu_memory_utilization": fraction}
    kv, used, total = _free_budget(v, model, tp, device)
    if group is not None:
        both = torch.tensor([kv, used], dtype=torch.int64, device=device)
        dist.all_reduce(both, op=dist.ReduceOp.MIN, group=group)
        kv, used = (int(x) for x in both.tolist())
    return {"gpu_memory_utilization": math.floor(used / total * 1e4) / 1e4, "kv_cache_memory_bytes": kv}


def _free_budget(v, model, tp: int, device: torch.device) -> tuple[int, int, int]:
    """``(KV cache bytes, bytes the engine takes, the card's bytes)`` under ``free`` on this rank's GPU. The free memory
    is measured now, just before the engine is built, after emptying torch's cache (veRL's worker empties it too: the
    trainer's cached blocks are free to vLLM). vLLM's weights and profile activations cannot be measured before vLLM
    loads them, and the budget must be given when the engine is built, so they are estimated from the model's config
    (vllm_memory.py: the parameters in vLLM's dtype over TP; the profile forward of max_num_batched_tokens tokens)."""
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    dtype_bytes = vm.DTYPE_BYTES.get(str(v.dtype)) or model.dtype.itemsize  # "auto": the checkpoint's dtype
    seqs = v.max_num_seqs or vm.default_max_num_seqs(total, torch.cuda.get_device_name(device))
    weights = vm.weight_bytes(model.config, dtype_bytes, tp)
    activations = vm.profile_activation_bytes(model.config, tp, v.max_num_batched_tokens or vm.PROFILE_TOKENS, seqs,
                                              dtype_bytes)
    kv = vm.free_kv_bytes(free, fraction=float(v.gpu_memory_utilization), weights=weights, activations=activations)
    if kv <= 0:
        raise RuntimeError(f"rollout.vllm.gpu_memory_utilization_of=free: {free / vm.GiB:.1f} GiB free on {device} "
                           f"when vLLM starts does not hold its weights ({weights / vm.GiB:.1f} GiB) and profile run "
                           f"({activations / vm.GiB:.1f} GiB): nothing left for its KV cache")
    return kv, min(weights + activations + kv, free - vm.START_SLACK), total


def gather_in_group(rows: list, group) -> tuple[list, slice]:
    """The rows (prompts, or prompts with their seeds) of every rank of ``group`` in rank order, and where this rank's
    lie among them (ranks may hold different counts). ``group`` None: this rank's alone."""
    if group is None:
        return rows, slice(0, len(rows))
    parts: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, rows, group=group)
    start = sum(len(p) for p in parts[:dist.get_rank(group)])
    return [p for part in parts for p in part], slice(start, start + len(rows))


def _chosen_logprob(step: dict, token: int) -> float:
    """The sampled token's log-prob from vLLM's per-step ``{token_id: Logprob}`` map."""
    item = step.get(token)
    return float(item.logprob) if item is not None else 0.0
