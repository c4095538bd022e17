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
        lp, ent = token_logprobs(logits, targets, temperature, with_entropy, entropy_grad)
        return unpack(lp, rows), (None if ent is None else unpack(ent, rows))
    # the scoring positions P - 1 .. T - 2 only, so the logits come out contiguous (no copy to flatten them)
    scoring = torch.arange(P - 1, T - 1, device=input_ids.device)  # [R]
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask),
                   use_cache=False, logits_to_keep=scoring).logits  # [N, R, V] in the model's dtype
    return token_logprobs(logits, input_ids[:, P:], temperature, with_entropy, entropy_grad)


CHUNK = 1024  # positions per chunk: each chunk's fp32 temporaries are CHUNK x V x 4 bytes (623 MB at V = 152k)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool = False,
                   entropy_grad: bool = False):
    """``(log-prob of targets [...], entropy [...] or None)``, fp32, from ``logits [..., V]`` (any float dtype,
    contiguous) divided by ``temperature``.

    Memory is what a real vocabulary makes it (152k entries x every response token of a micro-batch: 10 GB of
    bf16 logits for 32k positions). The upcast to fp32, the temperature division and the softmax happen
    ``CHUNK`` positions at a time, forward and backward (:class:`_ChunkedLogSoftmax`), so no ``[..., V]`` fp32
    copy ever exists: TRL's ``selective_log_softmax`` (``z_target - logsumexp(z)``, no whole-tensor upcast)
    and ``entropy_from_logits`` (chunked), with the backward chunked too. The entropy
    ``H = logsumexp(z) - sum(softmax(z) z)`` is detached unless ``entropy_grad`` (an entropy bonus)."""
    V = logits.shape[-1]
    logp, entropy = _ChunkedLogSoftmax.apply(logits.reshape(-1, V), targets.reshape(-1), float(temperature),
                                             with_entropy)  # [K], [K] or [0]
    if not with_entropy:
        return logp.view(targets.shape), None
    return logp.view(targets.shape), (entropy if entropy_grad else entropy.detach()).view(targets.shape)


class _ChunkedLogSoftmax(torch.autograd.Function):
    """Target log-probs and entropies of ``logits [K, V] / T``, computed and differentiated ``CHUNK`` rows at a
    time. Saved for backward: the logits themselves (the model's output, already in memory) and the per-row
    ``logsumexp`` and entropy ``[K]``; backward recomputes each chunk's softmax and writes its gradient, divided
    by ``T``, into a gradient in the logits' dtype (what autograd of ``logits.float() / T`` gives). Peak beyond
    the logits and their gradient: two ``[CHUNK, V]`` fp32 temporaries (each chunk's work is a function call,
    so one chunk's temporaries are freed before the next chunk's exist)."""

    @staticmethod
    def forward(ctx, logits, targets, temperature: float, with_entropy: bool):
        K = logits.shape[0]
        lse = logits.new_empty(K, dtype=torch.float32)  # [K]
        logp = torch.empty_like(lse)  # [K]
        entropy = torch.empty_like(lse) if with_entropy else lse.new_empty(0)  # [K] or [0]
        for i in range(0, K, CHUNK):
            rows = slice(i, i + CHUNK)
            out = _chunk_forward(logits[rows], targets[rows], temperature, with_entropy)
            lse[rows], logp[rows] = out[:2]
            if with_entropy:
                entropy[rows] = out[2]
        ctx.save_for_backward(logits, targets, lse, entropy)
        ctx.temperature = temperature
        ctx.set_materialize_grads(False)  # an output nobody differentiates gets None, not a zero tensor
        return logp, entropy

    @staticmethod
    def backward(ctx, g_logp, g_entropy):
        logits, targets, lse, entropy = ctx.saved_tensors
        grad = torch.empty_like(logits)  # [K, V] in the logits' dtype
        for i in range(0, logits.shape[0], CHUNK):
            rows = slice(i, i + CHUNK)
            grad[rows] = _chunk_grad(logits[rows], targets[rows], ctx.temperature, lse[rows],
                                     None if g_logp is None else g_logp[rows],
                                     None if g_entropy is None else (entropy[rows], g_entropy[rows]))
        return grad, None, None, None


def _chunk_forward(logits, targets, temperature: float, with_entropy: bool):
    """``(logsumexp [k], target log-prob [k], entropy [k] if with_entropy)`` of one chunk ``logits [k, V]``."""
    z = logits.float() / temperature  # [k, V] fp32
    lse = torch.logsumexp(z, -1)  # [k]
    logp = z.gather(-1, targets[:, None]).squeeze(-1) - lse  # [k]
    if not with_entropy:
        return lse, logp
    return lse, logp, lse - torch.softmax(z, -1).mul_(z).sum(-1)  # H = lse - sum(p z)


def _chunk_grad(logits, targets, temperature: float, lse, g_logp, entropy_and_grad) -> torch.Tensor:
    """``d(sum g_lp logp + g_H H) / d logits`` of one chunk ``logits [k, V]``, fp32 ``[k, V]``:
    ``(g_lp (onehot(target) - p) - g_H p (z - sum(p z))) / T`` with ``p = softmax(z)``, ``z = logits / T``;
    computed as ``-p w + g_lp onehot`` with ``w = g_lp + g_H (z - sum(p z))``, in place where it can be."""
    z = logits.float() / temperature  # [k, V]
    p = (z - lse[:, None]).exp_()  # [k, V] softmax(z)
    if entropy_and_grad is None:
        w = g_logp[:, None]  # [k, 1]
    else:  # sum(p z) = lse - H; z is not needed again, so w overwrites it
        entropy, g_entropy = entropy_and_grad
        w = z.sub_((lse - entropy)[:, None]).mul_(g_entropy[:, None])  # [k, V]
        if g_logp is not None:
            w.add_(g_logp[:, None])
    dz = p.mul_(w).neg_()  # [k, V]
    if g_logp is not None:
        dz.scatter_add_(-1, targets[:, None], g_logp[:, None])
    return dz.div_(temperature)


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
