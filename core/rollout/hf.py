"""Hugging Face ``generate`` on the training model itself (``rollout.engine=hf``): any device, no weight sync.

Log-probs are ``log_softmax(logits / T)`` of each chosen token: the temperature-scaled policy the trainer
differentiates (TRL divides logits by the temperature the same way), before top-p/top-k truncation;
greedy decoding reports ``T = 1`` log-probs, and none are computed when the caller does not read them
(``Sampling.logprobs``: the batch's are None). They are read by a logits processor as generation goes
(:class:`ChosenLogprobs`), so the engine keeps one step's ``[n, V]`` distribution instead of every step's
logits (``output_logits`` would hold ``[n, R, V]``: tens of GB at a 152k vocabulary and 4k tokens).
"""
from __future__ import annotations

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from core.rollout.batch import RolloutBatch, Sampling, assemble, concat_rollouts, eos_token_ids, left_pad


class ChosenLogprobs(LogitsProcessor):
    """Records ``log_softmax(scores / T)`` of the token chosen at each step. ``generate`` runs user processors
    before its temperature and truncation warpers, so ``scores`` are the model's logits; the token chosen
    from step ``s`` is the last input token at step ``s + 1`` (and the last generated one after the loop)."""

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.steps: list[torch.Tensor] = []  # [n] per step
        self._last = None  # [n, V] the previous step's log-probs

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self._take(input_ids[:, -1])
        self._last = torch.log_softmax(scores.float() / self.temperature, -1)  # [n, V]
        return scores

    def _take(self, chosen: torch.Tensor) -> None:
        if self._last is not None:
            self.steps.append(self._last.gather(-1, chosen[:, None]).squeeze(-1))  # [n]

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """``[n, R]`` after generation, given the last generated token of every row."""
        self._take(last_tokens)
        self._last = None
        return torch.stack(self.steps, 1)


def _partitioned(model) -> bool:
    """ZeRO-3 parameters left partitioned for generation (``rollout.gather_for_generation: false``): each
    forward gathers layer by layer, a collective, so every rank must keep stepping until all are done
    (``generate``'s ``synced_gpus``, which TRL gets from accelerate's global DeepSpeed config)."""
    status = {getattr(p, "ds_status", None) for p in model.parameters()}
    if status == {None}:
        return False
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    return ZeroParamStatus.NOT_AVAILABLE in status and torch.distributed.get_world_size() > 1


class HFGenerateRollout:
    """``model.generate`` in chunks of ``rollout.generation_batch_size`` prompts (0: all at once). It generates
    synchronously, so it defines no ``start_generate``: generation one step ahead runs it at once
    (:func:`core.rollout.start_generate`), making the batch stale by a step without overlapping anything."""

    keeps_weights = True  # it samples from the training model itself: it always holds the current weights

    def __init__(self, model, tokenizer, cfg):
        self.model, self.tokenizer = model, tokenizer
        self.batch_size = int(cfg.generation_batch_size)
        self.eos_ids = eos_token_ids(tokenizer, model, cfg.stop_token_ids)
        self.gathers_policy = bool(cfg.gather_for_generation)  # ZeRO-3: the loop gathers it whole around generate

    @property
    def collective(self) -> bool:
        """``generate`` gathers layer by layer (ZeRO-3, not gathered whole), so every rank must call it."""
        return _partitioned(self.model)

    def sync_weights(self, engine) -> None:
        self.model = engine.module  # same process, same tensors: nothing to copy

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], sampling: Sampling) -> RolloutBatch:
        step = self.batch_size or len(prompts)
        parts = [self._generate_chunk(prompts[i:i + step], sampling) for i in range(0, len(prompts), step)]
        return parts[0] if len(parts) == 1 else concat_rollouts(parts, self.tokenizer.pad_token_id)

    def _config(self, sp: Sampling) -> GenerationConfig:
        """Every knob that shapes the distribution set explicitly, as TRL's GRPO does: ``generate`` fills
        unset ones from the checkpoint's ``generation_config.json`` (Qwen2.5-Instruct: top_k 20, top_p 0.8,
        repetition_penalty 1.05), which would sample from another distribution than the recipe's. Greedy
        decoding applies no warper, so its top-k is left unset (0 would draw a warning)."""
        greedy = sp.temperature <= 0
        return GenerationConfig(
            max_new_tokens=sp.max_new_tokens, do_sample=not greedy, temperature=1.0 if greedy else sp.temperature,
            top_p=1.0 if greedy else sp.top_p, top_k=None if greedy else max(sp.top_k, 0), repetition_penalty=1.0,
            eos_token_id=self.eos_ids, pad_token_id=self.tokenizer.pad_token_id, use_cache=True, disable_compile=True)

    def _generate_chunk(self, prompts: list[list[int]], sp: Sampling) -> RolloutBatch:
        pad, device = self.tokenizer.pad_token_id, next(self.model.parameters()).device
        ids, mask = left_pad(prompts, pad, device)  # [n, P]
        greedy = sp.temperature <= 0
        record = ChosenLogprobs(1.0 if greedy else sp.temperature) if sp.logprobs else None  # only when read
        was_training = self.model.training
        self.model.eval()
        out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=self._config(sp),
                                  logits_processor=LogitsProcessorList([record] if record else []),
                                  synced_gpus=_partitioned(self.model))
        self.model.train(was_training)
        resp = out[:, ids.shape[1]:]  # [n, R]
        lps = record.finish(resp[:, -1]) if record else None  # [n, R]
        return assemble(ids, mask, resp, self.eos_ids, pad, lps)
