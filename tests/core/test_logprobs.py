"""Chunked log-probs and entropies (core/models/logprobs.py): the values and gradients of the plain fp32
log-softmax, without its memory. The memory tests run on fake tensors (no storage), at a real vocabulary."""
from types import SimpleNamespace

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker

from core.models import logprobs as L

V_REAL = 152064  # Qwen2.5's vocabulary


def _reference(logits32, targets, temperature):
    """The straightforward fp32 forms: log-softmax, its gather, and ``-sum(p log p)``."""
    all_lp = torch.log_softmax(logits32 / temperature, -1)  # [..., V]
    return all_lp.gather(-1, targets[..., None]).squeeze(-1), -(all_lp.exp() * all_lp).sum(-1)


def _grads(logits, targets, temperature, entropy_grad, w):
    """Values and the gradient wrt ``logits`` of ``sum(w lp) (+ sum(H))``, ours and the reference's (the
    reference from the same values upcast to fp32)."""
    lp, ent = L.token_logprobs(logits, targets, temperature, with_entropy=True, entropy_grad=entropy_grad)
    assert ent.requires_grad == entropy_grad and lp.dtype == ent.dtype == torch.float32
    got, = torch.autograd.grad((lp * w).sum() + (ent.sum() if entropy_grad else 0), logits)
    ref32 = logits.detach().float().requires_grad_()
    ref_lp, ref_ent = _reference(ref32, targets, temperature)
    want, = torch.autograd.grad((ref_lp * w).sum() + (ref_ent.sum() if entropy_grad else 0), ref32)
    return (lp, ent, got), (ref_lp, ref_ent, want)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entropy_grad", [False, True])
def test_values_and_gradients_equal_fp32_log_softmax(temperature, entropy_grad, monkeypatch):
    """fp32 logits over several chunks (2 x 5 positions in chunks of 3): log-probs, entropy and the gradient
    of a weighted sum (plus the entropy with ``entropy_grad``) equal the log-softmax forms."""
    monkeypatch.setattr(L, "CHUNK", 3)
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(2, 5, 11, generator=g)).requires_grad_()
    targets = torch.randint(0, 11, (2, 5), generator=g)
    (lp, ent, got), (ref_lp, ref_ent, want) = _grads(logits, targets, temperature, entropy_grad,
                                                     torch.randn(2, 5, generator=g))
    torch.testing.assert_close(lp, ref_lp, atol=1e-6, rtol=1e-5)
    # H = logsumexp(z) - sum(p z) subtracts terms of size ~max|z|: its fp32 rounding floor is absolute and
    # depends on the kernel's summation order (AVX-512 differs from AVX2 here by 2e-6 at z up to 13)
    floor = 16 * torch.finfo(torch.float32).eps * logits.detach().abs().max().item() / temperature
    torch.testing.assert_close(ent, ref_ent, atol=floor, rtol=1e-5)
    # the entropy gradient -p (z - sum(p z)) cancels terms of size ~|z| p: an absolute fp32 rounding floor
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("entropy_grad", [False, True])
def test_bf16_logits_upcast_per_chunk(entropy_grad, monkeypatch):
    """bf16 logits (the model's dtype): values in fp32 equal the fp32 reference of the same bf16 values; the
    gradient comes back in bf16, equal to the reference's rounded to bf16."""
    monkeypatch.setattr(L, "CHUNK", 4)
    g = torch.Generator().manual_seed(1)
    logits = (3 * torch.randn(9, 37, generator=g)).to(torch.bfloat16).requires_grad_()
    targets = torch.randint(0, 37, (9,), generator=g)
    (lp, ent, got), (ref_lp, ref_ent, want) = _grads(logits, targets, 0.6, entropy_grad, torch.randn(9, generator=g))
    torch.testing.assert_close(lp, ref_lp, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent, atol=1e-6, rtol=1e-5)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, want.to(torch.bfloat16))


def test_no_grad_matches_and_entropy_optional():
    g = torch.Generator().manual_seed(2)
    logits, targets = torch.randn(3, 4, 13, generator=g), torch.randint(0, 13, (3, 4), generator=g)
    with torch.no_grad():
        lp, ent = L.token_logprobs(logits, targets, 0.9)
    assert ent is None
    torch.testing.assert_close(lp, _reference(logits, targets, 0.9)[0], atol=1e-6, rtol=1e-5)


# ----------------------------------------------------------------------------- memory at a real vocabulary
def _peak_bytes(fn) -> int:
    """Peak bytes of the tensors ``fn`` uses, on fake tensors. MemTracker counts the tensors made inside ``fn``
    and the whole storage of an older tensor once ``fn`` takes a view of it (the logits' chunks)."""
    tracker = MemTracker()
    with tracker:
        fn()
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


def _chunk_bytes() -> int:
    return L.CHUNK * V_REAL * 4  # one [CHUNK, V] fp32 temporary


def test_training_pass_keeps_no_fp32_copy_of_the_logits():
    """bf16 logits ``[4096, 152064]`` (1.16 GiB) through log-probs, the entropy bonus, and backward: the peak is
    the logits, their bf16 gradient and two ``[CHUNK, V]`` fp32 temporaries (3.48 GiB; bound: one temporary
    more). The code before (whole-tensor fp32 math) peaked at 5.80 GiB with these bf16 logits, 13.9 GiB with
    the fp32 copy its caller made."""
    with FakeTensorMode():
        logits = torch.empty(4096, V_REAL, dtype=torch.bfloat16, requires_grad=True)
        targets = torch.zeros(4096, dtype=torch.long)

        def train_pass():
            lp, ent = L.token_logprobs(logits, targets, 0.7, with_entropy=True, entropy_grad=True)
            (lp.sum() + ent.sum()).backward()

        peak = _peak_bytes(train_pass)
    bound = 2 * logits.numel() * 2 + 3 * _chunk_bytes()
    assert peak <= bound, f"peak {peak / 2**30:.2f} GiB > {bound / 2**30:.2f} GiB"


class _FixedLogits(torch.nn.Module):
    """A causal LM stand-in whose forward returns fresh bf16 logits ``[N, kept, V]`` (as an LM head does), so the
    memory measured is that of the log-prob computation around it."""

    def __init__(self, n: int, t: int, v: int):
        super().__init__()
        self.table = torch.empty(n, t, v, dtype=torch.bfloat16)

    def forward(self, input_ids, logits_to_keep, **_):
        keep = torch.arange(input_ids.shape[1])[-logits_to_keep:] if isinstance(logits_to_keep, int) else logits_to_keep
        return SimpleNamespace(logits=self.table.index_select(1, keep))


def test_no_grad_pass_keeps_no_fp32_copy_of_the_logits():
    """The reference / old-policy pass (no grad) over 2 rows x 2048 response tokens at V = 152064: the peak is
    the model's bf16 logits (1.16 GiB) and two ``[CHUNK, V]`` fp32 temporaries (bound: one more). The code
    before upcast the whole logits in ``response_logprobs``."""
    P, R = 4, 2048
    with FakeTensorMode():
        model = _FixedLogits(2, P + R, V_REAL)
        ids = torch.zeros(2, P + R, dtype=torch.long)
        with torch.no_grad():
            peak = _peak_bytes(lambda: L.response_logprobs(model, ids, torch.ones_like(ids), P, 0.7,
                                                           with_entropy=True, packing=False))
    bound = 2 * R * V_REAL * 2 + 3 * _chunk_bytes()
    assert peak <= bound, f"peak {peak / 2**30:.2f} GiB > {bound / 2**30:.2f} GiB"
