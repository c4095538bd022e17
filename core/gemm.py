"""The float32 CPU GEMMs of the functional forwards and the hand-written backward, through oneDNN where
that is faster than torch's default.

Why (measured in docs/performance.md): torch's CPU ``mm``/``addmm``/``linear`` in float32 call MKL's
``sgemm``, and MKL picks its code path by CPU vendor: on AMD CPUs it runs its AVX2 kernels even where the
CPU has AVX-512. oneDNN, which every x86 torch build also carries, picks its kernels by the instruction
sets the CPU reports. On an AMD EPYC (Zen 5) host, one thread, the tiny model's shapes: 2.2x MKL's rate
from 945 rows (``[945, 128] x [128, 512]``: 1,157 vs 2,695 µs), 1.5-2x at a decoding step's 64 rows. A
oneDNN call has a fixed cost of ~18 µs against MKL's ~3, so products under :data:`ONEDNN_MIN_MACS`
multiply-adds stay with torch. On Intel CPUs MKL runs its AVX-512 kernels, so the two should be close
there (not measured here).

The oneDNN op is ``torch.ops.mkldnn._linear_pointwise``, the one Inductor's CPU backend compiles linear
layers to; it reads dense weights of any strides. It has no autograd formula, so a GEMM whose result
autograd would differentiate always goes through torch (:mod:`core.packed`'s forward under autograd),
and the two backends agree to float rounding, not bit for bit (a different summation order). Which one
runs is the run config's ``cpu_matmul`` (``onednn`` or ``torch``), set before any model is built
(:func:`use`): a run repeats bit for bit on the same CPU with the same ``cpu_threads`` and ``cpu_matmul``.
"""
from __future__ import annotations

import logging
import math

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

BACKENDS = ("onednn", "torch")
ONEDNN_MIN_MACS = 1 << 20  # M K N below this: torch's kernel (oneDNN's per-call cost is larger than the gain)


def onednn_available() -> bool:
    """True if this torch build has oneDNN and its linear op."""
    try:
        return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    except (AttributeError, RuntimeError):
        return False


_ONEDNN = onednn_available()  # the backend in force: use() sets it from the config


def _count_flops() -> None:
    """Teach ``torch.utils.flop_counter`` the oneDNN op (``2 M K N``, fillers included: what runs), so FLOP
    counts of a step (``bench/trl_grpo_bench.py``) see its GEMMs as they see ``mm``."""
    from torch.utils import flop_counter

    op = torch.ops.mkldnn._linear_pointwise
    if op not in flop_counter.flop_registry:
        @flop_counter.register_flop_formula(op)
        def _flops(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
            return 2 * math.prod(x_shape) * w_shape[0]


if _ONEDNN:
    _count_flops()


def use(name: str) -> str:
    """Route the float32 CPU GEMMs below through ``name`` (config ``cpu_matmul``). Returns the backend in
    force: ``onednn`` on a torch build without it falls back to ``torch``, with a warning."""
    global _ONEDNN
    if name not in BACKENDS:
        raise ValueError(f"cpu_matmul={name!r}: expected one of {', '.join(BACKENDS)}")
    _ONEDNN = name == "onednn" and onednn_available()
    if name == "onednn" and not _ONEDNN:
        log.warning("cpu_matmul=onednn: this torch build has no oneDNN linear op; float32 CPU GEMMs use torch's")
    return backend()


def backend() -> str:
    """The backend in force: ``onednn`` or ``torch``."""
    return "onednn" if _ONEDNN else "torch"


def _in_force(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether oneDNN takes float32 CPU GEMMs and these activations are such."""
    return _ONEDNN and dtype == torch.float32 and device.type == "cpu"


def _onednn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> bool:
    """Whether ``x w^T + b`` goes to oneDNN: enabled, float32 on CPU, large enough, and nothing to differentiate."""
    if not _in_force(x.dtype, x.device) or w.dtype != torch.float32:
        return False
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or (b is not None and b.requires_grad)):
        return False
    return x.numel() * w.shape[0] >= ONEDNN_MIN_MACS  # M K N


def _bucket(n: int) -> int:
    """``n`` rounded up to a multiple of 16 (up to 64) or of 64 (above)."""
    step = 16 if n <= 64 else 64
    return -(-n // step) * step


def _dnn(x2: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """``x2 [M, K] @ w^T + b`` through oneDNN, ``M`` and ``K`` zero-padded to :func:`_bucket` sizes.

    oneDNN builds (JIT-compiles) a kernel per shape, ~0.9 ms each here, and keeps the last 1,024 in a
    cache. A rollout's token count differs every step, so unpadded each update would compile afresh;
    padded, a run meets a few dozen shapes. Zero rows of ``x2`` give rows that are cut off; zero columns
    of ``x2`` and ``w`` add exact zeros to every sum."""
    (M, K), Mp, Kp = x2.shape, _bucket(x2.shape[0]), _bucket(x2.shape[1])
    if Mp != M or Kp != K:
        x2 = _zero_padded(x2, Mp, Kp)  # [Mp, Kp]
    if Kp != K:
        w = _zero_padded(w, w.shape[0], Kp)  # [N, Kp]
    y = torch.ops.mkldnn._linear_pointwise(x2, w, b, "none", [], "")  # [Mp, N]
    return y if Mp == M else y[:M]


def padded_rows(m: int, dtype: torch.dtype, device: torch.device) -> int:
    """The row count to give ``m`` rows of ``dtype`` activations on ``device`` so that their GEMMs meet
    shapes oneDNN compiled before (:func:`_dnn`): ``m`` rounded up where oneDNN is in force for them, else ``m``.
    The packed forward (:mod:`core.packed`) adds filler tokens up to it rather than have every GEMM pad."""
    return _bucket(m) if _in_force(dtype, torch.device(device)) else m


def _zero_padded(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """``x [m, k]`` in the top left of a contiguous ``[rows, cols]``, zeros elsewhere (written once, unlike
    ``F.pad``'s fill of the whole then copy)."""
    m, k = x.shape
    out = x.new_empty(rows, cols)
    out[:m, :k].copy_(x)
    if rows > m:
        out[m:].zero_()
    if cols > k:
        out[:m, k:].zero_()
    return out


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear``: ``x [..., K] @ w^T + b`` with ``w [N, K]`` (any strides), ``b [N]`` -> ``[..., N]``."""
    if _onednn(x, w, b):
        return _dnn(x.reshape(-1, x.shape[-1]), w, b).view(*x.shape[:-1], w.shape[0])
    return F.linear(x, w, b)


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a [M, K] @ b [K, N]`` -> ``[M, N]``."""
    return linear(a, b.t())


def addmm(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``c + a [M, K] @ b [K, N]`` -> ``[M, N]`` (``c`` broadcast to it; under torch one ``addmm``)."""
    w = b.t()  # [N, K]
    if _onednn(a, w, c):
        return _dnn(a, w, None).add_(c)
    return torch.addmm(c, a, b)
