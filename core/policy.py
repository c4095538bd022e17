"""Forward passes that turn a rollout into per-token log-probs (and entropies) of its responses.

Two savings over a plain full-sequence forward, both exact up to float rounding (tested): logits
are computed only where they score a response token (TRL's ``logits_to_keep``), and a prompt that
repeats on consecutive rows (the G completions of a GRPO group) is run once, its key/value cache
repeated for the group, and only the response tokens are run per row. The gradient flows through
the shared prompt cache, so the policy update uses the same path.

``share_prompt=False`` runs one plain forward whatever the data: ZeRO-3 across ranks needs every rank
to call the model the same number of times (its per-module parameter gathers are collective), and
whether a batch has shared prompts is data.

With ``packing`` (config ``train.packing``) both the training forward (:func:`response_logprobs`,
with grad, inside the optimiser engine) and the no-grad ones (:func:`chunked_logprobs`: reference and
old policy) run padding-free where :func:`core.packed.forward_for` has a way: the functional packed
forward for the Llama-family models it covers, the HF module on one packed row for flash-attn models.
Otherwise the no-grad forwards run through
:class:`core.lean_decoder.LeanDecoder` when ``lean`` and the model is one it covers, and the training
forward runs the HF module.
"""
from __future__ import annotations

import torch

from core import lean_decoder, packed
from core.lean_decoder import position_ids, prompt_groups  # noqa: F401  (re-exported: the rollout layout helpers)


def response_logits(model, input_ids, attention_mask, prompt_length: int, share_prompt: bool = True) -> torch.Tensor:
    """Logits ``[N, R, V]`` that score response tokens ``P .. T-1`` (from positions ``P-1 .. T-2``)."""
    P, R = prompt_length, input_ids.shape[1] - prompt_length
    pos = position_ids(attention_mask)  # [N, T]
    first, group = prompt_groups(input_ids, attention_mask, P)  # [u], [N]
    if not share_prompt or len(first) == input_ids.shape[0] or R < 2:  # one plain forward
        return model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos, use_cache=False,
                     logits_to_keep=R + 1).logits[:, :-1]  # [N, R, V]
    pre = model(input_ids=input_ids[first, :P], attention_mask=attention_mask[first, :P],
                position_ids=pos[first, :P], use_cache=True, logits_to_keep=1)  # u rows
    cache = pre.past_key_values
    cache.reorder_cache(group)  # [N, ...] each row sees its group's prompt keys/values
    out = model(input_ids=input_ids[:, P:-1], attention_mask=attention_mask[:, :-1], position_ids=pos[:, P:-1],
                past_key_values=cache, use_cache=True)  # [N, R-1, V]
    return torch.cat([pre.logits[group], out.logits], 1)  # [N, R, V]


@torch.inference_mode()
def lean_response_logits(model, input_ids, attention_mask, prompt_length: int,
                         dec: lean_decoder.LeanDecoder | None = None) -> torch.Tensor:
    """:func:`response_logits` through :class:`core.lean_decoder.LeanDecoder` (``dec``, or one built on
    ``model``): the distinct prompts are prefilled once and their cache repeated per row, then the
    response tokens run."""
    P, (N, T) = prompt_length, input_ids.shape
    dec = lean_decoder.LeanDecoder(model) if dec is None else dec
    pos = position_ids(attention_mask)  # [N, T]
    first, group = prompt_groups(input_ids, attention_mask, P)  # [u], [N]
    cos, sin = dec.rope(pos)  # [N, T, 1, D]
    head, cache = dec.prefill(input_ids[first, :P], attention_mask[first, :P], cos[first, :P], sin[first, :P],
                              group, T - 1)  # [N, V] scores token P
    if T - P < 2:
        return head.unsqueeze(1)  # [N, 1, V]
    h = dec.forward(input_ids[:, P:-1], P, cache, cos[:, P:-1], sin[:, P:-1],
                    lean_decoder.continuation_bias(attention_mask[:, :P], attention_mask[:, P:-1]))  # [N, R-1, H]
    return torch.cat([head.unsqueeze(1), dec.logits(h)], 1)  # [N, R, V]


def response_logprobs(model, input_ids, attention_mask, prompt_length: int, temperature: float = 1.0,
                      with_entropy: bool = False, entropy_grad: bool = False, share_prompt: bool = True,
                      packing: bool = False):
    """Log-prob of each response token under ``model`` with logits divided by ``temperature``.

    Returns ``(logprobs [N, R], entropy [N, R] or None)``; position ``t`` scores token ``P + t`` from
    the logits at ``P + t - 1``. Entropy is of the full temperature-scaled distribution, detached
    unless ``entropy_grad`` (an entropy bonus needs its gradient; logging does not). With ``packing``,
    padding-free where the model allows it (then zero on padded response slots; padded slots carry no
    meaning on either path and every consumer masks them).
    """
    fn = packed.forward_for(model) if packing else None
    if fn is not None:
        return fn(model, input_ids, attention_mask, prompt_length, temperature, with_entropy, entropy_grad)
    logits = response_logits(model, input_ids, attention_mask, prompt_length, share_prompt).float()  # [N, R, V]
    return token_logprobs(logits, input_ids[:, prompt_length:], temperature, with_entropy, entropy_grad)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool = False,
                   entropy_grad: bool = False):
    """``(log-prob of targets [N, R], entropy [N, R] or None)`` from ``logits [N, R, V]`` divided by ``temperature``."""
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, -1)  # [N, R, V]
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [N, R]
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = -(logp_all.exp() * logp_all).sum(-1)  # [N, R]
    return logp, entropy


@torch.no_grad()
def chunked_logprobs(model, input_ids, attention_mask, prompt_length: int, temperature: float,
                     micro_batch_size: int, share_prompt: bool = True, lean: bool = False,
                     packing: bool = False) -> torch.Tensor:
    """No-grad :func:`response_logprobs` in chunks of ``micro_batch_size`` rows (old / reference
    policies: the sources' ``log_prob_micro_batch_size`` / ``forward micro batch`` knobs). With
    ``packing`` and a model it covers, padding-free (:mod:`core.packed`); else with ``lean`` and a model
    it covers, through one :class:`core.lean_decoder.LeanDecoder` for all chunks."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    fn = packed.forward_for(model) if packing else None
    dec = (lean_decoder.LeanDecoder(model) if fn is None and lean and lean_decoder.unsupported_reason(model) is None
           else None)
    P, outs = prompt_length, []
    for i in range(0, input_ids.shape[0], micro_batch_size):
        ids, am = input_ids[i:i + micro_batch_size].to(device), attention_mask[i:i + micro_batch_size].to(device)
        if fn is packed.packed_logprobs:  # functional: inference mode is safe and ~10% cheaper per op
            with torch.inference_mode():
                lp, _ = fn(model, ids, am, P, temperature)  # [n, R]
        elif fn is not None:  # the HF module (hooks of PEFT or ZeRO-3 may touch parameters): no_grad only
            lp, _ = fn(model, ids, am, P, temperature)
        else:
            logits = (lean_response_logits(model, ids, am, P, dec) if dec is not None
                      else response_logits(model, ids, am, P, share_prompt))  # [n, R, V]
            lp, _ = token_logprobs(logits.float(), ids[:, P:], temperature)
        outs.append(lp.cpu())
    model.train(was_training)
    return torch.cat(outs)  # [N, R]
