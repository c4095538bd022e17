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
                       logits_to_keep=rows.source, **rows.attention_kwargs(model)).logits[0]  # [J, V]
        targets = input_ids[:, P:][rows.scored]  # [J]
        lp, ent = token_logprobs(logits.float(), targets, temperature, with_entropy, entropy_grad)
        return unpack(lp, rows), (None if ent is None else unpack(ent, rows))
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask),
                   use_cache=False, logits_to_keep=T - P + 1).logits[:, :-1]  # [N, R, V]
    return token_logprobs(logits.float(), input_ids[:, P:], temperature, with_entropy, entropy_grad)


ENTROPY_CHUNK = 1024  # positions per chunk of the logged (no-grad) entropy


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool = False,
                   entropy_grad: bool = False):
    """``(log-prob of targets [...], entropy [...] or None)`` from ``logits [..., V]`` divided by ``temperature``.

    Memory is what a real vocabulary makes it (152k entries x every response token of a micro-batch): the
    log-prob is ``z_target - logsumexp(z)`` (TRL's ``selective_log_softmax``), which keeps no ``[..., V]``
    log-softmax for backward, and an entropy that is only logged is computed ``ENTROPY_CHUNK`` positions at
    a time without grad (TRL's ``entropy_from_logits``); ``H = logsumexp(z) - sum(softmax(z) z)``."""
    z = logits / temperature if temperature != 1.0 else logits  # [..., V]
    lse = torch.logsumexp(z, -1)  # [...]
    logp = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse  # [...]
    if not with_entropy:
        return logp, None
    if entropy_grad and torch.is_grad_enabled():  # an entropy bonus: differentiated through the full softmax
        return logp, lse - (torch.softmax(z, -1) * z).sum(-1)
    with torch.no_grad():
        flat, entropy = z.reshape(-1, z.shape[-1]), lse.reshape(-1).clone()  # [K, V], [K]
        for i in range(0, flat.shape[0], ENTROPY_CHUNK):
            c = flat[i:i + ENTROPY_CHUNK]  # [k, V]
            entropy[i:i + ENTROPY_CHUNK] -= (torch.softmax(c, -1) * c).sum(-1)
    return logp, entropy.view(lse.shape)


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
