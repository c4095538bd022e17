"""vLLM rollout engine (``rollout.engine=vllm``; GPU only, ``pip install -e '.[gpu]'``).

A colocated in-process ``vllm.LLM`` on the trainer's GPU, driven the way TRL 1.16 drives its colocate
mode (``trl/generation/vllm_generation.py``): ``distributed_executor_backend="external_launcher"`` so
vLLM joins the trainer's process group, prompts passed as token ids, one completion per prompt
(groups are repeated prompts, as on the other engines), weights pushed before each rollout with
``model_runner.model.load_weights`` and the prefix cache reset after.

Log-probs: ``logprobs_mode="processed_logprobs"``, i.e. after temperature (and top-p/top-k) processing,
which equals the ``hf`` engine's temperature-scaled log-probs when top-p = 1 and top-k is off.

How far exercised: written against the documented API and TRL's use of it; its test
(``tests/test_rollout_vllm.py``) is marked ``gpu`` and has not run on this project's CPU machines.
"""
from __future__ import annotations

import os

import torch

from core.rollout import register_rollout
from core.rollout.batch import RolloutBatch, Sampling, assemble, eos_token_ids, left_pad


def _ensure_process_group() -> None:
    """``external_launcher`` needs torch.distributed; a single process gets a world of one."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")


@register_rollout("vllm")
class VLLMRollout:
    """``vllm.LLM`` colocated with the trainer; ``rollout.vllm`` holds its settings."""

    def __init__(self, model, tokenizer, cfg):
        from vllm import LLM

        if not torch.cuda.is_available():
            raise RuntimeError("rollout.engine=vllm needs a CUDA GPU; use rollout.engine=hf on CPU")
        _ensure_process_group()
        v = cfg.vllm
        self.tokenizer = tokenizer
        self.eos_ids = eos_token_ids(tokenizer, model)
        self.llm = LLM(
            model=model.name_or_path,
            dtype=str(v.dtype),
            gpu_memory_utilization=float(v.gpu_memory_utilization),
            tensor_parallel_size=int(v.tensor_parallel_size),
            max_model_len=v.max_model_len,
            distributed_executor_backend="external_launcher",
            seed=int(v.seed),
            logprobs_mode="processed_logprobs",
            enable_prefix_caching=bool(v.enable_prefix_caching),
        )

    def sync_weights(self, model) -> None:
        """Push the trainer's current weights into vLLM (names as in the HF state dict)."""
        runner = self.llm.llm_engine.model_executor.driver_worker.model_runner
        with torch.no_grad():
            for name, param in model.named_parameters():
                runner.model.load_weights([(name, param.data)])
        self.llm.reset_prefix_cache()  # cached prefixes were computed with the old weights

    def generate(self, prompts: list[list[int]], sampling: Sampling) -> RolloutBatch:
        from vllm import SamplingParams

        greedy = sampling.temperature <= 0
        params = SamplingParams(
            n=1, temperature=0.0 if greedy else sampling.temperature, top_p=1.0 if greedy else sampling.top_p,
            top_k=-1 if greedy or sampling.top_k <= 0 else sampling.top_k, max_tokens=sampling.max_new_tokens,
            logprobs=0, stop_token_ids=self.eos_ids, skip_special_tokens=False,
        )
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], sampling_params=params, use_tqdm=False)
        resp = [list(o.outputs[0].token_ids) for o in outs]
        lps = [[_chosen_logprob(step, tok) for step, tok in zip(o.outputs[0].logprobs or [], r)]
               for o, r in zip(outs, resp)]
        return _to_rollout(prompts, resp, lps, self.eos_ids, self.tokenizer.pad_token_id, torch.cuda.current_device())


def _chosen_logprob(step: dict, token: int) -> float:
    """The sampled token's log-prob from vLLM's per-step ``{token_id: Logprob}`` map."""
    item = step.get(token)
    return float(item.logprob) if item is not None else 0.0


def _to_rollout(prompts, resp, lps, eos_ids, pad_id, device=None) -> RolloutBatch:
    """vLLM's token lists as a :class:`RolloutBatch` on ``device`` (the trainer's GPU)."""
    ids, mask = left_pad(prompts, pad_id)  # [N, P]
    R = max(1, max(len(r) for r in resp))
    out = torch.full((len(resp), R), pad_id, dtype=torch.long)  # [N, R]
    logp = torch.zeros((len(resp), R))  # [N, R]
    for i, (r, lp) in enumerate(zip(resp, lps)):
        out[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        logp[i, :len(lp)] = torch.tensor(lp)
    return assemble(*(t.to(device) for t in (ids, mask, out)), eos_ids, pad_id, logp.to(device))
