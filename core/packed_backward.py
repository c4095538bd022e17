"""Hand-written backward of the packed decoder (:mod:`core.packed`), one function per block.

The policy update differentiates the packed forward. Under autograd that forward records hundreds of
graph nodes per update, saves their inputs as it goes and replays them one by one. Each node costs per-op
overhead, and some backward formulas zero-fill whole tensors (slice and index backward). Here the
forward runs without autograd, keeps what the backward reads, and the gradients come from the
closed forms below, each written out once:

- RMSNorm (HF ``LlamaRMSNorm`` in fp32), ``y = w * x r`` with ``r = rsqrt(mean(x^2) + eps)``:
  ``dx = r (g w - x_hat mean(g w x_hat))``, ``dw = sum(g x_hat)``;
- softmax attention from the saved probabilities (``dS = P (dP - rowsum(dP P))``);
- RoPE ``y = x cos + roll(x, D/2) sin``: ``dx = g cos + roll(g sin, D/2)`` (a half-turn roll is its own
  inverse);
- SwiGLU ``silu(gate) * up``: ``aten::silu_backward``;
- log-softmax of the scored logits (``aten::_log_softmax_backward_data``) and the entropy
  ``H = -sum p log p``, ``dH/dz = -p (log p + H)``.

Everything here is float32 (:func:`core.packed.manual_backward_reason` rules out other dtypes); the
gradients equal autograd's to float rounding (tests/core/test_packed.py).
"""
from __future__ import annotations

import torch

from core import gemm


def rms_norm_backward(g: torch.Tensor, xh: torch.Tensor, r: torch.Tensor, w: torch.Tensor):
    """``(dx [M, H], dw [H])`` of ``y = w * xh``, ``xh = x r``, ``r = rsqrt(mean(x^2) + eps)`` ``[M, 1]``,
    given ``g = dL/dy [M, H]``."""
    dw = (g * xh).sum(0)  # [H]
    gw = g * w  # [M, H]
    m = (gw * xh).mean(-1, keepdim=True)  # [M, 1]
    return gw.sub_(xh * m).mul_(r), dw


def linear_backward(g: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: bool):
    """``(dx [M, in], dw [out, in], db [out] or None)`` of ``y = x w^T + b`` given ``g = dL/dy [M, out]``."""
    return gemm.mm(g, w), gemm.mm(g.t(), x), (g.sum(0) if bias else None)


def attention_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: torch.Tensor,
                       scaling: float):
    """``(dq, dk, dv)`` of ``o = softmax(scaling q k^T + bias) v`` in the batched layout of
    :func:`core.lean_decoder.attend`: ``q, do [B, Lq, D]``, ``k, v [B, Lk, D]``, probabilities ``p [B, Lq, Lk]``.
    Masked keys have ``p = 0`` and get no gradient from the scores."""
    dv = torch.bmm(p.transpose(1, 2), do)  # [B, Lk, D]
    dp = torch.bmm(do, v.transpose(1, 2))  # [B, Lq, Lk]
    ds = torch._softmax_backward_data(dp, p, -1, p.dtype).mul_(scaling)  # [B, Lq, Lk]
    return torch.bmm(ds, k), torch.bmm(ds.transpose(1, 2), q), dv  # [B, Lq, D], [B, Lk, D], [B, Lk, D]


def rope_backward(g: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``dx`` of ``y = x cos + roll(x, D/2) sin`` (``sin`` signed as :func:`core.lean_decoder.rope_tables`
    gives it): the transpose of a half-turn roll is the same roll."""
    return torch.roll(g * sin, g.shape[-1] // 2, -1).add_(g * cos)


def swiglu_backward(g: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, act_gate: torch.Tensor):
    """``(dgate, dup)`` of ``silu(gate) * up`` given ``g [M, I]`` (overwritten) and ``act_gate = silu(gate)``."""
    dup = g * act_gate
    return torch.ops.aten.silu_backward(g.mul_(up), gate), dup


def score_backward(d_lp: torch.Tensor, d_ent: torch.Tensor | None, logp: torch.Tensor, ent: torch.Tensor | None,
                   which: torch.Tensor, target: torch.Tensor, temperature: float) -> torch.Tensor:
    """``dL/dlogits [K, V]`` of the scored log-probs ``lp = logp[which, target]`` (``d_lp [J]``) and the
    entropies ``ent[which]`` (``d_ent [J]`` or None), ``logp = log_softmax(logits / T) [K, V]``. A logits
    row read by several scored tokens (a shared prompt's last token) sums their gradients."""
    dlogp = torch.zeros_like(logp).index_put_((which, target), d_lp, accumulate=True)  # [K, V]
    dz = torch._log_softmax_backward_data(dlogp, logp, -1, logp.dtype)  # [K, V]
    if d_ent is not None:
        g = torch.zeros_like(ent).index_add_(0, which, d_ent)  # [K]
        dz -= logp.exp() * (logp + ent[:, None]) * g[:, None]  # dH/dz = -p (log p + H)
    return dz if temperature == 1.0 else dz / temperature
