"""Forward passes that turn a rollout into per-token log-probs (and entropies) of its responses.

Logits are computed only where they score a response token (TRL's ``logits_to_keep``). ``packing``
(config ``train.packing``: auto, true, false) decides whether the forward runs padding-free
(:mod:`core.models.packing`, :func:`core.models.packing.packs`) or as one padded forward.
The training forward (inside the optimiser engine) and the no-grad ones (reference and old policy,
:func:`chunked_logprobs`) take the same path, so their log-probs agree to float rounding.
"""
from __future__ import annotations

import torch

from core.models.packing import pack, packs, position_ids, unpack


def response_logprobs(model, input_ids, attention_mask, prompt_length: int, temperature: float = 1.0,
                      with_entropy: bool = False, entropy_grad: bool = False, packing="auto"):
    """Log-prob of each response token under ``model`` with logits divided by ``temperature``.

    Returns ``(logprobs [N, R], entropy [N, R] or None)``; position ``t`` scores token ``P + t`` from
    the logits at ``P + t - 1``. Entropy is of the full temperature-scaled distribution, detached
    unless ``entropy_grad`` (an entropy bonus needs its gradient; logging does not). Padded response
    slots carry no meaning on either path (zero when packed); every consumer masks them.
    """
    P, (N, T) = prompt_length, input_ids.shape
    if T == P:
        empty = input_ids.new_zeros(N, 0, dtype=torch.float32)
        return empty, (empty if with_entropy else None)
    if packs(model, packing):
        rows = pack(input_ids, attention_mask, P, attention_mask[:, P + 1:])
        logits = model(input_ids=rows.input_ids, position_ids=rows.position_ids, use_cache=False,
                       logits_to_keep=rows.source).logits[0]  # [J, V]
        targets = input_ids[:, P:][rows.scored]  # [J]
        lp, ent = token_logprobs(logits.float(), targets, temperature, with_entropy, entropy_grad)
        return unpack(lp, rows), (None if ent is None else unpack(ent, rows))
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask),
                   use_cache=False, logits_to_keep=T - P + 1).logits[:, :-1]  # [N, R, V]
    return token_logprobs(logits.float(), input_ids[:, P:], temperature, with_entropy, entropy_grad)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool = False,
                   entropy_grad: bool = False):
    """``(log-prob of targets [...], entropy [...] or None)`` from ``logits [..., V]`` divided by ``temperature``."""
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, -1)  # [..., V]
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [...]
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = -(logp_all.exp() * logp_all).sum(-1)  # [...]
    return logp, entropy


@torch.no_grad()
def chunked_logprobs(model, input_ids, attention_mask, prompt_length: int, temperature: float,
                     micro_batch_size: int, packing="auto") -> torch.Tensor:
    """No-grad :func:`response_logprobs` in chunks of ``micro_batch_size`` rows (old and reference policies:
    the sources' ``log_prob_micro_batch_size`` / forward micro-batch knobs), in eval mode. ``[N, R]`` on
    the inputs' device."""
    was_training = model.training
    model.eval()
    outs = [response_logprobs(model, input_ids[i:i + micro_batch_size], attention_mask[i:i + micro_batch_size],
                              prompt_length, temperature, packing=packing)[0]
            for i in range(0, input_ids.shape[0], micro_batch_size)]
    model.train(was_training)
    return torch.cat(outs)  # [N, R]
