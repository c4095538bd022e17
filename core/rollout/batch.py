"""The rollout batch every engine returns, sampling parameters, and the helpers that lay a batch out.

Every engine returns a :class:`RolloutBatch` with the same layout, so the trainer never knows which one
ran: prompts left-padded to ``P`` columns, responses right-padded to ``R`` columns, a response mask that
covers generated tokens up to and including the first EOS, per-token sampling log-probs and a finish
reason per sample (``stop``: EOS emitted; ``length``: cut at ``max_new_tokens``). Its tensors live on
the device the engine generated on.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Sampling:
    """Sampling parameters; ``temperature == 0`` means greedy."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off

    @classmethod
    def from_cfg(cls, cfg, greedy: bool = False) -> "Sampling":
        """From ``rollout``: greedy when asked (evaluation) or when ``rollout.greedy`` names it."""
        return cls(int(cfg.max_new_tokens), 0.0 if greedy or cfg.greedy else float(cfg.temperature),
                   float(cfg.top_p), int(cfg.top_k))


@dataclass
class RolloutBatch:
    input_ids: torch.Tensor  # [N, P+R] prompt (left-padded) then response (right-padded)
    attention_mask: torch.Tensor  # [N, P+R] 1 on real prompt tokens and on response tokens kept
    response_mask: torch.Tensor  # [N, R] 1 on generated tokens up to and including the first EOS
    logprobs: torch.Tensor  # [N, R] log-prob of each sampled token under the sampling distribution
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
        return RolloutBatch(self.input_ids[:n], self.attention_mask[:n], self.response_mask[:n], self.logprobs[:n],
                            self.finish_reason[:n], self.prompt_length)


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
    """Build a :class:`RolloutBatch` from padded prompts and raw generated tokens ``resp [N, R]``."""
    rmask, stopped = response_mask_from_ids(resp, eos_ids)  # [N, R], [N]
    resp = resp.masked_fill(rmask == 0, pad_id)
    return RolloutBatch(
        input_ids=torch.cat([prompt_ids, resp], 1),  # [N, P+R]
        attention_mask=torch.cat([prompt_mask, rmask], 1),  # [N, P+R]
        response_mask=rmask,
        logprobs=logprobs * rmask,
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
        logprobs=torch.cat([rpad(p.logprobs, 0.0) for p in parts]),
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
    each generated token's log-prob, as a vLLM engine or server returns them."""
    ids, mask = left_pad(prompts, pad_id)  # [N, P]
    R = max(1, max(len(r) for r in resp))
    out = torch.full((len(resp), R), pad_id, dtype=torch.long)  # [N, R]
    logp = torch.zeros((len(resp), R))  # [N, R]
    for i, (r, lp) in enumerate(zip(resp, lps)):
        out[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        logp[i, :len(lp)] = torch.tensor(lp)
    return assemble(*(t.to(device) for t in (ids, mask, out)), eos_ids, pad_id, logp.to(device))
