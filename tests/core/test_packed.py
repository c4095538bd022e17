"""``core.packed``: padding-free log-probs, entropies and gradients equal to the padded HF forward's
(Qwen2 and Llama, GQA and MHA, biases, linear RoPE, left padding, shared and distinct prompts, early
EOS), zeros on padded slots, the edge widths, the SDPA branch, and the fallback for what it does not
cover."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from core import lean_decoder, packed
from core.policy import chunked_logprobs, response_logprobs
from core.rollout import Sampling

from core.models import load_tokenizer
from tests.core.test_lean_decoder import MODELS, _engine, _load, _rollout


@pytest.fixture(scope="module", params=sorted(MODELS))
def model_tok(request):
    return _load(*MODELS[request.param])


def _both(model, roll, temperature=0.7, weights_seed=0):
    """Log-probs, entropies and parameter gradients of a weighted sum over kept tokens, padded HF vs packed."""
    keep = roll.response_mask.bool()
    w = torch.randn(keep.shape, generator=torch.Generator().manual_seed(weights_seed))
    out = {}
    for name, pack in (("hf", False), ("packed", True)):
        model.zero_grad(set_to_none=True)
        lp, ent = response_logprobs(model, roll.input_ids, roll.attention_mask, roll.prompt_length, temperature,
                                    with_entropy=True, entropy_grad=True, packing=pack)
        ((lp * w * keep).sum() + (ent * keep).sum()).backward()
        out[name] = (lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    return out["hf"], out["packed"], keep


def _assert_grads_close(a: dict, b: dict) -> int:
    """Every parameter's gradient within float rounding: 1e-5 of its own largest entry, or 1e-7 of the
    largest gradient anywhere (rounding of the big terms reaches the small gradients, e.g. of k_proj)."""
    overall = max(g.abs().max().item() for g in a.values())
    for n in a:
        scale = a[n].abs().max().item()
        torch.testing.assert_close(b[n], a[n], atol=1e-5 * scale + 1e-7 * overall, rtol=1e-4, msg=n)
    return len(a)


def test_logprobs_entropies_and_gradients_equal_the_padded_forward(model_tok):
    model, tok = model_tok
    roll = _rollout(model, tok)
    assert (roll.response_mask == 0).any(), "some completion should stop early (padding after the EOS)"
    hf, pk, keep = _both(model, roll)
    assert keep.sum() > 20
    torch.testing.assert_close(pk[0][keep], hf[0][keep], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pk[1][keep], hf[1][keep], atol=1e-5, rtol=1e-5)
    assert (pk[0][~keep] == 0).all() and (pk[1][~keep] == 0).all()
    assert _assert_grads_close(hf[2], pk[2]) == len(list(model.parameters()))


def test_distinct_prompts_and_no_left_padding(model_tok):
    model, tok = model_tok
    torch.manual_seed(4)
    prompts = [tok(s, add_special_tokens=False)["input_ids"] for s in ("12+3=", "45+6=", "99+1=")]  # equal lengths
    roll = _engine("torch", model, tok).generate(prompts, Sampling(max_new_tokens=9, temperature=1.0))
    assert bool(roll.attention_mask[:, :roll.prompt_length].all())
    hf, pk, keep = _both(model, roll, temperature=1.0)
    torch.testing.assert_close(pk[0][keep], hf[0][keep], atol=1e-5, rtol=1e-5)
    _assert_grads_close(hf[2], pk[2])


@pytest.mark.parametrize("max_new", [1, 2])
def test_shortest_responses(max_new):
    model, tok = _load(*MODELS["qwen2_gqa"])
    roll = _rollout(model, tok, max_new=max_new, seed=5)
    assert roll.response_mask.shape[1] == max_new
    hf, pk, keep = _both(model, roll)
    torch.testing.assert_close(pk[0][keep], hf[0][keep], atol=1e-5, rtol=1e-5)
    _assert_grads_close(hf[2], pk[2])


def test_an_empty_response_block():
    model, tok = _load(*MODELS["qwen2_gqa"])
    ids, am = torch.tensor([[5, 6, 7], [8, 9, 10]]), torch.ones(2, 3, dtype=torch.long)
    lp, ent = packed.packed_logprobs(model, ids, am, 3, with_entropy=True)
    assert lp.shape == (2, 0) and ent.shape == (2, 0)


def test_no_grad_passes_and_the_sdpa_branch(model_tok, monkeypatch):
    model, tok = model_tok
    roll = _rollout(model, tok, seed=6)
    args = (model, roll.input_ids, roll.attention_mask, roll.prompt_length, 0.9, 5)
    keep = roll.response_mask.bool()
    padded = chunked_logprobs(*args, lean=False, packing=False)
    pk = chunked_logprobs(*args, packing=True)
    assert not pk.is_inference() and (pk[~keep] == 0).all()
    torch.testing.assert_close(pk[keep], padded[keep], atol=1e-5, rtol=1e-5)
    monkeypatch.setattr(lean_decoder, "_SDPA_ABOVE", 0)
    torch.testing.assert_close(chunked_logprobs(*args, packing=True)[keep], padded[keep], atol=1e-5, rtol=1e-5)


def test_a_rollout_is_laid_out_once_for_its_forwards(model_tok, monkeypatch):
    """The reference's no-grad pass (inference mode) and the policy's training pass over the same batch
    share one layout, which autograd can still save (built outside inference mode); the gradients equal
    those from a layout of its own. Another batch, the same tensor changed in place, or another attention
    form each lay out afresh."""
    import copy

    model, tok = model_tok
    ref = copy.deepcopy(model)
    roll = _rollout(model, tok, seed=4)
    built, real = [], packed._layout
    monkeypatch.setattr(packed, "_layout", lambda *a: built.append(1) or real(*a))
    monkeypatch.setattr(packed, "MANUAL_BACKWARD", False)  # autograd saves the layout's tensors
    packed._LAST.clear()
    chunked_logprobs(ref, roll.input_ids, roll.attention_mask, roll.prompt_length, 0.7, 64, packing=True)
    shared = _packed_grads(model, roll, entropy_grad=False)
    assert len(built) == 1
    packed._LAST.clear()
    own = _packed_grads(model, roll, entropy_grad=False)
    assert len(built) == 2
    assert torch.equal(shared[0], own[0]) and all(torch.equal(shared[2][n], own[2][n]) for n in own[2])
    ids = roll.input_ids.clone()
    packed.packed_logprobs(model, ids, roll.attention_mask, roll.prompt_length)  # equal content: reused
    assert len(built) == 2
    ids[0, -1] = (ids[0, -1] + 1) % model.config.vocab_size  # in place: the held tensor changed
    packed.packed_logprobs(model, ids, roll.attention_mask, roll.prompt_length)
    assert len(built) == 3
    monkeypatch.setattr(lean_decoder, "_SDPA_ABOVE", 0)
    packed.packed_logprobs(model, ids, roll.attention_mask, roll.prompt_length)
    assert len(built) == 4 and packed._LAST[0][1].r_bias.dim() == 5  # the SDPA form of the mask


def test_unused_slots_of_the_attention_layout_are_zeroed(model_tok):
    """The padded attention layout is allocated empty and only its unused slots are zeroed: with torch
    filling every empty allocation with NaN (deterministic mode's fill), log-probs and gradients stay
    equal to the padded forward's, so no unused slot is read unwritten."""
    from torch.utils import deterministic

    model, tok = model_tok
    roll = _rollout(model, tok, seed=8)
    assert (roll.response_mask == 0).any()  # early EOS: the response block has unused slots
    mode, fill = torch.are_deterministic_algorithms_enabled(), deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    deterministic.fill_uninitialized_memory = True
    try:
        assert torch.empty(4).isnan().all()  # the fill is on
        hf, pk, keep = _both(model, roll)
    finally:
        torch.use_deterministic_algorithms(mode)
        deterministic.fill_uninitialized_memory = fill
    torch.testing.assert_close(pk[0][keep], hf[0][keep], atol=1e-5, rtol=1e-5)
    assert _assert_grads_close(hf[2], pk[2]) == len(list(model.parameters()))


def test_bfloat16_stays_within_bf16_rounding():
    model, tok = _load("qwen2", {}, dtype="bfloat16")
    roll = _rollout(model, tok, seed=3)
    args = (model, roll.input_ids, roll.attention_mask, roll.prompt_length, 1.0, 64)
    keep = roll.response_mask.bool()
    diff = (chunked_logprobs(*args, packing=True) - chunked_logprobs(*args, packing=False))[keep]
    assert diff.abs().max() < 0.1  # log-probs of bf16 logits (ulp 0.03 at |logit| ~ 4)


def _packed_grads(model, roll, entropy_grad: bool, temperature=0.7):
    keep = roll.response_mask.bool()
    w = torch.randn(keep.shape, generator=torch.Generator().manual_seed(1))
    model.zero_grad(set_to_none=True)
    lp, ent = packed.packed_logprobs(model, roll.input_ids, roll.attention_mask, roll.prompt_length, temperature,
                                     with_entropy=True, entropy_grad=entropy_grad)
    loss = (lp * w * keep).sum() + ((ent * keep).sum() if entropy_grad else 0.0)
    loss.backward()
    return lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("entropy_grad", [False, True])
def test_the_hand_written_backward_equals_autograd(model_tok, monkeypatch, entropy_grad):
    """The update's backward through the packed forward is the hand-written one (spied on), and gives
    autograd's gradients of the same functional forward for every parameter, with and without the
    entropy's gradient; the forward values agree to float rounding (without autograd, short attention
    rows take lean_decoder.softmax's written-out form)."""
    model, tok = model_tok
    roll = _rollout(model, tok, seed=11)
    calls = []
    backward = packed._ManualBackward.backward
    monkeypatch.setattr(packed._ManualBackward, "backward", staticmethod(lambda ctx, *g: calls.append(1) or backward(ctx, *g)))
    manual = _packed_grads(model, roll, entropy_grad)
    assert len(calls) == 1
    monkeypatch.setattr(packed, "MANUAL_BACKWARD", False)
    auto = _packed_grads(model, roll, entropy_grad)
    assert len(calls) == 1
    torch.testing.assert_close(manual[0], auto[0], atol=2e-6, rtol=1e-6)
    torch.testing.assert_close(manual[1], auto[1], atol=2e-6, rtol=1e-6)
    assert _assert_grads_close(auto[2], manual[2]) == len(list(model.parameters()))


def test_the_hand_written_backward_says_where_it_does_not_apply(monkeypatch):
    """float32 only, bmm-form attention only, and a switch; each case names itself."""
    model, tok = _load(*MODELS["qwen2_gqa"])
    roll = _rollout(model, tok, seed=2)
    P = roll.prompt_length
    lay = packed._layout(model, roll.input_ids, roll.attention_mask, P, roll.attention_mask[:, P + 1:].bool())
    assert packed.manual_backward_reason(model, lay) is None
    monkeypatch.setattr(packed, "MANUAL_BACKWARD", False)
    assert "MANUAL_BACKWARD" in packed.manual_backward_reason(model, lay)
    monkeypatch.undo()
    monkeypatch.setattr(lean_decoder, "_SDPA_ABOVE", 0)
    sdpa = packed._layout(model, roll.input_ids, roll.attention_mask, P, roll.attention_mask[:, P + 1:].bool())
    assert "SDPA" in packed.manual_backward_reason(model, sdpa)
    bf16, _ = _load("qwen2", {}, dtype="bfloat16")
    assert "bfloat16" in packed.manual_backward_reason(bf16, lay)


def test_uncovered_models_fall_back_to_the_padded_forward(monkeypatch):
    from peft import LoraConfig, get_peft_model

    model, tok = _load("qwen2", {"attention_dropout": 0.1})
    roll = _rollout(model, tok, seed=7)
    model.train()
    assert "attention_dropout" in packed.unsupported_reason(model)
    model.eval()
    assert packed.unsupported_reason(model) is None  # eval mode applies no dropout
    peft = get_peft_model(_load("qwen2", {})[0], LoraConfig(r=2, target_modules=["q_proj"]))
    assert packed.unsupported_reason(peft) == lean_decoder.unsupported_reason(peft) is not None

    def refuse(*a, **k):
        raise AssertionError("packed forward used for an uncovered model")

    monkeypatch.setattr(packed, "packed_logprobs", refuse)
    model.train()  # dropout active: the padded HF forward must run
    lp, _ = response_logprobs(model, roll.input_ids, roll.attention_mask, roll.prompt_length, packing=True)
    assert lp.shape == roll.response_mask.shape
    chunked_logprobs(peft, roll.input_ids, roll.attention_mask, roll.prompt_length, 1.0, 4, packing=True)


def test_a_prompt_not_left_padded_is_refused():
    model, _ = _load(*MODELS["qwen2_gqa"])
    ids, am = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]]), torch.tensor([[1, 1, 1, 1], [1, 1, 0, 1]])
    with pytest.raises(ValueError, match="left-padded"):
        packed.packed_logprobs(model, ids, am, 3)


def _hf_vs_padded(model, roll, temperature=0.7):
    keep = roll.response_mask.bool()
    w = torch.randn(keep.shape, generator=torch.Generator().manual_seed(1))
    out = []
    for fn in (response_logprobs, packed.hf_packed_logprobs):
        model.zero_grad(set_to_none=True)
        lp, ent = fn(model, roll.input_ids, roll.attention_mask, roll.prompt_length, temperature,
                     with_entropy=True, entropy_grad=True)
        ((lp * w * keep).sum() + (ent * keep).sum()).backward()
        out.append((lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    return out[0], out[1], keep


def test_the_hf_module_on_one_packed_row_equals_the_padded_forward(model_tok):
    """The flash-attn route (``hf_packed_logprobs``) run here through sdpa, where transformers builds the
    block-diagonal mask from the restarting position ids: same log-probs, entropies and gradients."""
    model, tok = model_tok
    roll = _rollout(model, tok, seed=10)
    assert (roll.response_mask == 0).any()
    hf, pk, keep = _hf_vs_padded(model, roll)
    torch.testing.assert_close(pk[0][keep], hf[0][keep], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pk[1][keep], hf[1][keep], atol=1e-5, rtol=1e-5)
    assert (pk[0][~keep] == 0).all()
    assert _assert_grads_close(hf[2], pk[2]) == len(list(model.parameters()))


def test_flash_attn_models_take_the_hf_packed_route():
    model, _ = _load(*MODELS["llama_gqa_bias"])
    assert packed.forward_for(model) is packed.packed_logprobs
    model.config._attn_implementation = "flash_attention_2"
    assert packed.forward_for(model) is packed.hf_packed_logprobs
    model.config._attn_implementation = "sdpa"
    from peft import LoraConfig, get_peft_model

    peft = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
    assert packed.forward_for(peft) is None  # sdpa under a wrapper: an [M, M] mask would be quadratic, stays padded


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("flash_attn") is None,
                    reason="needs a CUDA GPU and the gpu extra (flash-attn)")
def test_flash_attn_varlen_route_on_gpu():
    """On a GPU with flash-attn: the packed row runs variable-length flash attention; log-probs agree with
    the padded flash-attn forward within bf16 rounding, and gradients flow."""
    from core.models import build_tiny_model_dir, load_causal_lm
    from omegaconf import OmegaConf

    from tests.core.test_lean_decoder import BASE
    d = str(build_tiny_model_dir("qwen2", BASE, 0))
    model = load_causal_lm(d, OmegaConf.create({"dtype": "bfloat16", "attn_implementation": "flash_attention_2"}))
    model = model.cuda()
    tok = load_tokenizer(d)
    roll = _rollout(model, tok, seed=11)
    args = [x.cuda() for x in (roll.input_ids, roll.attention_mask)]
    assert packed.forward_for(model) is packed.hf_packed_logprobs
    padded, _ = response_logprobs(model, *args, roll.prompt_length, packing=False)
    lp, _ = response_logprobs(model, *args, roll.prompt_length, packing=True)
    keep = roll.response_mask.bool().cuda()
    assert (lp - padded)[keep].abs().max() < 0.1
    (lp * keep).sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("arch", ["qwen2_gqa", "llama_gqa_bias"])
def test_packed_critic_values_and_gradients_equal_the_padded_critic(arch, tmp_path):
    """Values at every slot whose input token is real (the one after the EOS included: Open-Instruct's
    ``after_last`` score position trains the critic there) and the critic's gradients."""
    from omegaconf import OmegaConf

    from core.models import build_tiny_model_dir
    from core.value import chunked_values, load_critic, token_values
    from tests.core.test_lean_decoder import BASE

    name, extra = MODELS[arch]
    policy, tok = _load(name, extra)
    critic = load_critic(str(build_tiny_model_dir(name, {**BASE, **extra}, 0)),
                         OmegaConf.create({"init_from": None, "head_seed": 0}), OmegaConf.create({}))
    assert packed.unsupported_reason(critic, packed.CRITIC_ARCHS) is None
    roll = _rollout(policy, tok, seed=12)
    P = roll.prompt_length
    real_in = torch.cat([torch.ones_like(roll.response_mask[:, :1]), roll.attention_mask[:, P:-1]], 1).bool()  # [N, R]
    assert (real_in & ~roll.response_mask.bool()).any(), "no slot after an EOS: the after_last case is untested"
    w = torch.randn(real_in.shape, generator=torch.Generator().manual_seed(2))
    out = []
    for pack in (False, True):
        critic.zero_grad(set_to_none=True)
        v = token_values(critic, roll.input_ids, roll.attention_mask, P, packing=pack)
        (v * w * real_in).sum().backward()
        out.append((v.detach(), {n: p.grad.clone() for n, p in critic.named_parameters()}))
    torch.testing.assert_close(out[1][0][real_in], out[0][0][real_in], atol=1e-5, rtol=1e-5)
    assert (out[1][0][~real_in] == 0).all()
    assert _assert_grads_close(out[0][1], out[1][1]) == len(list(critic.parameters()))
    nograd = chunked_values(critic, roll.input_ids, roll.attention_mask, P, 5, packing=True)
    torch.testing.assert_close(nograd, out[1][0], atol=1e-5, rtol=1e-5)
