"""Rollout engines: sample completions for a batch of prompts.

Every engine returns a :class:`Rollout` with the same layout, so the trainer never knows which one ran:
prompts left-padded to ``P`` columns, responses right-padded to ``R`` columns, a response mask that
covers generated tokens up to and including the first EOS, per-token sampling log-probs and a finish
reason per sample (``stop``: EOS emitted; ``length``: cut at ``max_new_tokens``).

Engines are registered by config name (``rollout.engine``): ``hf`` (Hugging Face ``generate``, CPU or
GPU) and ``torch`` (a lean KV-cached sampling loop on the same model that prefills each distinct
prompt once and shares its cache across the group) here, ``vllm`` in :mod:`core.rollout_vllm` (GPU
only, imported lazily).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

import torch

from core import lean_decoder

_ENGINES: dict[str, Callable] = {}


def register_engine(name: str):
    def deco(cls):
        if name in _ENGINES and _ENGINES[name] is not cls:
            raise ValueError(f"rollout engine {name!r} is already registered")
        _ENGINES[name] = cls
        return cls

    return deco


# Engines whose module imports GPU-only packages: imported (and so registered) only when asked for.
_LAZY = {"vllm": "core.rollout_vllm"}


def build_engine(name: str, model, tokenizer, cfg):
    """The engine registered as ``name`` (a lazy one is imported first)."""
    if name not in _ENGINES and name in _LAZY:
        importlib.import_module(_LAZY[name])
    if name not in _ENGINES:
        raise KeyError(f"unknown rollout.engine {name!r}; registered: {', '.join(sorted({*_ENGINES, *_LAZY}))}")
    return _ENGINES[name](model, tokenizer, cfg)


@dataclass
class Sampling:
    """Sampling parameters; ``temperature == 0`` means greedy."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off

    @classmethod
    def from_cfg(cls, cfg, greedy: bool = False) -> "Sampling":
        return cls(int(cfg.max_new_tokens), 0.0 if greedy else float(cfg.temperature),
                   float(cfg.top_p), int(cfg.top_k))


@dataclass
class Rollout:
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


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists to ``(ids [N, P], mask [N, P])``, padded on the left."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s):] = 1
    return ids, mask


def response_mask_from_ids(resp: torch.Tensor, eos_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask tokens after the first EOS. Returns ``(mask [N, R], stopped [N] bool)``."""
    is_eos = torch.isin(resp, torch.tensor(eos_ids, device=resp.device))  # [N, R]
    # tokens strictly after the first EOS have a positive count of earlier EOS tokens
    after = (is_eos.cumsum(-1) - is_eos.long()) > 0  # [N, R]
    return (~after).long(), is_eos.any(-1)


def assemble(prompt_ids, prompt_mask, resp, eos_ids, pad_id, logprobs) -> Rollout:
    """Build a :class:`Rollout` from padded prompts and raw generated tokens ``resp [N, R]``."""
    rmask, stopped = response_mask_from_ids(resp, eos_ids)  # [N, R], [N]
    resp = resp.masked_fill(rmask == 0, pad_id)
    return Rollout(
        input_ids=torch.cat([prompt_ids, resp], 1),  # [N, P+R]
        attention_mask=torch.cat([prompt_mask, rmask], 1),  # [N, P+R]
        response_mask=rmask,
        logprobs=logprobs * rmask,
        finish_reason=["stop" if s else "length" for s in stopped.tolist()],
        prompt_length=prompt_ids.shape[1],
    )


def eos_token_ids(tokenizer, model=None) -> list[int]:
    """EOS ids: the tokenizer's plus any in the model's generation config (Llama-3 lists several)."""
    ids = {tokenizer.eos_token_id}
    gen = getattr(model, "generation_config", None)
    extra = getattr(gen, "eos_token_id", None)
    ids.update(extra if isinstance(extra, (list, tuple)) else [extra])
    return sorted(i for i in ids if i is not None)


@register_engine("hf")
class HFEngine:
    """Hugging Face ``generate`` on the training model itself (no weight sync needed).

    Log-probs are ``log_softmax(logits / T)`` of the chosen token: the temperature-scaled policy the
    trainer differentiates (TRL divides logits by the temperature the same way), before top-p/top-k
    truncation. Greedy decoding reports ``T = 1`` log-probs.
    """

    def __init__(self, model, tokenizer, cfg):
        self.model, self.tokenizer = model, tokenizer
        self.batch_size = int(cfg.get("generation_batch_size", 0) or 0)
        self.eos_ids = eos_token_ids(tokenizer, model)

    def sync_weights(self, model) -> None:
        self.model = model  # same process, same tensors: nothing to copy

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], sampling: Sampling) -> Rollout:
        step = self.batch_size or len(prompts)
        parts = [self._generate_chunk(prompts[i:i + step], sampling) for i in range(0, len(prompts), step)]
        return parts[0] if len(parts) == 1 else concat_rollouts(parts, self.tokenizer.pad_token_id)

    def _generate_chunk(self, prompts: list[list[int]], sp: Sampling) -> Rollout:
        pad = self.tokenizer.pad_token_id
        ids, mask = left_pad(prompts, pad)  # [n, P]
        device = next(self.model.parameters()).device
        greedy = sp.temperature <= 0
        was_training = self.model.training
        self.model.eval()
        out = self.model.generate(
            input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=sp.max_new_tokens,
            do_sample=not greedy, temperature=None if greedy else sp.temperature,
            top_p=None if greedy else sp.top_p, top_k=None if greedy or sp.top_k <= 0 else sp.top_k,
            eos_token_id=self.eos_ids, pad_token_id=pad, output_logits=True,
            return_dict_in_generate=True, use_cache=True,
        )
        self.model.train(was_training)
        resp = out.sequences[:, ids.shape[1]:].cpu()  # [n, R]
        logits = torch.stack(out.logits, 1).float().cpu()  # [n, R, V]
        temp = 1.0 if greedy else sp.temperature
        logp = torch.log_softmax(logits / temp, -1).gather(-1, resp.unsqueeze(-1)).squeeze(-1)  # [n, R]
        return assemble(ids, mask, resp, self.eos_ids, pad, logp)


def concat_rollouts(parts: list[Rollout], pad_id: int) -> Rollout:
    """Stack rollouts of different ``P``/``R`` widths into one, re-padding both sides."""
    P = max(p.prompt_length for p in parts)
    R = max(p.response_mask.shape[1] for p in parts)

    def widen(x: torch.Tensor, p: Rollout, fill) -> torch.Tensor:
        prompt, resp = x[:, :p.prompt_length], x[:, p.prompt_length:]
        lp = torch.full((x.shape[0], P - p.prompt_length), fill, dtype=x.dtype)
        rp = torch.full((x.shape[0], R - resp.shape[1]), fill, dtype=x.dtype)
        return torch.cat([lp, prompt, resp, rp], 1)

    def rpad(x: torch.Tensor, fill) -> torch.Tensor:
        return torch.cat([x, torch.full((x.shape[0], R - x.shape[1]), fill, dtype=x.dtype)], 1)

    return Rollout(
        input_ids=torch.cat([widen(p.input_ids, p, pad_id) for p in parts]),
        attention_mask=torch.cat([widen(p.attention_mask, p, 0) for p in parts]),
        response_mask=torch.cat([rpad(p.response_mask, 0) for p in parts]),
        logprobs=torch.cat([rpad(p.logprobs, 0.0) for p in parts]),
        finish_reason=sum((p.finish_reason for p in parts), []),
        prompt_length=P,
    )


def _sample(logits: torch.Tensor, sp: Sampling) -> tuple[torch.Tensor, torch.Tensor]:
    """Next token and its log-prob under ``log_softmax(logits / T)`` (before top-k/top-p truncation,
    as :class:`HFEngine` reports it). Truncation order as HF: temperature, top-k, top-p.

    The draw is inverse-CDF: one uniform per row against the float64 cumulative distribution, the
    same distribution as ``torch.multinomial`` (which draws an exponential per vocabulary entry: on
    CPU that RNG call alone cost more than a decoding step's matmuls, docs/performance.md).
    """
    if sp.temperature <= 0:
        tok = logits.argmax(-1)  # [N]
        return tok, torch.log_softmax(logits.float(), -1).gather(-1, tok.unsqueeze(-1)).squeeze(-1)
    scaled = logits.float() / sp.temperature  # [N, V]
    logp = torch.log_softmax(scaled, -1)  # [N, V]
    trunc = scaled
    if sp.top_k > 0:
        kth = torch.topk(trunc, min(sp.top_k, trunc.shape[-1]), -1).values[:, -1:]  # [N, 1]
        trunc = trunc.masked_fill(trunc < kth, float("-inf"))
    if sp.top_p < 1.0:
        srt, order = torch.sort(trunc, -1, descending=True)  # [N, V]
        cum = torch.softmax(srt, -1).cumsum(-1)  # [N, V]
        drop = (cum - torch.softmax(srt, -1)) > sp.top_p  # keep the smallest prefix reaching top_p
        trunc = trunc.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    probs = logp.exp() if trunc is scaled else torch.softmax(trunc, -1)  # [N, V]
    tok = inverse_cdf(probs)  # [N]
    return tok, logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1)


def inverse_cdf(probs: torch.Tensor) -> torch.Tensor:
    """One draw per row of ``probs [N, V]`` (non-negative, any positive total): the first index whose
    float64 cumulative sum exceeds ``u * total``, ``u ~ U[0, 1)``. A zero-probability entry leaves the
    cumulative sum unchanged, so it is never drawn; ``u`` stays strictly below the total."""
    cdf = probs.double().cumsum(-1)  # [N, V]
    total = cdf[:, -1:]  # [N, 1]
    u = torch.rand(total.shape, dtype=torch.float64, device=probs.device) * total  # [N, 1]
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, u, right=True).squeeze(-1)  # [N]


def _distinct_runs(prompts: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """Collapse runs of identical consecutive prompts (a GRPO group) to one prompt and a count."""
    uniq, counts = [], []
    for p in prompts:
        if uniq and p == uniq[-1]:
            counts[-1] += 1
        else:
            uniq.append(p)
            counts.append(1)
    return uniq, counts


@register_engine("torch")
class TorchEngine(HFEngine):
    """KV-cached sampling written out in torch, on the training model itself.

    Where the time goes with ``generate`` on small models (profiled in docs/performance.md): per-token
    logits processors, stopping criteria, cache and mask bookkeeping, plus a prefill of every copy of
    a prompt. Here each distinct prompt is prefilled once and its cache repeated for the group, then
    one forward per new token; the log-probs come from the same logits that were sampled from. For
    Llama-family models the forwards are :class:`core.lean_decoder.LeanDecoder` (fused projections,
    a preallocated cache); for anything it does not cover (``lean_decoder.unsupported_reason``), or
    with ``rollout.lean_forward=false``, the HF module's own forward. Same :class:`Rollout` layout and
    sampling semantics as :class:`HFEngine`.
    """

    def __init__(self, model, tokenizer, cfg):
        super().__init__(model, tokenizer, cfg)
        self.lean = bool(cfg.get("lean_forward", True))
        self.drop_finished = bool(cfg.get("drop_finished", True))

    def _generate_chunk(self, prompts: list[list[int]], sp: Sampling) -> Rollout:
        pad, model = self.tokenizer.pad_token_id, self.model
        uniq, counts = _distinct_runs(prompts)
        ids, mask = left_pad(uniq, pad)  # [u, P]
        device = next(model.parameters()).device
        ids, mask = ids.to(device), mask.to(device)
        rows = torch.arange(len(uniq), device=device).repeat_interleave(torch.tensor(counts, device=device))  # [N]
        was_training = model.training
        model.eval()
        if self.lean and lean_decoder.unsupported_reason(model) is None:
            resp, logp = self._lean(model, ids, mask, rows, sp, pad)  # [N, R] x2
        else:
            resp, logp = self._hf(model, ids, mask, rows, sp, pad)
        model.train(was_training)
        return assemble(ids[rows].cpu(), mask[rows].cpu(), resp.cpu(), self.eos_ids, pad, logp.float().cpu())

    @torch.inference_mode()
    def _lean(self, model, ids, mask, rows, sp: Sampling, pad: int):
        """Prefill the ``u`` distinct prompts into a cache sized for the whole completion, repeat it for
        the ``N`` rows, then decode one token per step into it."""
        dec, (u, P), new = lean_decoder.LeanDecoder(model), ids.shape, sp.max_new_tokens
        steps = torch.arange(new, device=ids.device)
        pos = torch.cat([lean_decoder.position_ids(mask), mask.sum(-1, keepdim=True) + steps], 1)  # [u, P + new]
        cos, sin = dec.rope(pos)  # [u, P + new, 1, D]
        logits, cache = dec.prefill(ids, mask, cos[:, :P], sin[:, :P], rows, P + new)  # [N, V], [2, N, Hkv, P+new, D]
        cos, sin = cos[rows], sin[rows]
        # generated slots are visible to later tokens (rows already done keep feeding pad, as generate does)
        bias = lean_decoder.additive_mask(torch.cat([mask.bool(), torch.ones(u, new, dtype=torch.bool, device=ids.device)], 1))
        bias = bias[rows][:, None, None, None]  # [N, 1, 1, 1, P + new]

        def step(tok, t):
            s = P + t
            h = dec.forward(tok[:, None], s, cache, cos[:, s:s + 1], sin[:, s:s + 1], bias[..., :s + 1])
            return dec.logits(h[:, -1])  # [n, V]

        def keep(rows):  # the batch shrinks to these rows
            nonlocal cache, cos, sin, bias
            cache, cos, sin, bias = [kv[:, rows] for kv in cache], cos[rows], sin[rows], bias[rows]

        return self._decode(logits, step, sp, pad, keep)

    @torch.no_grad()
    def _hf(self, model, ids, mask, rows, sp: Sampling, pad: int):
        """The same loop on the HF module (its ``DynamicCache``), for models the lean forward does not cover."""
        out = model(input_ids=ids, attention_mask=mask, position_ids=lean_decoder.position_ids(mask), use_cache=True,
                    logits_to_keep=1)
        cache = out.past_key_values
        cache.reorder_cache(rows)  # [N, ...]
        am = mask[rows]  # [N, P]
        pos = am.sum(-1, keepdim=True)  # [N, 1] next position (left padding skipped)

        def step(tok, t):
            nonlocal am
            am = torch.cat([am, torch.ones_like(am[:, :1])], 1)  # [n, P + t + 1]
            return model(input_ids=tok.unsqueeze(-1), attention_mask=am, position_ids=pos + t,
                         past_key_values=cache, use_cache=True).logits[:, -1]  # [n, V]

        def keep(rows):
            nonlocal am, pos
            cache.reorder_cache(rows)
            am, pos = am[rows], pos[rows]

        return self._decode(out.logits[:, -1][rows], step, sp, pad, keep)

    def _decode(self, logits, step, sp: Sampling, pad: int, keep):
        """Sample until every row emitted an EOS or ``max_new_tokens``; ``step(tok, t)`` feeds token ``t``
        of the rows still decoding and returns their next logits.

        With ``rollout.drop_finished``, once a quarter of the rows still decoding have emitted their EOS,
        ``keep(rows)`` shrinks the batch (caches, positions, masks) to the others, so finished rows stop
        costing compute, as in vLLM's continuous batching (``generate`` keeps feeding them padding). Every
        row's tokens come from the same distribution either way; the draws differ, since fewer rows
        draw at each later step. Greedy decoding is identical.
        """
        N, R, device = logits.shape[0], sp.max_new_tokens, logits.device
        eos = torch.tensor(self.eos_ids, device=device)
        toks = torch.full((N, R), pad, dtype=torch.long, device=device)  # [N, R]
        lps = torch.zeros(N, R, device=device)  # [N, R] float32, as _sample returns them
        live = torch.arange(N, device=device)  # [n] the original row of each row still in the batch
        done = torch.zeros(N, dtype=torch.bool, device=device)  # [n]
        last = 0
        for t in range(R):
            tok, lp = _sample(logits, sp)  # [n], [n]
            tok = tok.masked_fill(done, pad)
            toks[live, t], lps[live, t], last = tok, lp, t
            done = done | torch.isin(tok, eos)
            finished = int(done.sum())
            if finished == len(done) or t == R - 1:
                break
            if self.drop_finished and 4 * finished >= len(done):
                rows = (~done).nonzero().squeeze(-1)  # [n'] rows still decoding
                keep(rows)
                live, done, tok = live[rows], done[rows], tok[rows]
            logits = step(tok, t)
        return toks[:, :last + 1], lps[:, :last + 1]  # [N, R']
