"""The rollout batch every engine returns, sampling parameters, and the helpers that lay a batch out.

Every engine returns a :class:`RolloutBatch` with the same layout, so the trainer never knows which one
ran: prompts left-padded to ``P`` columns, responses right-padded to ``R`` columns, a response mask that
covers generated tokens up to and including the first EOS, per-token sampling log-probs and a finish
reason per sample (``stop``: EOS emitted; ``length``: cut at ``max_new_tokens``). Its tensors live on
the device the engine generated on.

Seeds (:attr:`Sampling.seed`, :func:`row_seeds`): an engine that seeds each row (vLLM: core/rollout/vllm.py) samples
row ``i`` of a batch from its own seed, a hash of the batch's seed and the row's index among every rank's rows
(``first_row + i``), so what a row draws depends on neither the rank's random state, nor the other rows, nor the
process that generates it (docs/vllm.md, "Sampling seeds").
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch


@dataclass
class Sampling:
    """Sampling parameters; ``temperature == 0`` means greedy.

    ``seed``: the batch's sampling seed (:func:`sampling_seed`), None when the caller names none (the vLLM engine
    then counts its calls, core/rollout/vllm.py); ``first_row``: this rank's first row's index among the rows every
    rank generates together (rank-major); ``logprobs``: whether the caller reads each token's sampling log-prob
    (:attr:`RolloutBatch.logprobs` is None when not)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    seed: int | None = None
    first_row: int = 0
    logprobs: bool = True

    @classmethod
    def from_cfg(cls, cfg, greedy: bool = False, **kw) -> "Sampling":
        """From ``rollout``: greedy when asked (evaluation) or when ``rollout.greedy`` names it; ``kw``: the seed,
        first row and log-probs of the batch."""
        return cls(int(cfg.max_new_tokens), 0.0 if greedy or cfg.greedy else float(cfg.temperature),
                   float(cfg.top_p), int(cfg.top_k), **kw)


def sampling_seed(*key: int | str) -> int:
    """A seed in ``[0, 2**63)`` from ``key`` (run seed, step, row, ...): 8 bytes of BLAKE2b, so nearby keys give
    unrelated seeds and a key gives the same seed in every process (vLLM's ``SamplingParams.seed`` takes an int;
    -1 would mean none)."""
    digest = hashlib.blake2b(":".join(str(k) for k in key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def row_seeds(sampling: Sampling, n: int) -> list[int] | None:
    """The seeds of this rank's ``n`` rows: ``sampling_seed(seed, first_row + i)``; None without a batch seed."""
    if sampling.seed is None:
        return None
    return [sampling_seed(sampling.seed, sampling.first_row + i) for i in range(n)]


@dataclass
class RolloutBatch:
    input_ids: torch.Tensor  # [N, P+R] prompt (left-padded) then response (right-padded)
    attention_mask: torch.Tensor  # [N, P+R] 1 on real prompt tokens and on response tokens kept
    response_mask: torch.Tensor  # [N, R] 1 on generated tokens up to and including the first EOS
    # [N, R] log-prob of each sampled token under the sampling distribution; None when the caller did not ask for them
    # (Sampling.logprobs false): a consumer gets None, never stand-in numbers (core/algorithms/loss.py refuses it)
    logprobs: torch.Tensor | None
    finish_reason: list[str]  # N x {"stop", "length"}
    prompt_length: int  # P

    @property
    def response_ids(self) -> torch.Tensor:
        return self.input_ids[:, self.prompt_length:]  # [N, R]

    @property
    def response_lengths(self) -> torch.Tensor:
        return self.response_mask.sum(-1)  # [N]

    @property
    def stopped(self) -> torch.Tensor:
        """``[N]`` bool: the sample emitted an EOS (``finish_reason == "stop"``)."""
        return torch.tensor([r == "stop" for r in self.finish_reason], device=self.input_ids.device)

    def head(self, n: int) -> "RolloutBatch":
        """The first ``n`` rows (those after them were stand-ins, generated only to keep ranks in step)."""
        return RolloutBatch(self.input_ids[:n], self.attention_mask[:n], self.response_mask[:n],
                            None if self.logprobs is None else self.logprobs[:n], self.finish_reason[:n],
                            self.prompt_length)


def left_pad(seqs: list[list[int]], pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists to ``(ids [N, P], mask [N, P])``, padded on the left."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s):] = 1
    return ids.to(device), mask.to(device)


def response_mask_from_ids(resp: torch.Tensor, eos_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask tokens after the first EOS. Returns ``(mask [N, R], stopped [N] bool)``."""
    is_eos = torch.isin(resp, torch.tensor(eos_ids, device=resp.device))  # [N, R]
    # tokens strictly after the first EOS have a positive count of earlier EOS tokens
    after = (is_eos.cumsum(-1) - is_eos.long()) > 0  # [N, R]
    return (~after).long(), is_eos.any(-1)


def assemble(prompt_ids, prompt_mask, resp, eos_ids, pad_id, logprobs) -> RolloutBatch:
    """Build a :class:`RolloutBatch` from padded prompts and raw generated tokens ``resp [N, R]``; ``logprobs``
    ``[N, R]`` or None (not asked for)."""
    rmask, stopped = response_mask_from_ids(resp, eos_ids)  # [N, R], [N]
    resp = resp.masked_fill(rmask == 0, pad_id)
    return RolloutBatch(
        input_ids=torch.cat([prompt_ids, resp], 1),  # [N, P+R]
        attention_mask=torch.cat([prompt_mask, rmask], 1),  # [N, P+R]
        response_mask=rmask,
        logprobs=None if logprobs is None else logprobs * rmask,
        finish_reason=["stop" if s else "length" for s in stopped.tolist()],
        prompt_length=prompt_ids.shape[1],
    )


def concat_rollouts(parts: list[RolloutBatch], pad_id: int) -> RolloutBatch:
    """Stack rollouts of different ``P``/``R`` widths into one, re-padding both sides."""
    P = max(p.prompt_length for p in parts)
    R = max(p.response_mask.shape[1] for p in parts)

    def widen(x: torch.Tensor, p: RolloutBatch, fill) -> torch.Tensor:
        prompt, resp = x[:, :p.prompt_length], x[:, p.prompt_length:]
        lp = x.new_full((x.shape[0], P - p.prompt_length), fill)
        rp = x.new_full((x.shape[0], R - resp.shape[1]), fill)
        return torch.cat([lp, prompt, resp, rp], 1)

    def rpad(x: torch.Tensor, fill) -> torch.Tensor:
        return torch.cat([x, x.new_full((x.shape[0], R - x.shape[1]), fill)], 1)

    return RolloutBatch(
        input_ids=torch.cat([widen(p.input_ids, p, pad_id) for p in parts]),
        attention_mask=torch.cat([widen(p.attention_mask, p, 0) for p in parts]),
        response_mask=torch.cat([rpad(p.response_mask, 0) for p in parts]),
        logprobs=None if any(p.logprobs is None for p in parts) else torch.cat([rpad(p.logprobs, 0.0) for p in parts]),
        finish_reason=sum((p.finish_reason for p in parts), []),
        prompt_length=P,
    )


def eos_token_ids(tokenizer, model=None, extra=()) -> list[int]:
    """The ids that end a completion: the tokenizer's EOS, any in the model's generation config (Llama-3 lists
    several) and ``extra`` (``rollout.stop_token_ids``: SimpleRL-Zoo's vLLM stop ids)."""
    ids = {tokenizer.eos_token_id, *(int(i) for i in extra)}
    gen = getattr(model, "generation_config", None)
    extra = getattr(gen, "eos_token_id", None)
    ids.update(extra if isinstance(extra, (list, tuple)) else [extra])
    return sorted(i for i in ids if i is not None)


def from_token_lists(prompts, resp, lps, eos_ids, pad_id, device=None) -> RolloutBatch:
    """A :class:`RolloutBatch` on ``device`` (the trainer's) from token lists: prompts, generated tokens and
    each generated token's log-prob (None: not asked for), as a vLLM engine or server returns them."""
    ids, mask = left_pad(prompts, pad_id)  # [N, P]
    R = max(1, max(len(r) for r in resp))
    out = torch.full((len(resp), R), pad_id, dtype=torch.long)  # [N, R]
    logp = None if lps is None else torch.zeros((len(resp), R))  # [N, R]
    for i, r in enumerate(resp):
        out[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        if logp is not None:
            logp[i, :len(lps[i])] = torch.tensor(lps[i])
    return assemble(*(t.to(device) for t in (ids, mask, out)), eos_ids, pad_id,
                    None if logp is None else logp.to(device))
