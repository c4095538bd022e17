"""``core.gemm``: float32 CPU GEMMs through oneDNN equal torch's to float rounding over shapes and strides,
stay with torch where autograd differentiates or the product is small, meet few shapes (bucketed rows),
are counted by the FLOP counter, and are chosen by the config's ``cpu_matmul``; the packed forward and
the lean decoder, run through oneDNN with filler tokens, still equal the HF module."""
from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from core import gemm, packed
from core.policy import response_logprobs
from recipes import rl
from tests.core.test_lean_decoder import MODELS, _load, _rollout
from tests.core.test_packed import _assert_grads_close, _both
from tests.core.test_rl_runs import BASE

pytestmark = pytest.mark.skipif(not gemm.onednn_available(), reason="this torch build has no oneDNN linear op")
ONEDNN_OP = "mkldnn._linear_pointwise"


@pytest.fixture(autouse=True)
def restore_backend():
    before = gemm.backend()
    yield
    gemm.use(before)


def _ops(fn) -> tuple[object, set[str]]:
    """``fn()`` and the names of the GEMM ops it ran (FLOP counter: oneDNN's is registered by core.gemm)."""
    with FlopCounterMode(display=False) as counter:
        out = fn()
    return out, {str(op) for op in counter.get_flop_counts()["Global"]}


def test_linear_mm_addmm_equal_torch_over_shapes_and_strides():
    gen = torch.Generator().manual_seed(0)
    paths = {"onednn": 0, "torch": 0}
    for M, K, N, bias, transposed in itertools.product((1, 17, 64, 130, 1000), (32, 100, 128), (16, 130),
                                                       (False, True), (False, True)):
        x = torch.randn(M, K, generator=gen)
        w = torch.randn(K, N, generator=gen).t() if transposed else torch.randn(N, K, generator=gen)  # [N, K]
        b = torch.randn(N, generator=gen) if bias else None
        c = torch.randn(M, N, generator=gen)
        with torch.no_grad():
            y, ops = _ops(lambda: gemm.linear(x, w, b))
            torch.testing.assert_close(y, F.linear(x, w, b), atol=1e-4, rtol=1e-5)
            torch.testing.assert_close(gemm.mm(x, w.t()), x @ w.t(), atol=1e-4, rtol=1e-5)
            torch.testing.assert_close(gemm.addmm(c, x, w.t()), torch.addmm(c, x, w.t()), atol=1e-4, rtol=1e-5)
        assert y.shape == (M, N) and y.is_contiguous()
        on = M * K * N >= gemm.ONEDNN_MIN_MACS
        assert (ONEDNN_OP in ops) == on, (M, K, N)
        paths["onednn" if on else "torch"] += 1
    x3 = torch.randn(4, 70, 128, generator=gen)  # leading dims kept
    torch.testing.assert_close(gemm.linear(x3, w), F.linear(x3, w), atol=1e-4, rtol=1e-5)
    assert paths == {"onednn": 32, "torch": 88}, paths  # both routes, every case checked


def test_a_product_with_a_varying_reduction_length_is_padded_with_exact_zeros():
    """``g^T x`` over a token count that differs per batch (a weight gradient): the reduction is padded
    to a bucket, and zeros add nothing."""
    gen = torch.Generator().manual_seed(1)
    for M in (77, 945, 1001):
        g, x = torch.randn(M, 512, generator=gen), torch.randn(M, 128, generator=gen)
        dw, ops = _ops(lambda: gemm.mm(g.t(), x))  # [512, 128]
        assert ONEDNN_OP in ops
        torch.testing.assert_close(dw, g.t() @ x, atol=2e-4, rtol=1e-5)


def test_what_autograd_differentiates_stays_with_torch():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(256, 128, generator=gen).requires_grad_()
    w = torch.randn(512, 128, generator=gen)
    y, ops = _ops(lambda: gemm.linear(x, w))
    assert ONEDNN_OP not in ops and y.grad_fn is not None
    y.sum().backward()
    # d sum(x w^T) / dx = 1 w, summed in torch's order (w.sum(0) sums in another: 1e-5 apart over 512 rows)
    torch.testing.assert_close(x.grad, torch.ones(256, 512) @ w)
    with torch.no_grad():
        assert ONEDNN_OP in _ops(lambda: gemm.linear(x, w))[1]


def test_use_names_the_key_and_switches_the_backend():
    with pytest.raises(ValueError, match="cpu_matmul='mkl'.*onednn, torch"):
        gemm.use("mkl")
    x, w = torch.randn(256, 128), torch.randn(512, 128)
    assert gemm.use("torch") == "torch" == gemm.backend()
    y, ops = _ops(lambda: gemm.linear(x, w))
    assert ONEDNN_OP not in ops and torch.equal(y, F.linear(x, w))  # torch's own kernel, bit for bit
    assert gemm.padded_rows(945, torch.float32, "cpu") == 945
    assert gemm.use("onednn") == "onednn"
    assert ONEDNN_OP in _ops(lambda: gemm.linear(x, w))[1]


def test_row_counts_fall_into_few_buckets():
    sizes = {n: gemm.padded_rows(n, torch.float32, "cpu") for n in range(1, 2049)}
    assert all(m >= n and m - n < (16 if n <= 64 else 64) for n, m in sizes.items())
    assert len(set(sizes.values())) == 4 + (2048 - 64) // 64
    assert gemm.padded_rows(945, torch.bfloat16, "cpu") == 945  # bf16 GEMMs stay with torch: no fillers


@pytest.fixture(scope="module", params=sorted(MODELS))
def model_tok(request):
    return _load(*MODELS[request.param])


def test_the_packed_forward_and_backward_through_onednn_equal_the_hf_module(model_tok, monkeypatch):
    """Every GEMM of the tiny test models through oneDNN (threshold 0), filler tokens in the layout: the
    packed log-probs, entropies and gradients still equal the padded HF forward's (autograd, torch)."""
    monkeypatch.setattr(gemm, "ONEDNN_MIN_MACS", 0)
    model, tok = model_tok
    roll = _rollout(model, tok, seed=5)
    layouts = []
    layout = packed._layout
    monkeypatch.setattr(packed, "_layout", lambda *a: layouts.append(layout(*a)) or layouts[-1])
    (hf, pk, keep), ops = _ops(lambda: _both(model, roll))
    assert ONEDNN_OP in ops
    assert layouts and all(len(lay.ids) > len(lay.sel) for lay in layouts), "the layout should carry fillers"
    torch.testing.assert_close(pk[0][keep], hf[0][keep], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pk[1][keep], hf[1][keep], atol=1e-5, rtol=1e-5)
    assert _assert_grads_close(hf[2], pk[2]) == len(list(model.parameters()))


def test_the_lean_decoder_through_onednn_samples_what_the_hf_module_scores(model_tok, monkeypatch):
    """Sampling with the lean decoder's GEMMs through oneDNN: the reported log-probs are the HF module's."""
    monkeypatch.setattr(gemm, "ONEDNN_MIN_MACS", 0)
    model, tok = model_tok
    roll, ops = _ops(lambda: _rollout(model, tok, seed=6))
    assert ONEDNN_OP in ops
    with torch.no_grad():
        hf, _ = response_logprobs(model, roll.input_ids, roll.attention_mask, roll.prompt_length, 1.0, packing=False)
    keep = roll.response_mask.bool()
    assert keep.sum() > 20
    torch.testing.assert_close(roll.logprobs[keep], hf[keep], atol=1e-5, rtol=1e-5)


def test_the_run_config_picks_the_backend_before_any_model(compose_cfg, tmp_path):
    with pytest.raises(ValueError, match="cpu_matmul='fast'"):
        rl.setup(compose_cfg(*BASE, "cpu_matmul=fast"), run_dir=str(tmp_path / "bad"))
    assert not (tmp_path / "bad").exists()
    run = rl.setup(compose_cfg(*BASE, "cpu_matmul=torch"), run_dir=str(tmp_path / "run"))
    assert gemm.backend() == "torch" and run.cfg.cpu_matmul == "torch"
