"""``core.lean_decoder``: the same logits as the HF module (Qwen2 and Llama, GQA and MHA, biases,
left padding, shared prompts, the SDPA branch), the torch engine's sampling on it, and the fallback."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from core import lean_decoder
from core.models import build_tiny_model_dir, load_causal_lm, load_tokenizer
from core.policy import chunked_logprobs, lean_response_logits, response_logits
from core.rollout import Sampling, build_engine, inverse_cdf

BASE = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 512, "tie_word_embeddings": True}
MODELS = {
    "qwen2_gqa": ("qwen2", {}),
    "qwen2_untied_rope_linear": ("qwen2", {"tie_word_embeddings": False,
                                           "rope_parameters": {"rope_type": "linear", "factor": 2.0,
                                                               "rope_theta": 10000.0}}),
    "llama_gqa_bias": ("llama", {"attention_bias": True, "mlp_bias": True}),
    "llama_mha": ("llama", {"num_key_value_heads": 4}),
}


def _load(arch: str, extra: dict, dtype: str = "float32"):
    d = str(build_tiny_model_dir(arch, {**BASE, **extra}, 0))
    model = load_causal_lm(d, OmegaConf.create({"dtype": dtype}))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # HF initialises biases to 0 and norms to 1: randomise them so both paths are exercised
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.copy_(torch.randn(p.shape, generator=gen).to(p.dtype) * 0.5 + (1.0 if "norm" in name else 0.0))
    return model.eval(), load_tokenizer(d)


@pytest.fixture(scope="module", params=sorted(MODELS))
def model_tok(request):
    return _load(*MODELS[request.param])


def _prompts(tok, group=3):
    texts = ["12+3=", "1+1=", "45+67=", "9="]  # different lengths: left padding
    return [tok(s, add_special_tokens=False)["input_ids"] for s in texts for _ in range(group)]


def _engine(name, model, tok, lean=True):
    return build_engine(name, model, tok, OmegaConf.create({"generation_batch_size": 0, "lean_forward": lean}))


def _rollout(model, tok, max_new=12, seed=0):
    torch.manual_seed(seed)
    return _engine("torch", model, tok).generate(_prompts(tok), Sampling(max_new_tokens=max_new, temperature=1.0))


def test_every_model_here_is_covered(model_tok):
    model, _ = model_tok
    assert lean_decoder.unsupported_reason(model) is None


def test_logits_equal_the_hf_module(model_tok):
    model, tok = model_tok
    roll = _rollout(model, tok)
    assert (roll.response_mask == 0).any(), "some completion should stop early (padding after the EOS)"
    with torch.no_grad():
        hf = response_logits(model, roll.input_ids, roll.attention_mask, roll.prompt_length)  # [N, R, V]
    lean = lean_response_logits(model, roll.input_ids, roll.attention_mask, roll.prompt_length)
    keep = roll.response_mask.bool()  # positions that score a kept response token
    assert keep.sum() > 20
    torch.testing.assert_close(lean[keep], hf[keep], atol=1e-5, rtol=1e-5)


def test_sdpa_branch_gives_the_same_logits(model_tok, monkeypatch):
    model, tok = model_tok
    roll = _rollout(model, tok, seed=1)
    args = (model, roll.input_ids, roll.attention_mask, roll.prompt_length)
    matmul = lean_response_logits(*args)
    monkeypatch.setattr(lean_decoder, "_SDPA_ABOVE", 0)
    sdpa = lean_response_logits(*args)
    keep = roll.response_mask.bool()
    torch.testing.assert_close(sdpa[keep], matmul[keep], atol=1e-5, rtol=1e-5)


def test_greedy_decoding_equals_generate_with_and_without_lean(model_tok):
    model, tok = model_tok
    sp = Sampling(max_new_tokens=12, temperature=0.0)
    ref = _engine("hf", model, tok).generate(_prompts(tok), sp)
    for lean in (True, False):
        out = _engine("torch", model, tok, lean).generate(_prompts(tok), sp)
        assert torch.equal(out.input_ids, ref.input_ids) and torch.equal(out.response_mask, ref.response_mask)
        assert out.finish_reason == ref.finish_reason
        torch.testing.assert_close(out.logprobs, ref.logprobs, atol=1e-5, rtol=1e-5)


def test_sampled_logprobs_are_the_policy_logprobs(model_tok):
    model, tok = model_tok
    roll = _rollout(model, tok, seed=2)
    lp = chunked_logprobs(model, roll.input_ids, roll.attention_mask, roll.prompt_length, 1.0, 5, lean=False)
    torch.testing.assert_close(lp * roll.response_mask, roll.logprobs, atol=1e-5, rtol=1e-5)
    lean = chunked_logprobs(model, roll.input_ids, roll.attention_mask, roll.prompt_length, 1.0, 5, lean=True)
    torch.testing.assert_close(lean * roll.response_mask, roll.logprobs, atol=1e-5, rtol=1e-5)


def test_bfloat16_stays_within_bf16_rounding():
    model, tok = _load("qwen2", {}, dtype="bfloat16")
    roll = _rollout(model, tok, seed=3)
    with torch.no_grad():
        hf = response_logits(model, roll.input_ids, roll.attention_mask, roll.prompt_length).float()
    lean = lean_response_logits(model, roll.input_ids, roll.attention_mask, roll.prompt_length).float()
    keep = roll.response_mask.bool()
    assert (lean[keep] - hf[keep]).abs().max() < 0.1  # bf16 ulp at |logit| ~ 4 is 0.03


def test_uncovered_models_name_the_reason_and_fall_back():
    import transformers
    from peft import LoraConfig, get_peft_model

    model, tok = _load("qwen2", {})
    peft = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
    assert "PeftModel" in lean_decoder.unsupported_reason(peft)
    cfg = transformers.Qwen2Config(**{**BASE, "vocab_size": 128, "use_sliding_window": True, "sliding_window": 4,
                                     "max_window_layers": 0})
    assert "sliding" in lean_decoder.unsupported_reason(transformers.Qwen2ForCausalLM(cfg))
    flash = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**BASE, "vocab_size": 128}))
    flash.config._attn_implementation = "flash_attention_2"
    assert "flash_attention_2" in lean_decoder.unsupported_reason(flash)
    cfg = transformers.LlamaConfig(**{**BASE, "vocab_size": 128, "hidden_act": "gelu"})
    assert "hidden_act" in lean_decoder.unsupported_reason(transformers.LlamaForCausalLM(cfg))
    cfg = transformers.LlamaConfig(**{**BASE, "vocab_size": 128, "rope_parameters": {
        "rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}})
    assert "dynamic" in lean_decoder.unsupported_reason(transformers.LlamaForCausalLM(cfg))
    # an uncovered model still samples through the HF module: the same greedy tokens as generate
    base = peft.get_base_model()
    sp = Sampling(max_new_tokens=8, temperature=0.0)
    a = _engine("hf", peft, tok).generate(_prompts(tok), sp)
    b = _engine("torch", peft, tok).generate(_prompts(tok), sp)
    assert torch.equal(a.input_ids, b.input_ids) and base is not None


def test_inverse_cdf_draws_the_distribution():
    torch.manual_seed(0)
    probs = torch.tensor([0.0, 0.5, 0.3, 0.0, 0.15, 0.05, 0.0]) * 3.0  # unnormalised, zeros inside and at the ends
    n = 40_000
    draws = inverse_cdf(probs.expand(n, -1))
    freq = torch.bincount(draws, minlength=7).double() / n
    expected = (probs / probs.sum()).double()
    assert freq[expected == 0].sum() == 0  # zero-probability entries never drawn
    sigma = (expected * (1 - expected) / n).sqrt()
    assert ((freq - expected).abs() <= 5 * sigma + 1e-12).all(), (freq, expected)
    one = inverse_cdf(torch.tensor([[0.0, 0.0, 1.0]]).expand(100, -1))
    assert (one == 2).all()


@pytest.mark.parametrize("lean", [True, False])
def test_dropping_finished_rows_keeps_every_row_aligned(model_tok, monkeypatch, lean):
    """Greedy: the same rollout with and without dropping finished rows (after a drop happened).
    Sampled: each row's recorded log-prob is its token's log-prob under a teacher-forced forward, so no
    row's cache, position or mask was mixed up with another's when the batch shrank."""
    model, tok = model_tok
    widths = []
    if lean:
        fwd = lean_decoder.LeanDecoder.forward
        monkeypatch.setattr(lean_decoder.LeanDecoder, "forward",
                            lambda self, ids, *a: widths.append(ids.shape[0]) or fwd(self, ids, *a))
    else:
        call = type(model).forward
        monkeypatch.setattr(type(model), "forward", lambda self, input_ids=None, **k: widths.append(
            input_ids.shape[0]) or call(self, input_ids=input_ids, **k))
    cfg = {"generation_batch_size": 0, "lean_forward": lean}
    greedy = Sampling(max_new_tokens=16, temperature=0.0)
    on = build_engine("torch", model, tok, OmegaConf.create({**cfg, "drop_finished": True})).generate(_prompts(tok), greedy)
    n = len(_prompts(tok))
    assert min(widths) < n, "no row finished early enough to be dropped: the test would prove nothing"
    off = build_engine("torch", model, tok, OmegaConf.create({**cfg, "drop_finished": False})).generate(_prompts(tok), greedy)
    assert torch.equal(on.input_ids, off.input_ids) and on.finish_reason == off.finish_reason
    torch.testing.assert_close(on.logprobs, off.logprobs, atol=1e-5, rtol=1e-5)
    widths.clear()
    torch.manual_seed(8)
    roll = build_engine("torch", model, tok, OmegaConf.create(cfg)).generate(_prompts(tok), Sampling(16, 1.0))
    assert min(widths) < n
    monkeypatch.undo()
    lp = chunked_logprobs(model, roll.input_ids, roll.attention_mask, roll.prompt_length, 1.0, 64, lean=False)
    torch.testing.assert_close(lp * roll.response_mask, roll.logprobs, atol=1e-5, rtol=1e-5)


def test_separate_projections_above_the_fusion_limit(model_tok, monkeypatch):
    """Under the limit the projections are fused row-major copies; a model whose copies would exceed it
    keeps its own weights (views, separate GEMMs): the same logits and the same greedy decoding."""
    model, tok = model_tok
    roll = _rollout(model, tok, seed=9)
    args = (model, roll.input_ids, roll.attention_mask, roll.prompt_length)
    own = {p.data_ptr() for p in model.parameters()}
    layers = lean_decoder.LeanDecoder(model).layers
    assert all(len(L.qkv) == 1 and len(L.gu) == 1 for L in layers)
    copies = [w for L in layers for w in (L.qkv[0][0], L.wo, L.gu[0][0], L.wd)]
    assert all(w.is_contiguous() and w.data_ptr() not in own for w in copies)
    fused = lean_response_logits(*args)
    monkeypatch.setattr(lean_decoder, "_FUSE_MAX_BYTES", 0)
    layers = lean_decoder.LeanDecoder(model).layers
    assert all(len(L.qkv) == 3 and len(L.gu) == 2 for L in layers)
    assert all(w.data_ptr() in own for L in layers for w in (*(p[0] for p in L.qkv + L.gu), L.wo, L.wd))
    keep = roll.response_mask.bool()
    torch.testing.assert_close(lean_response_logits(*args)[keep], fused[keep], atol=1e-5, rtol=1e-5)
    sp = Sampling(max_new_tokens=12, temperature=0.0)
    ref = _engine("hf", model, tok).generate(_prompts(tok), sp)
    out = _engine("torch", model, tok).generate(_prompts(tok), sp)
    assert torch.equal(out.input_ids, ref.input_ids) and torch.equal(out.response_mask, ref.response_mask)


def test_softmax_written_out_below_16_entries_equals_torch():
    """Short last dims (where torch's CPU kernel is slow) take the written-out form: the same
    probabilities to float rounding, exact zeros under -inf, and under autograd torch's own kernel."""
    gen = torch.Generator().manual_seed(0)
    checked = 0
    for width in (1, 2, 5, 7, 15, 16, 21):
        s = torch.randn(6, 3, width, generator=gen) * 4
        s[..., ::3][..., 1:] = float("-inf")  # masked keys (every row keeps its first)
        p = lean_decoder.softmax(s)
        torch.testing.assert_close(p, torch.softmax(s, -1), atol=1e-6, rtol=1e-6)
        assert (p[s == float("-inf")] == 0).all()
        checked += 1
    s = torch.randn(4, 7, requires_grad=True)
    lean_decoder.softmax(s)[:, 0].sum().backward()
    torch.testing.assert_close(s.grad, torch.autograd.grad(torch.softmax(s, -1)[:, 0].sum(), s)[0])
    assert checked == 7
