"""A lean functional forward of Llama-family decoders (``LlamaForCausalLM``, ``Qwen2ForCausalLM``) that
reads the Hugging Face module's own parameter tensors, for the no-grad hot paths: the ``torch``
rollout engine's KV-cached sampling and the reference / old-policy log-prob forwards.

Why (profiled in docs/performance.md): on a small model one decoding step is dozens of tiny ops, and
the HF module adds its mask, cache and output machinery to each call; that, not arithmetic, was most
of the sampling time. Here a step is the same arithmetic in fewer, larger ops:

- q/k/v and gate/up projections run as one GEMM each (weights concatenated once per call, no grad);
- RoPE tables are built once per call for every position, and q and k rotate together, in place;
- a preallocated KV cache is written in place, keys and values in one copy (no concatenation per token);
- attention folds the grouped query heads into the batch (``[N Hkv, rep t, D]``), so keys and
  values are never repeated (HF's ``repeat_kv`` copies them): mask + scaled scores in one ``baddbmm``,
  an fp32 softmax, one ``bmm``; large score tensors go to SDPA instead (``_SDPA_ABOVE``);
- residual adds happen inside the output GEMMs (``addmm``), and a small model's weights are
  row-major copies (``w^T``), which MKL multiplies faster with the few rows of a decoding step;
- every GEMM goes through :mod:`core.gemm` (float32 on CPU: oneDNN where it is faster than MKL).

Exactness: the operations are HF's (RMSNorm in fp32, then the weight; RoPE as
``x cos + rotate_half(x) sin``; softmax in fp32; scaling from the attention module), some fused or
reassociated (the residual add inside the GEMM), so logits agree with the HF module to float rounding (tests/core/test_lean_decoder.py: within 1e-5 for Qwen2 and Llama
with left padding, GQA and MHA, biases on and off; greedy decoding identical to ``generate``).

Where it does not apply, :func:`unsupported_reason` says why and callers use the HF module: other
architectures or wrappers (PEFT/LoRA), an attention implementation other than sdpa/eager (a model set
up for flash-attn keeps it), sliding-window layers, RoPE types that depend on the sequence length
(dynamic, longrope), non-SiLU MLPs, ZeRO-3-partitioned parameters.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from core import gemm

_ARCHS = {"LlamaForCausalLM", "Qwen2ForCausalLM"}
_STATIC_ROPE = {"default", "linear", "llama3", "yarn"}  # tables depend on the position alone
_SDPA_ABOVE = 1 << 24  # score elements (n * heads * t * T) above which attention runs through SDPA


def unsupported_reason(model, archs: frozenset[str] | set[str] = _ARCHS) -> str | None:
    """None if :class:`LeanDecoder` computes exactly what ``model`` computes, else the reason not. ``archs``:
    the model classes the caller's head handles (the causal-LM ones by default)."""
    name = type(model).__name__
    if name not in archs:
        return f"model class {name} (lean forward covers {', '.join(sorted(archs))})"
    cfg = model.config
    attn = getattr(cfg, "_attn_implementation", None) or "eager"
    if attn not in ("sdpa", "eager"):
        return f"attn_implementation={attn!r} (the lean forward attends with matmuls or SDPA)"
    if cfg.hidden_act != "silu":
        return f"hidden_act={cfg.hidden_act!r}"
    if "sliding_attention" in (getattr(cfg, "layer_types", None) or []):
        return "sliding-window attention layers"
    rope = getattr(model.model.rotary_emb, "rope_type", "default")
    if rope not in _STATIC_ROPE:
        return f"rope_type={rope!r} depends on the sequence length"
    if any(hasattr(p, "ds_id") for p in model.parameters()):
        return "DeepSpeed ZeRO-3 partitioned parameters"
    return None


_FUSE_MAX_BYTES = 256 << 20  # copies of all layers' weights above this: the module's own, unfused


@dataclass
class _Layer:
    """One decoder layer's parameters, each projection as ``(w^T [in, out], bias)`` for ``x @ w^T``: ``qkv``
    and ``gu`` one fused pair (``[H, (Hq + 2 Hkv) D]``, ``[H, 2 I]``) or one pair per projection."""

    ln1: torch.Tensor  # [H]
    qkv: list[tuple[torch.Tensor, torch.Tensor | None]]
    wo: torch.Tensor  # [Hq D, H]
    bo: torch.Tensor | None
    ln2: torch.Tensor  # [H]
    gu: list[tuple[torch.Tensor, torch.Tensor | None]]
    wd: torch.Tensor  # [I, H]
    bd: torch.Tensor | None


def _projections(mods, copy: bool) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """``[(w^T, bias)]`` of the linear modules ``mods``: with ``copy`` one concatenated pair whose ``w^T`` is
    a contiguous copy (MKL's row-major GEMM, with few rows as in a decoding step, runs up to 2x faster on
    it than on the transposed view: docs/performance.md), else the modules' own weights as views."""
    if not copy:
        return [(m.weight.t(), m.bias) for m in mods]
    biases = [m.bias for m in mods]
    bias = None if all(b is None for b in biases) else torch.cat([
        b if b is not None else torch.zeros(m.out_features, dtype=m.weight.dtype, device=m.weight.device)
        for b, m in zip(biases, mods)])
    return [(torch.cat([m.weight for m in mods]).t().contiguous(), bias)]


def _project(x: torch.Tensor, pairs) -> torch.Tensor:
    """The projections ``pairs`` of ``x [..., in]`` side by side on the last dim (one GEMM when fused)."""
    x2 = x.reshape(-1, x.shape[-1])
    out = [gemm.linear(x2, wt.t(), b) for wt, b in pairs]
    out = out[0] if len(out) == 1 else torch.cat(out, -1)
    return out.view(*x.shape[:-1], out.shape[-1])


class LeanDecoder:
    """The decoder stack of ``model`` as plain tensor ops, in inference mode (no autograd, no version
    counters: ~10% less per-op overhead than ``no_grad`` here; what comes out is an inference tensor,
    and the first op outside inference mode gives an ordinary one). Build one per call: the fused,
    row-major weights are copies, made when the parameters are current (after the last optimiser step);
    a model whose copies would exceed ``_FUSE_MAX_BYTES`` keeps its own weights, projections separate."""

    @torch.inference_mode()
    def __init__(self, model):
        cfg, inner = model.config, model.model
        self.model, self.inner = model, inner
        self.Hq, self.Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.D = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.Hq
        self.rep, self.I, self.eps = self.Hq // self.Hkv, cfg.intermediate_size, cfg.rms_norm_eps
        self.scaling = inner.layers[0].self_attn.scaling
        # fused q/k/v and gate/up GEMMs halve the per-token op count of a small model, and row-major copies
        # of the weights speed up its few-row GEMMs; on a large one the GEMMs dominate anyway and the
        # copies would hold the model a second time
        names = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                 "mlp.up_proj", "mlp.down_proj")
        copy = sum(p.numel() * p.element_size() for layer in inner.layers for n in names
                   for p in layer.get_submodule(n).parameters()) <= _FUSE_MAX_BYTES
        self.layers = []
        for layer in inner.layers:
            a, m = layer.self_attn, layer.mlp
            (wo, bo), = _projections((a.o_proj,), copy)
            (wd, bd), = _projections((m.down_proj,), copy)
            self.layers.append(_Layer(
                layer.input_layernorm.weight, _projections((a.q_proj, a.k_proj, a.v_proj), copy), wo, bo,
                layer.post_attention_layernorm.weight, _projections((m.gate_proj, m.up_proj), copy), wd, bd))
        (self.lm_wt, self.lm_b), = _projections((model.lm_head,), copy)
        p = inner.embed_tokens.weight
        self.dtype, self.device = p.dtype, p.device

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """HF ``LlamaRMSNorm`` / ``Qwen2RMSNorm``: normalise in fp32, cast back, then the weight (in fp32 the
        same two products, with the casts and temporaries left out)."""
        if x.dtype == torch.float32:
            return (x * x.pow(2).mean(-1, keepdim=True).add_(self.eps).rsqrt_()).mul_(w)
        return rms_norm(x, w, self.eps)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`rope_tables` of this model."""
        return rope_tables(self.model, positions)

    def new_cache(self, n: int, length: int) -> list[torch.Tensor]:
        """Per layer one ``[2, n, Hkv, length, D]`` key/value buffer, written in place by :meth:`forward`."""
        return [torch.zeros(2, n, self.Hkv, length, self.D, dtype=self.dtype, device=self.device)
                for _ in self.layers]

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                rows: torch.Tensor, length: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Run the ``u`` distinct left-padded prompts ``ids, mask [u, P]`` into a cache of ``length`` slots,
        then repeat it for the ``N`` rows that share them (``rows [N]`` indexes ``[u]``). Returns the
        logits at the last prompt slot ``[N, V]`` (they score the first new token) and the rows' cache."""
        cache = self.new_cache(ids.shape[0], length)
        h = self.forward(ids, 0, cache, cos, sin, prompt_bias(mask))  # [u, P, H]
        return self.logits(h[:, -1])[rows], [kv[:, rows] for kv in cache]  # [N, V], [2, N, Hkv, length, D]

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, start: int, cache: list[torch.Tensor], cos: torch.Tensor,
                sin: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """Hidden states ``[n, t, H]`` (before the final norm) of tokens ``ids [n, t]`` at cache slots
        ``start .. start + t - 1``, attending to slots ``0 .. start + t - 1``.

        ``cos``/``sin`` ``[n, t, 1, D]`` are the rows' RoPE tables at those slots; ``bias [n, 1, 1, t, start + t]``
        is the additive attention mask (0 or -inf). Keys and values of the new tokens are written into
        ``cache`` first.
        """
        n, t = ids.shape
        T, Hq, Hkv, D, rep = start + t, self.Hq, self.Hkv, self.D, self.rep
        bias = attention_bias(bias, Hq, Hkv, self.dtype)  # once for all layers
        h = F.embedding(ids, self.inner.embed_tokens.weight)  # [n, t, H]
        for L, kv in zip(self.layers, cache):
            qkv = _project(self._rms(h, L.ln1), L.qkv).view(n, t, Hq + 2 * Hkv, D)
            qk = qkv[:, :, :Hq + Hkv]  # [n, t, Hq + Hkv, D]: q and k rotate alike, in place
            turned = torch.roll(qk, D // 2, -1)  # [x2, x1]; sin carries rotate_half's sign
            qk.mul_(cos).addcmul_(turned, sin)
            # keys and values of the new tokens into slots start..T-1, one copy: [2, n, Hkv, t, D]
            kv[:, :, :, start:T].copy_(qkv[:, :, Hq:].view(n, t, 2, Hkv, D).permute(2, 0, 3, 1, 4))
            # query head j * rep + r reads kv head j (HF repeat_kv order)
            q = qkv[:, :, :Hq].reshape(n, t, Hkv, rep, D).permute(0, 2, 3, 1, 4)  # [n, Hkv, rep, t, D]
            o = attend_with(q, kv[0, :, :, :T], kv[1, :, :, :T], bias, self.scaling)  # [n, t, Hq D]
            h = residual(h, o, L.wo, L.bo)
            gu = _project(self._rms(h, L.ln2), L.gu)  # [n, t, 2 I]
            h = residual(h, F.silu(gu[..., :self.I]).mul_(gu[..., self.I:]), L.wd, L.bd)
        return h

    @torch.inference_mode()
    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head: ``[..., H] -> [..., V]``."""
        return _project(self._rms(h, self.inner.norm.weight), [(self.lm_wt, self.lm_b)])


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as ``generate`` computes them: ``cumsum(mask) - 1``."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)  # [N, T]


def prompt_groups(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int):
    """``(first_rows [u], group_of_row [N])`` for runs of identical consecutive prompts."""
    p = torch.cat([input_ids[:, :prompt_length], attention_mask[:, :prompt_length]], 1)  # [N, 2P]
    new = torch.ones(p.shape[0], dtype=torch.bool, device=p.device)  # [N]
    new[1:] = (p[1:] != p[:-1]).any(-1)
    return new.nonzero().squeeze(-1), new.long().cumsum(0) - 1


def rope_tables(model, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` ``[n, T, 1, D]`` for ``positions [n, T]``, from the model's own rotary module (its
    scaling included); ``sin`` carries ``rotate_half``'s sign, so ``rotate_half(x) * sin`` is
    ``roll(x, D/2) * sin_signed``."""
    p = model.model.embed_tokens.weight
    probe = torch.empty(0, dtype=p.dtype, device=p.device)
    cos, sin = model.model.rotary_emb(probe, positions)  # [n, T, D]
    half = cos.shape[-1] // 2
    sin = torch.cat([-sin[..., :half], sin[..., half:]], -1)
    return cos.unsqueeze(2), sin.unsqueeze(2)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """HF ``LlamaRMSNorm`` / ``Qwen2RMSNorm``: normalise in fp32, cast back, then the weight."""
    return w * rms_scale(x.float(), eps)[0].to(x.dtype)


def rms_scale(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x r, r)`` with ``r = rsqrt(mean(x^2) + eps)`` ``[..., 1]``: the normalisation of :func:`rms_norm`
    (whose hand-written backward, :func:`core.packed_backward.rms_norm_backward`, reads both)."""
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x * r, r


def attention_bias(bias: torch.Tensor, Hq: int, Hkv: int, dtype: torch.dtype) -> torch.Tensor:
    """The additive mask ``bias [n, 1, 1, t, L]`` in the form :func:`attend_with` takes, built once per
    forward: for the batched-matmul path (score tensor of at most ``_SDPA_ABOVE`` elements) the mask per
    (row, kv head) batch ``[n Hkv, rep t, L]``; for SDPA the mask itself."""
    n, _, _, t, L = bias.shape
    if n * Hq * t * L > _SDPA_ABOVE:
        return bias
    return bias.to(dtype).expand(n, Hkv, Hq // Hkv, t, L).reshape(n * Hkv, Hq // Hkv * t, L)


def attend_with(q, k, v, bias, scaling: float) -> torch.Tensor:
    """:func:`attend` or :func:`sdpa_attend`, whichever form :func:`attention_bias` gave ``bias``."""
    return attend(q, k, v, bias, scaling) if bias.dim() == 3 else sdpa_attend(q, k, v, bias, scaling)


def attend(q, k, v, bias, scaling: float, saved: list | None = None) -> torch.Tensor:
    """Softmax attention of ``q [n, Hkv, rep, t, D]`` over ``k, v [n, Hkv, T, D]`` with ``bias
    [n Hkv, rep t, T]`` -> ``[n, t, Hq D]``: ``bias + scaling q k^T`` in one batched matmul, an fp32
    softmax, then the values (no autograd-unsafe ops: the packed training forward uses it too).
    ``saved`` (if given) gets the batched ``(q [n Hkv, rep t, D], k, v [n Hkv, T, D], probabilities
    [n Hkv, rep t, T])`` for a hand-written backward (:func:`core.packed_backward.attention_backward`)."""
    n, Hkv, rep, t, D = q.shape
    T = k.shape[2]
    qb, kb, vb = q.reshape(n * Hkv, rep * t, D), k.reshape(n * Hkv, T, D), v.reshape(n * Hkv, T, D)
    s = torch.baddbmm(bias, qb, kb.transpose(1, 2), alpha=scaling)  # [n Hkv, rep t, T]
    p = softmax(s).to(q.dtype)
    if saved is not None:
        saved.append((qb, kb, vb, p))
    o = torch.bmm(p, vb).view(n, Hkv, rep, t, D)
    return o.permute(0, 3, 1, 2, 4).reshape(n, t, Hkv * rep * D)


def softmax(s: torch.Tensor) -> torch.Tensor:
    """fp32 softmax over the last dim. torch's CPU kernel is up to 12x slower over fewer than 16 entries
    than over 16 (a decoding step's first keys, a short prompt: docs/performance.md), so there, without
    autograd, it is written out: ``exp(s - max) / sum``."""
    if s.shape[-1] >= 16 or s.requires_grad or s.device.type != "cpu":
        return torch.softmax(s, -1, dtype=torch.float32)
    e = (s.float() - s.amax(-1, keepdim=True)).exp_()
    return e.div_(e.sum(-1, keepdim=True))


def sdpa_attend(q, k, v, bias, scaling: float) -> torch.Tensor:
    """:func:`attend` through SDPA (no materialised scores) for large ``n x heads x t x T``; ``bias [n, 1, 1, t, T]``."""
    n, Hkv, rep, t, D = q.shape
    o = F.scaled_dot_product_attention(q.reshape(n, Hkv * rep, t, D), k, v, attn_mask=bias[:, 0].to(q.dtype),
                                       scale=scaling, enable_gqa=rep > 1)  # [n, Hq, t, D]
    return o.transpose(1, 2).reshape(n, t, Hkv * rep * D)


def residual(h: torch.Tensor, x: torch.Tensor, wt: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """``h + x @ wt + b`` (``wt = w^T [in, out]``) with the residual added inside the GEMM (``addmm``):
    ``[..., H]``; safe under autograd (the in-place bias add touches nothing ``addmm``'s backward reads)."""
    out = gemm.addmm(h.reshape(-1, h.shape[-1]), x.reshape(-1, x.shape[-1]), wt).view(h.shape)
    return out if b is None else out.add_(b)


def prompt_bias(mask: torch.Tensor) -> torch.Tensor:
    """Additive mask ``[n, 1, 1, P, P]`` of a left-padded prompt block: causal, padded keys hidden. A
    padded query still sees itself, so no softmax row is empty (its output is never read: padded keys
    are hidden from every other query)."""
    n, P = mask.shape
    causal = torch.ones(P, P, dtype=torch.bool, device=mask.device).tril()  # [P, P]
    ok = (causal & mask.bool()[:, None, :]) | torch.eye(P, dtype=torch.bool, device=mask.device)  # [n, P, P]
    return additive_mask(ok)[:, None, None]


def continuation_bias(prefix_mask: torch.Tensor, new_mask: torch.Tensor) -> torch.Tensor:
    """Additive mask ``[n, 1, 1, t, S + t]`` for ``t`` new tokens after ``S`` cached slots: every valid
    prefix slot, the new tokens causally (masked ones hidden from later queries, each sees itself)."""
    n, t = new_mask.shape
    causal = torch.ones(t, t, dtype=torch.bool, device=new_mask.device).tril()
    new_ok = (causal & new_mask.bool()[:, None, :]) | torch.eye(t, dtype=torch.bool, device=new_mask.device)
    ok = torch.cat([prefix_mask.bool()[:, None, :].expand(n, t, prefix_mask.shape[1]), new_ok], -1)  # [n, t, S+t]
    return additive_mask(ok)[:, None, None]


def additive_mask(ok: torch.Tensor) -> torch.Tensor:
    """0 where ``ok``, -inf elsewhere (float32, the attention add)."""
    return torch.zeros(ok.shape, device=ok.device).masked_fill_(~ok, float("-inf"))
