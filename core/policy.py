"""Forward passes that turn a rollout into per-token log-probs (and entropies) of its responses."""
from __future__ import annotations

import torch


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as ``generate`` computes them: ``cumsum(mask) - 1``."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)  # [N, T]


def response_logprobs(model, input_ids, attention_mask, prompt_length: int, temperature: float = 1.0,
                      with_entropy: bool = False):
    """Log-prob of each response token under ``model`` with logits divided by ``temperature``.

    Returns ``(logprobs [N, R], entropy [N, R] or None)``; position ``t`` scores token ``P + t`` from
    the logits at ``P + t - 1``. Entropy is of the full temperature-scaled distribution.
    """
    R = input_ids.shape[1] - prompt_length
    # logits only where they score a response token (TRL's ``logits_to_keep``): the LM head and the
    # softmax skip the prompt positions
    out = model(input_ids=input_ids, attention_mask=attention_mask,
                position_ids=position_ids(attention_mask), use_cache=False, logits_to_keep=R + 1)
    logits = out.logits[:, :-1].float()  # [N, R, V]
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, -1)  # [N, R, V]
    targets = input_ids[:, prompt_length:]  # [N, R]
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [N, R]
    entropy = None
    if with_entropy:
        entropy = -(logp_all.exp() * logp_all).sum(-1)  # [N, R]
    return logp, entropy


@torch.no_grad()
def chunked_logprobs(model, input_ids, attention_mask, prompt_length: int, temperature: float,
                     micro_batch_size: int) -> torch.Tensor:
    """No-grad :func:`response_logprobs` in chunks of ``micro_batch_size`` rows (old / reference
    policies: the sources' ``log_prob_micro_batch_size`` / ``forward micro batch`` knobs)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    outs = []
    for i in range(0, input_ids.shape[0], micro_batch_size):
        lp, _ = response_logprobs(model, input_ids[i:i + micro_batch_size].to(device),
                                  attention_mask[i:i + micro_batch_size].to(device), prompt_length, temperature)
        outs.append(lp.cpu())
    model.train(was_training)
    return torch.cat(outs)  # [N, R]
