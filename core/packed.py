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
the no-grad reference / old-policy passes. Under autograd, float32 models run it as one graph node with
the hand-written backward of :mod:`core.packed_backward` (:class:`_ManualBackward`;
:func:`manual_backward_reason` says when autograd differentiates it instead). Parameters are read
per call, and are that node's inputs, so DeepSpeed ZeRO-1/2 and the torch engine see ordinary
gradients on them. The GEMMs that autograd does not differentiate go through :mod:`core.gemm` (oneDNN on
CPU); for it, the packed rows are rounded up with filler tokens (:class:`_Layout`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from core import gemm, lean_decoder
from core import packed_backward as PB
from core.lean_decoder import (attend, attend_with, attention_bias, continuation_bias, position_ids, prompt_bias,
                               prompt_groups, residual, rms_norm, rms_scale, rope_tables)


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
    :func:`core.policy.response_logprobs`. Under autograd, where :func:`manual_backward_reason` allows,
    the whole forward is one graph node with the hand-written backward of :mod:`core.packed_backward`."""
    P, (N, T) = prompt_length, input_ids.shape
    if T == P:
        empty = input_ids.new_zeros(N, 0, dtype=torch.float32)
        return empty, (empty if with_entropy else None)
    rm = attention_mask[:, P + 1:].bool()  # [N, R-1] response token P+t runs iff token P+t+1 is real
    lay = _layout_for(model, input_ids, attention_mask, P, rm)
    target = _targets(input_ids, P, rm)  # [N + Mr]
    params = _parameters(model) if torch.is_grad_enabled() else []
    if any(p is not None and p.requires_grad for p in params) and manual_backward_reason(model, lay) is None:
        lp, ent = _ManualBackward.apply(model, lay, target, float(temperature), with_entropy, entropy_grad, *params)
    else:
        _, logits = _lm_head(model, _decoder(model, lay)[lay.rows])  # [K, V]
        lp, ent = _score(logits, lay.which, target, temperature, with_entropy, entropy_grad)  # [N + Mr] x2
    return _unpack_both(lp, ent, rm, attention_mask[:, P:])


def packed_values(critic, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int) -> torch.Tensor:
    """:func:`core.value.token_values` padding-free: ``V(s_t)`` ``[N, R]`` from the score head on the final
    hidden state that predicts response token ``t``, for every ``t`` whose input token is real, the EOS
    included (Open-Instruct's ``score_position: after_last`` trains the critic one step after the EOS);
    zero elsewhere. ``critic`` is a ``LlamaForSequenceClassification`` / ``Qwen2ForSequenceClassification``."""
    P, (N, T) = prompt_length, input_ids.shape
    if T == P:
        return input_ids.new_zeros(N, 0, dtype=torch.float32)
    rm = attention_mask[:, P:T - 1].bool()  # [N, R-1] response token P+t runs iff it is real
    lay = _layout_for(critic, input_ids, attention_mask, P, rm)
    norm = critic.model.norm
    h = rms_norm(_decoder(critic, lay)[lay.rows], norm.weight, norm.variance_epsilon)  # [K, H]
    v = critic.score(h).squeeze(-1).float()  # [K]
    return _unpack(v[lay.which], rm, torch.cat([torch.ones_like(rm[:, :1]), rm], 1))  # [N, R]


@dataclass
class _Layout:
    """Which tokens run and where they sit: packed token ``i < M`` is ``ids[i]`` at slot ``sel[i]`` of the padded
    layout (``u`` prompts of ``P`` slots, then ``N`` response rows of ``t`` slots attending to their group's
    prompt, ``group [N]``), rotated by ``cos``/``sin`` ``[M', 1, D]``; ``p_bias``/``r_bias`` are the two blocks'
    attention masks (:func:`core.lean_decoder.attention_bias`). The packed rows ``rows [K]`` feed the final
    norm and LM head, and scored token ``j`` (response token 0 of every row, its group's last prompt
    token, then the later response tokens in ``rm`` order) reads row ``which[j]`` of those.

    ``M' >= M`` (:func:`core.gemm.padded_rows`): where oneDNN runs the GEMMs, ``M' - M`` filler tokens
    (token 0 at position 0) round the packed rows up to a size oneDNN has compiled kernels for. They
    attend to nothing and nothing attends to them: ``gather [M']`` reads attention outputs (and, in the
    backward, their gradients) at ``sel`` for real tokens and from an appended zero row for fillers, so
    a filler's gradient is exactly zero and adds nothing to any parameter's."""

    ids: torch.Tensor
    sel: torch.Tensor
    gather: torch.Tensor
    pad: torch.Tensor  # the padded layout's other slots, the ones no token fills
    u: int
    P: int
    N: int
    t: int
    group: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    p_bias: torch.Tensor
    r_bias: torch.Tensor
    rows: torch.Tensor
    which: torch.Tensor


def _layout(model, input_ids, attention_mask, P: int, rm: torch.Tensor) -> _Layout:
    """The :class:`_Layout` of a rollout batch: the real prompt tokens of each distinct prompt and the
    response tokens ``rm [N, R-1]`` selects run (each predicts the next one)."""
    N, T = input_ids.shape
    cfg = model.config
    first, group = prompt_groups(input_ids, attention_mask, P)  # [u], [N]
    u = len(first)
    pm = _left_padded(attention_mask[first, :P].bool())  # [u, P] real prompt tokens
    runs = torch.cat([pm.reshape(-1), rm.reshape(-1)])  # [S] slots of the padded layout
    sel, pad = runs.nonzero().squeeze(-1), (~runs).nonzero().squeeze(-1)  # [M] slots that run, [S - M] the rest
    Mp = int(pm.sum())  # packed rows [0, Mp) are prompt tokens, [Mp, M) response tokens
    pos = position_ids(attention_mask)  # [N, T]
    M, S, dtype = len(sel), len(runs), model.model.embed_tokens.weight.dtype
    fill = gemm.padded_rows(M, dtype, input_ids.device) - M  # filler tokens
    ids = torch.cat([input_ids[first, :P].reshape(-1), input_ids[:, P:T - 1].reshape(-1)])[sel]  # [M]
    tok_pos = torch.cat([pos[first, :P].reshape(-1), pos[:, P:T - 1].reshape(-1)])[sel]  # [M]
    ids, tok_pos = F.pad(ids, (0, fill)), F.pad(tok_pos, (0, fill))  # [M']
    cos, sin = rope_tables(model, tok_pos[None])  # [1, M', 1, D]
    last = pm.sum(1).cumsum(0) - 1  # [u] packed index of each prompt's last token (left padding)
    Hq, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    return _Layout(
        ids=ids, sel=sel, gather=F.pad(sel, (0, fill), value=S), pad=pad, u=u, P=P, N=N, t=T - P - 1, group=group,
        cos=cos[0], sin=sin[0],
        p_bias=attention_bias(prompt_bias(pm), Hq, Hkv, dtype),  # from [u, 1, 1, P, P]
        r_bias=attention_bias(continuation_bias(pm[group], rm), Hq, Hkv, dtype),  # from [N, 1, 1, t, P + t]
        rows=torch.cat([last, torch.arange(Mp, M, device=ids.device)]),  # [u + Mr]
        which=torch.cat([group, u + torch.arange(M - Mp, device=ids.device)]))  # [N + Mr]


_LAST: list = []  # [(key, layout)]: the last batch :func:`_layout_for` laid out


def _layout_for(model, input_ids, attention_mask, P: int, rm: torch.Tensor) -> _Layout:
    """:func:`_layout`, or the last one it built if the batch and what the layout reads of the model are the
    same: a rollout's reference, old-policy and training forwards lay out the same tokens (1.1 ms each on
    the tiny GRPO step, docs/performance.md). Equality is checked on the tensors themselves (held, not
    copied; one changed in place since is a miss). Built outside inference mode, so that a training
    forward differentiated by autograd may save its tensors. The last layout (masks and RoPE tables of one
    batch) stays alive until another batch replaces it; a critic's layout (other scored slots) is a miss."""
    rot, cfg = model.model.rotary_emb, model.config
    sig = (P, cfg.num_attention_heads, cfg.num_key_value_heads, model.model.embed_tokens.weight.dtype,
           getattr(rot, "rope_type", None), float(getattr(rot, "attention_scaling", 1.0)), lean_decoder._SDPA_ABOVE,
           gemm.backend())
    data = (input_ids, attention_mask, rm, rot.inv_freq)
    if _LAST:
        (sig0, data0, versions0), lay = _LAST[0]
        if sig0 == sig and all(_version(a) == v and a.device == b.device and torch.equal(a, b)
                               for a, b, v in zip(data0, data, versions0)):
            return lay
    with torch.inference_mode(False):
        lay = _layout(model, input_ids, attention_mask, P, rm)
    _LAST[:] = [((sig, data, tuple(_version(a) for a in data)), lay)]
    return lay


def _version(t: torch.Tensor) -> int | None:
    """``t``'s in-place version counter (inference tensors keep none)."""
    return None if t.is_inference() else t._version


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
    lp, ent = _score(logits, which, _targets(input_ids, P, rm), temperature, with_entropy, entropy_grad)
    return _unpack_both(lp, ent, rm, attention_mask[:, P:])


def _targets(input_ids: torch.Tensor, P: int, rm: torch.Tensor) -> torch.Tensor:
    """The scored tokens ``[N + Mr]``: response token 0 of every row, then the later ones ``rm`` selects."""
    return torch.cat([input_ids[:, P], input_ids[:, P + 1:][rm]])


def _lm_head(model, hs: torch.Tensor, keep: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(final-norm states [K, H], logits [K, V])`` of the hidden states ``hs [K, H]``; ``keep`` as :func:`_norm`
    takes it (key ``"norm"``)."""
    hf = _norm(hs, model.model.norm, keep, "norm")
    return hf, gemm.linear(hf, model.lm_head.weight, model.lm_head.bias)


def _log_probs(logits, temperature: float, with_entropy: bool, entropy_grad: bool):
    """``(log_softmax(logits / T) [K, V], entropy per row [K] or None)``, in float32."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, -1)  # [K, V]
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = -(logp.exp() * logp).sum(-1)  # [K]
    return logp, entropy


def _score(logits, which, target, temperature: float, with_entropy: bool, entropy_grad: bool):
    """Log-probs (and entropies) ``[J]`` of the scored tokens ``target [J]`` from ``logits [K, V]``: scored
    token ``j`` reads logits row ``which[j]``."""
    logp, entropy = _log_probs(logits, temperature, with_entropy, entropy_grad)
    return logp[which, target], (None if entropy is None else entropy[which])


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


def _unpack_both(lp: torch.Tensor, ent: torch.Tensor | None, rm: torch.Tensor, resp_mask: torch.Tensor):
    """:func:`_unpack` of the log-probs and (if any) the entropies."""
    return _unpack(lp, rm, resp_mask), (None if ent is None else _unpack(ent, rm, resp_mask))


def _decoder(model, lay: _Layout, saved: list | None = None) -> torch.Tensor:
    """Hidden states ``[M, H]`` (before the final norm) of the packed tokens of ``lay``. With ``saved`` (a
    list, no autograd), per layer the activations :func:`_layer_backward` reads are appended."""
    cfg, inner = model.config, model.model
    Hq = cfg.num_attention_heads
    D = getattr(cfg, "head_dim", None) or cfg.hidden_size // Hq
    u, P, N, t, cos, sin = lay.u, lay.P, lay.N, lay.t, lay.cos, lay.sin
    blocks = (u * P, N * t)  # slots of the prompt block, then of the response block
    emb = inner.embed_tokens  # its padding_idx row gets no gradient from the inputs, as in the HF module
    h = F.embedding(lay.ids, emb.weight, emb.padding_idx)  # [M', H]
    M = h.shape[0]

    def padded(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Packed ``[M, heads, D]`` -> prompt block ``[u, P, heads, D]`` and response block ``[N, t, heads, D]``
        (the split, unlike slicing twice, back-propagates without zero-filling)."""
        zp, zr = _to_padded(z, lay).split(blocks)  # [S, heads, D] split
        return zp.view(u, P, *z.shape[1:]), zr.view(N, t, *z.shape[1:])

    for layer in inner.layers:
        a, mlp = layer.self_attn, layer.mlp
        keep = None if saved is None else {}
        x = _norm(h, layer.input_layernorm, keep, "n1")  # [M, H]
        q = _rotate(gemm.linear(x, a.q_proj.weight, a.q_proj.bias).view(M, -1, D), cos, sin)  # [M, Hq, D]
        k = _rotate(gemm.linear(x, a.k_proj.weight, a.k_proj.bias).view(M, -1, D), cos, sin)  # [M, Hkv, D]
        v = gemm.linear(x, a.v_proj.weight, a.v_proj.bias).view(M, -1, D)  # [M, Hkv, D]
        (q_p, q_r), (k_p, k_r), (v_p, v_r) = padded(q), padded(k), padded(v)
        att = None if saved is None else []
        o_p = _attention(q_p, k_p, v_p, lay.p_bias, a.scaling, saved=att)  # [u, P, Hq D]
        o_r = (q.new_zeros(N, 0, Hq * D) if t == 0 else  # keys: the group's prompt, then the row's own
               _attention(q_r, k_r, v_r, lay.r_bias, a.scaling, k_p[lay.group], v_p[lay.group], saved=att))  # [N, t, Hq D]
        o = _packed([o_p.reshape(blocks[0], Hq * D), o_r.reshape(blocks[1], Hq * D)], lay)  # [M', Hq D]
        h = residual(h, o, a.o_proj.weight.t(), a.o_proj.bias)  # [M, H]
        x2 = _norm(h, layer.post_attention_layernorm, keep, "n2")
        gate, up = gemm.linear(x2, mlp.gate_proj.weight, mlp.gate_proj.bias), gemm.linear(x2, mlp.up_proj.weight, mlp.up_proj.bias)
        act_gate = F.silu(gate)  # [M, I]
        act = act_gate * up
        if keep is not None:
            keep.update(x=x, att=att, o=o, x2=x2, gate=gate, up=up, act_gate=act_gate, act=act)
            saved.append(keep)
        h = residual(h, act, mlp.down_proj.weight.t(), mlp.down_proj.bias)
    return h


def _to_padded(z: torch.Tensor, lay: _Layout) -> torch.Tensor:
    """Packed rows ``z [M, ...]`` -> the padded attention layout ``[S, ...]`` (prompt block, then response
    block): each token at its slot, zeros written on the unused slots alone (a masked key must still be
    finite, or its score is NaN)."""
    full = z.new_empty(lay.u * lay.P + lay.N * lay.t, *z.shape[1:])
    return full.index_copy_(0, lay.sel, z[:len(lay.sel)]).index_fill_(0, lay.pad, 0.0)


def _packed(blocks: list[torch.Tensor], lay: _Layout) -> torch.Tensor:
    """The padded layout's blocks ``[slots, ...]`` (prompt, then response) -> packed rows ``[M', ...]``: each
    token's slot, and a zero row for each filler (:class:`_Layout`)."""
    if len(lay.gather) > len(lay.sel):
        blocks = [*blocks, blocks[0].new_zeros(1, *blocks[0].shape[1:])]
    return torch.cat(blocks).index_select(0, lay.gather)


def _norm(h: torch.Tensor, ln, keep: dict | None, key: str) -> torch.Tensor:
    """The RMSNorm module ``ln`` of ``h [M, H]``; with ``keep`` (the hand-written backward's float32 path), its
    normalisation ``(x_hat, r)`` (:func:`core.lean_decoder.rms_scale`) goes to ``keep[key]`` for
    :func:`core.packed_backward.rms_norm_backward`, which would otherwise compute it again."""
    if keep is None:
        return rms_norm(h, ln.weight, ln.variance_epsilon)
    keep[key] = rms_scale(h, ln.variance_epsilon)
    return ln.weight * keep[key][0]  # rms_norm's arithmetic in float32


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE ``x cos + rotate_half(x) sin`` of ``x [M, heads, D]``; ``sin`` carries rotate_half's sign."""
    return torch.addcmul(x * cos, torch.roll(x, x.shape[-1] // 2, -1), sin)


def _attention(q, k, v, bias, scaling: float, pre_k=None, pre_v=None, saved: list | None = None) -> torch.Tensor:
    """Attention of queries ``q [n, t, Hq, D]`` over the prefix keys/values ``pre_k``/``pre_v`` ``[n, L0, Hkv,
    D]`` (if any) then the rows' own ``k``/``v`` ``[n, t, Hkv, D]``, with ``bias`` from
    :func:`core.lean_decoder.attention_bias` -> ``[n, t, Hq D]``."""
    n, t, Hq, D = q.shape
    Hkv = k.shape[2]
    k, v = k.transpose(1, 2), v.transpose(1, 2)  # [n, Hkv, t, D]
    if pre_k is not None:
        k, v = torch.cat([pre_k.transpose(1, 2), k], 2), torch.cat([pre_v.transpose(1, 2), v], 2)  # [n, Hkv, L, D]
    q = q.reshape(n, t, Hkv, Hq // Hkv, D).permute(0, 2, 3, 1, 4)  # [n, Hkv, rep, t, D]: head j rep + r reads kv head j
    return attend_with(q, k, v, bias, scaling) if saved is None else attend(q, k, v, bias, scaling, saved)


# Under autograd: the packed forward as one graph node with a hand-written backward

MANUAL_BACKWARD = True  # False: let autograd differentiate the functional forward (A/B, debugging)

# per decoder layer, in the order _ManualBackward takes them (a missing bias is None)
_LAYER_PARAMS = ("input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.q_proj.bias",
                 "self_attn.k_proj.weight", "self_attn.k_proj.bias", "self_attn.v_proj.weight",
                 "self_attn.v_proj.bias", "self_attn.o_proj.weight", "self_attn.o_proj.bias",
                 "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.gate_proj.bias",
                 "mlp.up_proj.weight", "mlp.up_proj.bias", "mlp.down_proj.weight", "mlp.down_proj.bias")


def manual_backward_reason(model, lay: _Layout) -> str | None:
    """None if the update's backward through :func:`packed_logprobs` is the hand-written one, else why
    autograd differentiates the functional forward instead."""
    if not MANUAL_BACKWARD:
        return "core.packed.MANUAL_BACKWARD is off"
    dtype = model.model.embed_tokens.weight.dtype
    if dtype != torch.float32:
        return f"parameters in {dtype} (the hand-written backward is float32)"
    if lay.p_bias.dim() != 3 or lay.r_bias.dim() != 3:
        return "attention runs through SDPA (score tensors above lean_decoder._SDPA_ABOVE elements)"
    return None


def _parameters(model) -> list:
    """The tensors the packed forward reads: embedding, per layer :data:`_LAYER_PARAMS`, final norm, LM head."""
    def get(obj, path):
        for name in path.split("."):
            obj = getattr(obj, name)
        return obj

    inner = model.model
    return ([inner.embed_tokens.weight] + [get(layer, n) for layer in inner.layers for n in _LAYER_PARAMS]
            + [inner.norm.weight, model.lm_head.weight, model.lm_head.bias])


class _ManualBackward(torch.autograd.Function):
    """:func:`packed_logprobs` under autograd as one node: the forward runs without a graph and keeps the
    activations :func:`_layer_backward` reads; the backward is :mod:`core.packed_backward`'s closed forms.
    Returns the scored tokens' ``(log-probs [J], entropies [J] or None)``."""

    @staticmethod
    def forward(ctx, model, lay, target, temperature, with_entropy, entropy_grad, *params):
        saved = []
        hs = _decoder(model, lay, saved)[lay.rows]  # [K, H]
        head = {}
        hf, logits = _lm_head(model, hs, head)  # [K, H], [K, V]
        logp, ent_k = _log_probs(logits, temperature, with_entropy, False)  # [K, V], [K] or None
        ctx.model, ctx.lay, ctx.target, ctx.temperature = model, lay, target, temperature
        ctx.acts, ctx.entropy_grad = (saved, head["norm"], hf, logp, ent_k), with_entropy and entropy_grad
        lp, ent = logp[lay.which, target], (None if ent_k is None else ent_k[lay.which])  # [J] x2
        if ent is not None and not ctx.entropy_grad:
            ctx.mark_non_differentiable(ent)
        return lp, ent

    @staticmethod
    def backward(ctx, d_lp, d_ent):
        model, lay, inner = ctx.model, ctx.lay, ctx.model.model
        saved, norm_scale, hf, logp, ent_k = ctx.acts
        d_lp = torch.zeros_like(lay.which, dtype=logp.dtype) if d_lp is None else d_lp
        dz = PB.score_backward(d_lp, d_ent if ctx.entropy_grad else None, logp, ent_k, lay.which, ctx.target,
                               ctx.temperature)  # [K, V]
        lm = model.lm_head
        dhf, d_lm, db_lm = PB.linear_backward(dz, hf, lm.weight, lm.bias is not None)  # [K, H]
        dhs, d_norm = PB.rms_norm_backward(dhf, *norm_scale, inner.norm.weight)  # [K, H]
        dh = dhs.new_zeros(len(lay.ids), dhs.shape[1]).index_add_(0, lay.rows, dhs)  # [M', H]
        grads = []
        for layer, keep in reversed(list(zip(inner.layers, saved))):
            dh, g = _layer_backward(layer, model.config, lay, keep, dh)
            grads = g + grads
        emb = inner.embed_tokens
        if emb.padding_idx is not None:  # F.embedding's padding_idx: that row gets nothing from the inputs
            dh = dh.masked_fill_((lay.ids == emb.padding_idx)[:, None], 0.0)
        d_emb = torch.zeros_like(emb.weight).index_add_(0, lay.ids, dh)  # [V, H]
        return (None,) * 6 + tuple([d_emb] + grads + [d_norm, d_lm, db_lm])


def _layer_backward(layer, cfg, lay: _Layout, keep: dict, dh: torch.Tensor):
    """``(dL/d input [M, H], gradients in :data:`_LAYER_PARAMS` order)`` of one decoder layer given
    ``dh = dL/d output [M, H]`` and the activations ``keep`` :func:`_decoder` saved."""
    a, mlp = layer.self_attn, layer.mlp
    ln1, ln2 = layer.input_layernorm, layer.post_attention_layernorm
    Hq, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    D = getattr(cfg, "head_dim", None) or cfg.hidden_size // Hq
    u, P, N, t, M = lay.u, lay.P, lay.N, lay.t, dh.shape[0]
    # MLP: h_out = h2 + down(silu(gate(x2)) * up(x2)), x2 = norm2(h2)
    da, d_down, db_down = PB.linear_backward(dh, keep["act"], mlp.down_proj.weight, mlp.down_proj.bias is not None)
    dgate, dup = PB.swiglu_backward(da, keep["gate"], keep["up"], keep["act_gate"])  # [M, I] x2
    dx2, d_gate, db_gate = PB.linear_backward(dgate, keep["x2"], mlp.gate_proj.weight, mlp.gate_proj.bias is not None)
    dx2u, d_up, db_up = PB.linear_backward(dup, keep["x2"], mlp.up_proj.weight, mlp.up_proj.bias is not None)
    dh2, d_ln2 = PB.rms_norm_backward(dx2.add_(dx2u), *keep["n2"], ln2.weight)
    dh2 += dh  # the residual
    # attention: h2 = h + o_proj(attention(rope(q(x)), rope(k(x)), v(x))), x = norm1(h)
    do, d_o, db_o = PB.linear_backward(dh2, keep["o"], a.o_proj.weight, a.o_proj.bias is not None)  # [M, Hq D]
    do_p, do_r = _to_padded(do, lay).split((u * P, N * t))
    att = keep["att"]
    dq_p, dk_p, dv_p = _block_backward(do_p.view(u, P, Hq * D), att[0], a.scaling, Hkv, D)
    blocks = [(dq_p, dk_p, dv_p)]
    if t > 0:
        dq_r, dk_rf, dv_rf = _block_backward(do_r.view(N, t, Hq * D), att[1], a.scaling, Hkv, D)  # keys [N, P + t, ...]
        dk_p.index_add_(0, lay.group, dk_rf[:, :P])  # the group's prompt keys/values, read by each of its rows
        dv_p.index_add_(0, lay.group, dv_rf[:, :P])
        blocks.append((dq_r, dk_rf[:, P:], dv_rf[:, P:]))
    dq, dk, dv = (_packed([b[i].reshape(-1, *b[i].shape[2:]) for b in blocks], lay) for i in range(3))  # [M', heads, D]
    dq, dk = PB.rope_backward(dq, lay.cos, lay.sin), PB.rope_backward(dk, lay.cos, lay.sin)
    x = keep["x"]
    dx, d_q, db_q = PB.linear_backward(dq.reshape(M, -1), x, a.q_proj.weight, a.q_proj.bias is not None)
    dxk, d_k, db_k = PB.linear_backward(dk.reshape(M, -1), x, a.k_proj.weight, a.k_proj.bias is not None)
    dxv, d_v, db_v = PB.linear_backward(dv.reshape(M, -1), x, a.v_proj.weight, a.v_proj.bias is not None)
    dh1, d_ln1 = PB.rms_norm_backward(dx.add_(dxk).add_(dxv), *keep["n1"], ln1.weight)
    return dh2.add_(dh1), [d_ln1, d_q, db_q, d_k, db_k, d_v, db_v, d_o, db_o, d_ln2, d_gate, db_gate, d_up, db_up,
                           d_down, db_down]


def _block_backward(do: torch.Tensor, att: tuple, scaling: float, Hkv: int, D: int):
    """``(dq [n, t, Hq, D], dk, dv [n, L, Hkv, D])`` of one attention block of :func:`_attention` given its
    output gradient ``do [n, t, Hq D]`` and the batched tensors :func:`core.lean_decoder.attend` saved."""
    qb, kb, vb, p = att
    n, t = do.shape[:2]
    rep, L = qb.shape[1] // t, kb.shape[1]
    dob = do.view(n, t, Hkv, rep, D).permute(0, 2, 3, 1, 4).reshape(n * Hkv, rep * t, D)  # as attend lays out q
    dqb, dkb, dvb = PB.attention_backward(dob, qb, kb, vb, p, scaling)
    dq = dqb.view(n, Hkv, rep, t, D).permute(0, 3, 1, 2, 4).reshape(n, t, Hkv * rep, D)
    return dq, dkb.view(n, Hkv, L, D).transpose(1, 2), dvb.view(n, Hkv, L, D).transpose(1, 2)
