"""Padding-free response log-probs of a rollout for Llama-family models, with or without autograd.

The padded forward (:func:`core.policy.response_logprobs`) runs every op over ``N x (P + R)`` slots, most
of them padding once completions differ in length: after the first EOS a row is padding to the
batch's longest completion, and left padding fills the shorter prompts. Here every position-wise op
(norms, projections, RoPE, MLP, LM head, log-softmax) runs on real tokens only, and each distinct
prompt of a GRPO group once: the tokens are packed into one ``[M, H]`` matrix, and only attention
goes back to a padded ``[rows, slots]`` layout (a scatter before it, a gather after it), because on
CPU there is no variable-length attention kernel. This is veRL's ``use_remove_padding`` and
OpenRLHF's ``packing_samples`` for the models :func:`core.lean_decoder.unsupported_reason` covers. A
flash-attn model it does not cover (a PEFT wrapper, ZeRO-3 partitions, sliding windows) runs the HF
module on one packed row instead (:func:`hf_packed_logprobs`: variable-length flash attention); any
other model keeps the padded HF forward (:func:`forward_for` decides).

Which tokens run: the real prompt tokens of each distinct prompt, and response token ``P + t`` only
if the token after it is real (its hidden state scores that token; the EOS, scoring nothing, does
not run). Log-probs (and entropies) come back ``[N, R]``, zero where the response is padding.

:func:`packed_values` does the same for the PPO critic (a ``*ForSequenceClassification`` score head on
the same packed states).

The arithmetic is HF's (RMSNorm in fp32 then the weight, ``x cos + rotate_half(x) sin``, fp32
softmax, the attention module's scaling) in out-of-place ops, so the same function serves the policy
update (gradients equal to the padded HF forward's to float rounding, tests/core/test_packed.py) and
the no-grad reference / old-policy passes. Parameters are read per call (DeepSpeed ZeRO-1/2 and the
torch engine see the ordinary autograd graph over them).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from core import lean_decoder
from core.lean_decoder import (attend_with, attention_bias, continuation_bias, position_ids, prompt_bias,
                               prompt_groups, rms_norm, rope_tables)


CRITIC_ARCHS = frozenset({"LlamaForSequenceClassification", "Qwen2ForSequenceClassification"})


def unsupported_reason(model, archs=lean_decoder._ARCHS) -> str | None:
    """None if :func:`packed_logprobs` (or, with ``archs=CRITIC_ARCHS``, :func:`packed_values`) computes
    what ``model`` computes, else the reason not: what :func:`core.lean_decoder.unsupported_reason` rules
    out, and attention dropout while training (the packed forward applies none)."""
    reason = lean_decoder.unsupported_reason(model, archs)
    if reason is None and model.training and float(getattr(model.config, "attention_dropout", 0.0) or 0.0) > 0:
        return f"attention_dropout={model.config.attention_dropout} in training mode"
    return reason


def forward_for(model):
    """The padding-free log-prob function for ``model``: :func:`packed_logprobs` where the functional
    forward covers it, :func:`hf_packed_logprobs` for a flash-attn model it does not (PEFT wrappers,
    ZeRO-3 partitions, sliding windows included), else None (run padded)."""
    if unsupported_reason(model) is None:
        return packed_logprobs
    if "flash_attention" in str(getattr(model.config, "_attn_implementation", None) or ""):
        return hf_packed_logprobs
    return None


def packed_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int,
                    temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = False):
    """``(log-prob [N, R], entropy [N, R] or None)`` of response tokens ``P .. T-1`` under ``model`` with
    logits divided by ``temperature``, zero on padded response slots; same contract as
    :func:`core.policy.response_logprobs`."""
    P, (N, T) = prompt_length, input_ids.shape
    if T == P:
        empty = input_ids.new_zeros(N, 0, dtype=torch.float32)
        return empty, (empty if with_entropy else None)
    rm = attention_mask[:, P + 1:].bool()  # [N, R-1] response token P+t runs iff token P+t+1 is real
    h, which = _scoring_states(model, input_ids, attention_mask, P, rm)  # [K, H], [N + Mr]
    logits = F.linear(h, model.lm_head.weight, model.lm_head.bias)  # [K, V]
    return _score(logits, which, input_ids, attention_mask, P, rm, temperature, with_entropy, entropy_grad)


def packed_values(critic, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int) -> torch.Tensor:
    """:func:`core.value.token_values` padding-free: ``V(s_t)`` ``[N, R]`` from the score head on the final
    hidden state that predicts response token ``t``, for every ``t`` whose input token is real, the EOS
    included (Open-Instruct's ``score_position: after_last`` trains the critic one step after the EOS);
    zero elsewhere. ``critic`` is a ``LlamaForSequenceClassification`` / ``Qwen2ForSequenceClassification``."""
    P, (N, T) = prompt_length, input_ids.shape
    if T == P:
        return input_ids.new_zeros(N, 0, dtype=torch.float32)
    rm = attention_mask[:, P:T - 1].bool()  # [N, R-1] response token P+t runs iff it is real
    h, which = _scoring_states(critic, input_ids, attention_mask, P, rm)  # [K, H], [N + Mr]
    v = critic.score(h).squeeze(-1).float()  # [K]
    return _unpack(v[which], rm, torch.cat([torch.ones_like(rm[:, :1]), rm], 1))  # [N, R]


def _scoring_states(model, input_ids, attention_mask, P: int, rm: torch.Tensor):
    """Final-norm hidden states ``[K, H]`` of the tokens that predict a response token, and which of them
    predicts each: ``which [N + Mr]`` for response token 0 of every row (its group's last prompt token;
    ``K`` counts each distinct prompt once), then for the response tokens ``rm [N, R-1]`` selects, in
    row-major order (each predicts the next one). Only the real prompt tokens and ``rm`` run."""
    N, T = input_ids.shape
    first, group = prompt_groups(input_ids, attention_mask, P)  # [u], [N]
    u = len(first)
    pm = _left_padded(attention_mask[first, :P].bool())  # [u, P] real prompt tokens
    sel = torch.cat([pm.reshape(-1), rm.reshape(-1)]).nonzero().squeeze(-1)  # [M] slots that run
    Mp = int(pm.sum())  # packed rows [0, Mp) are prompt tokens, [Mp, M) response tokens
    pos = position_ids(attention_mask)  # [N, T]
    ids = torch.cat([input_ids[first, :P].reshape(-1), input_ids[:, P:T - 1].reshape(-1)])[sel]  # [M]
    tok_pos = torch.cat([pos[first, :P].reshape(-1), pos[:, P:T - 1].reshape(-1)])[sel]  # [M]
    cos, sin = rope_tables(model, tok_pos[None])  # [1, M, 1, D]
    h = _decoder(model, ids, sel, u, P, N, T - P - 1, group, cos[0], sin[0], pm, rm)  # [M, H]
    last = pm.sum(1).cumsum(0) - 1  # [u] packed index of each prompt's last token (left padding)
    rows = torch.cat([last, torch.arange(Mp, h.shape[0], device=h.device)])  # [u + Mr]
    norm = model.model.norm
    which = torch.cat([group, u + torch.arange(h.shape[0] - Mp, device=h.device)])  # [N + Mr]
    return rms_norm(h[rows], norm.weight, norm.variance_epsilon), which


def hf_packed_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int,
                       temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = False):
    """:func:`packed_logprobs` through the HF module itself, for models the functional forward does not
    cover that attend with flash-attn: every row's real tokens (its prompt, then the response tokens that
    score a next one) go in one ``[1, M]`` row with position ids restarting at 0 per row, which
    transformers turns into variable-length flash-attn calls (``prepare_fa_kwargs_from_position_ids``;
    with sdpa/eager it would build an ``[M, M]`` block-diagonal mask instead, so those stay padded). No
    prompt sharing: each row carries its own prompt, as in veRL and OpenRLHF."""
    P, (N, T) = prompt_length, input_ids.shape
    if T == P:
        empty = input_ids.new_zeros(N, 0, dtype=torch.float32)
        return empty, (empty if with_entropy else None)
    pm = _left_padded(attention_mask[:, :P].bool())  # [N, P]
    rm = attention_mask[:, P + 1:].bool()  # [N, R-1] response token P+t runs iff token P+t+1 is real
    run = torch.cat([pm, rm], 1)  # [N, T-1] tokens that run, packed row-major
    lens = run.sum(1)  # [N]
    starts = lens.cumsum(0) - lens  # [N] packed index of each row's first token
    M = int(lens.sum())
    row = torch.repeat_interleave(torch.arange(N, device=input_ids.device), lens)  # [M]
    pos = torch.arange(M, device=input_ids.device) - starts[row]  # [M] 0 .. len-1 per row
    is_resp = torch.cat([torch.zeros_like(pm), rm], 1)[run]  # [M]
    keep = torch.cat([starts + pm.sum(1) - 1, is_resp.nonzero().squeeze(-1)])  # [N + Mr] each row's last prompt token, then responses
    logits = model(input_ids=input_ids[:, :T - 1][run][None], position_ids=pos[None], attention_mask=None,
                   use_cache=False, logits_to_keep=keep).logits[0]  # [N + Mr, V]
    which = torch.arange(logits.shape[0], device=logits.device)  # one logits row per scored token
    return _score(logits, which, input_ids, attention_mask, P, rm, temperature, with_entropy, entropy_grad)


def _score(logits, which, input_ids, attention_mask, P: int, rm, temperature: float, with_entropy: bool,
           entropy_grad: bool):
    """Log-probs (and entropies) ``[N, R]`` of the targets from ``logits [K, V]``: scored token ``j`` (response
    token 0 of every row, then the later response tokens in ``rm`` order) reads logits row ``which[j]``."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, -1)  # [K, V]
    target = torch.cat([input_ids[:, P], input_ids[:, P + 1:][rm]])  # [N + Mr]
    lp = _unpack(logp_all[which, target], rm, attention_mask[:, P:])  # [N, R]
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent = -(logp_all.exp() * logp_all).sum(-1)  # [K]
            entropy = _unpack(ent[which], rm, attention_mask[:, P:])  # [N, R]
    return lp, entropy


def _left_padded(pm: torch.Tensor) -> torch.Tensor:
    """``pm [n, P]`` (real prompt tokens) after checking the rollout layout the packed forwards index by."""
    if pm.shape[1] == 0 or not bool(pm[:, -1].all()):
        raise ValueError("packed forwards expect the rollout layout: non-empty prompts, left-padded to the "
                         "prompt length (the last prompt slot of every row a real token)")
    return pm


def _unpack(flat: torch.Tensor, rm: torch.Tensor, resp_mask: torch.Tensor) -> torch.Tensor:
    """``flat [N + Mr]`` (response token 0 of every row, then the packed later tokens) -> ``[N, R]``,
    zero on padded slots."""
    N = rm.shape[0]
    rest = flat.new_zeros(rm.numel()).index_put((rm.reshape(-1).nonzero().squeeze(-1),), flat[N:])  # [N]
    return torch.cat([flat[:N, None], rest.view(N, -1)], 1) * resp_mask  # [N, R]


def _decoder(model, ids, sel, u, P, N, t, group, cos, sin, pm, rm) -> torch.Tensor:
    """Hidden states ``[M, H]`` (before the final norm) of the packed tokens ``ids [M]`` at slots ``sel``
    of the padded layout: ``u`` prompts of ``P`` slots, then ``N`` response rows of ``t`` slots that
    attend to their group's prompt (``group [N]``). ``cos``/``sin`` ``[M, 1, D]`` per packed token."""
    cfg, inner = model.config, model.model
    Hq = cfg.num_attention_heads
    D = getattr(cfg, "head_dim", None) or cfg.hidden_size // Hq
    blocks = (u * P, N * t)  # slots of the prompt block, then of the response block
    Hkv, dtype = cfg.num_key_value_heads, inner.embed_tokens.weight.dtype
    p_bias = attention_bias(prompt_bias(pm), Hq, Hkv, dtype)  # from [u, 1, 1, P, P], once for all layers
    r_bias = attention_bias(continuation_bias(pm[group], rm), Hq, Hkv, dtype)  # from [N, 1, 1, t, P + t]
    emb = inner.embed_tokens  # its padding_idx row gets no gradient from the inputs, as in the HF module
    h = F.embedding(ids, emb.weight, emb.padding_idx)  # [M, H]
    M = h.shape[0]

    def padded(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Packed ``[M, heads, D]`` -> prompt block ``[u, P, heads, D]`` and response block ``[N, t, heads, D]``
        (zeros on unused slots; the split, unlike slicing twice, back-propagates without zero-filling)."""
        full = z.new_zeros(sum(blocks), *z.shape[1:]).index_copy(0, sel, z)  # [S, heads, D]
        zp, zr = full.split(blocks)
        return zp.view(u, P, *z.shape[1:]), zr.view(N, t, *z.shape[1:])

    for layer in inner.layers:
        a, mlp = layer.self_attn, layer.mlp
        x = rms_norm(h, layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon)  # [M, H]
        q = _rotate(F.linear(x, a.q_proj.weight, a.q_proj.bias).view(M, -1, D), cos, sin)  # [M, Hq, D]
        k = _rotate(F.linear(x, a.k_proj.weight, a.k_proj.bias).view(M, -1, D), cos, sin)  # [M, Hkv, D]
        v = F.linear(x, a.v_proj.weight, a.v_proj.bias).view(M, -1, D)  # [M, Hkv, D]
        (q_p, q_r), (k_p, k_r), (v_p, v_r) = padded(q), padded(k), padded(v)
        o_p = _attention(q_p, k_p, v_p, p_bias, a.scaling)  # [u, P, Hq D]
        o_r = (q.new_zeros(N, 0, Hq * D) if t == 0 else  # keys: the group's prompt, then the row's own
               _attention(q_r, k_r, v_r, r_bias, a.scaling, k_p[group], v_p[group]))  # [N, t, Hq D]
        o = torch.cat([o_p.reshape(blocks[0], Hq * D), o_r.reshape(blocks[1], Hq * D)]).index_select(0, sel)  # [M, Hq D]
        h = h + F.linear(o, a.o_proj.weight, a.o_proj.bias)
        x = rms_norm(h, layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon)
        gate, up = F.linear(x, mlp.gate_proj.weight, mlp.gate_proj.bias), F.linear(x, mlp.up_proj.weight, mlp.up_proj.bias)
        h = h + F.linear(F.silu(gate) * up, mlp.down_proj.weight, mlp.down_proj.bias)
    return h


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE ``x cos + rotate_half(x) sin`` of ``x [M, heads, D]``; ``sin`` carries rotate_half's sign."""
    return torch.addcmul(x * cos, torch.roll(x, x.shape[-1] // 2, -1), sin)


def _attention(q, k, v, bias, scaling: float, pre_k=None, pre_v=None) -> torch.Tensor:
    """Attention of queries ``q [n, t, Hq, D]`` over the prefix keys/values ``pre_k``/``pre_v`` ``[n, L0, Hkv,
    D]`` (if any) then the rows' own ``k``/``v`` ``[n, t, Hkv, D]``, with ``bias`` from
    :func:`core.lean_decoder.attention_bias` -> ``[n, t, Hq D]``."""
    n, t, Hq, D = q.shape
    Hkv = k.shape[2]
    k, v = k.transpose(1, 2), v.transpose(1, 2)  # [n, Hkv, t, D]
    if pre_k is not None:
        k, v = torch.cat([pre_k.transpose(1, 2), k], 2), torch.cat([pre_v.transpose(1, 2), v], 2)  # [n, Hkv, L, D]
    q = q.reshape(n, t, Hkv, Hq // Hkv, D).permute(0, 2, 3, 1, 4)  # [n, Hkv, rep, t, D]: head j rep + r reads kv head j
    return attend_with(q, k, v, bias, scaling)
