"""``core.models.packing``: the HF module on one packed row gives the padded forward's log-probs, entropies,
critic values and gradients (Qwen2 and Llama, GQA and MHA, biases, linear RoPE, left padding, early EOS,
sdpa and eager attention); zeros on padded slots; the edge widths; and when packing applies."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from core.config import schema
from core.models import packing
from core.models.critic import chunked_values, load_critic, token_values
from core.models.loading import build_tiny_model_dir, load_causal_lm, load_tokenizer
from core.models.logprobs import chunked_logprobs, response_logprobs
from core.rollout import Sampling, build_rollout

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
ATTENTION = ("sdpa", "eager")


def _load(arch: str, extra: dict, attn: str = "sdpa"):
    d = str(build_tiny_model_dir(arch, {**BASE, **extra}, 0))
    model = load_causal_lm(d, schema.node(schema.ModelConfig, dtype="float32", attn_implementation=attn))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # HF initialises biases to 0 and norms to 1: randomise them so both paths are exercised
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5 + (1.0 if "norm" in name else 0.0))
    return model.eval(), load_tokenizer(d), d


@pytest.fixture(scope="module", params=[(m, a) for m in sorted(MODELS) for a in ATTENTION],
                ids=lambda p: f"{p[0]}-{p[1]}")
def model_tok(request):
    name, attn = request.param
    return _load(*MODELS[name], attn=attn)


def _rollout(model, tok, max_new=12, seed=0, texts=("12+3=", "1+1=", "45+67=", "9=")):
    """Sampled completions of prompts of different lengths (left padding), with several EOS ids so that
    some stop early (right padding after the EOS) and some run to the length limit."""
    eng = build_rollout("hf", model, tok, schema.node(schema.RolloutConfig))
    eng.eos_ids = sorted(set(tok("abcdefgh", add_special_tokens=False)["input_ids"]))
    torch.manual_seed(seed)
    prompts = [tok(s, add_special_tokens=False)["input_ids"] for s in texts for _ in range(3)]
    return eng.generate(prompts, Sampling(max_new_tokens=max_new, temperature=1.0))


def _both(model, roll, temperature=0.7, weights_seed=0):
    """Log-probs, entropies and parameter gradients of a weighted sum over kept tokens, padded vs packed."""
    keep = roll.response_mask.bool()
    w = torch.randn(keep.shape, generator=torch.Generator().manual_seed(weights_seed))
    out = {}
    for mode in (False, True):
        model.zero_grad(set_to_none=True)
        lp, ent = response_logprobs(model, roll.input_ids, roll.attention_mask, roll.prompt_length, temperature,
                                    with_entropy=True, entropy_grad=True, packing=mode)
        ((lp * w * keep).sum() + (ent * keep).sum()).backward()
        out[mode] = (lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    return out[False], out[True], keep


def _assert_grads_close(a: dict, b: dict) -> int:
    """Every parameter's gradient within float rounding: 1e-5 of its own largest entry, or 1e-7 of the
    largest gradient anywhere (rounding of the big terms reaches the small gradients, e.g. of k_proj)."""
    overall = max(g.abs().max().item() for g in a.values())
    for n in a:
        scale = a[n].abs().max().item()
        torch.testing.assert_close(b[n], a[n], atol=1e-5 * scale + 1e-7 * overall, rtol=1e-4, msg=n)
    return len(a)


def test_logprobs_entropies_and_gradients_equal_the_padded_forward(model_tok):
    model, tok, _ = model_tok
    roll = _rollout(model, tok)
    stopped = roll.response_mask.sum(1) < roll.response_mask.shape[1]
    assert stopped.any() and not stopped.all(), "some completions stop early, some run to the limit"
    assert len(set(roll.attention_mask[:, :roll.prompt_length].sum(1).tolist())) > 1  # left padding
    padded, packed, keep = _both(model, roll)
    assert keep.sum() > 20
    torch.testing.assert_close(packed[0][keep], padded[0][keep], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed[1][keep], padded[1][keep], atol=1e-5, rtol=1e-5)
    assert (packed[0][~keep] == 0).all() and (packed[1][~keep] == 0).all()
    assert _assert_grads_close(padded[2], packed[2]) == len(list(model.parameters()))


def test_no_grad_chunks_equal_the_padded_forward(model_tok):
    model, tok, _ = model_tok
    roll = _rollout(model, tok, seed=6)
    args = (model, roll.input_ids, roll.attention_mask, roll.prompt_length, 0.9, 5)  # chunks of 5 rows
    keep = roll.response_mask.bool()
    padded, packed = chunked_logprobs(*args, packing=False), chunked_logprobs(*args, packing=True)
    torch.testing.assert_close(packed[keep], padded[keep], atol=1e-5, rtol=1e-5)
    assert (packed[~keep] == 0).all()


@pytest.mark.parametrize("max_new", [1, 2])
def test_shortest_responses(max_new):
    model, tok, _ = _load(*MODELS["qwen2_gqa"])
    roll = _rollout(model, tok, max_new=max_new, seed=5)
    assert roll.response_mask.shape[1] == max_new
    padded, packed, keep = _both(model, roll)
    torch.testing.assert_close(packed[0][keep], padded[0][keep], atol=1e-5, rtol=1e-5)
    _assert_grads_close(padded[2], packed[2])


def test_an_empty_response_block():
    model, _, _ = _load(*MODELS["qwen2_gqa"])
    ids, am = torch.tensor([[5, 6, 7], [8, 9, 10]]), torch.ones(2, 3, dtype=torch.long)
    lp, ent = response_logprobs(model, ids, am, 3, with_entropy=True, packing=True)
    assert lp.shape == (2, 0) and ent.shape == (2, 0)


def test_the_packed_row_restarts_positions_per_sequence():
    # row 0: prompt [pad, 5, 6], response [7, 8, pad]; row 1: prompt [9, 10, 11], response [12, pad, pad]
    ids = torch.tensor([[0, 5, 6, 7, 8, 0], [9, 10, 11, 12, 0, 0]])
    am = torch.tensor([[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]])
    rows = packing.pack(ids, am, 3, am[:, 4:])  # the policy: response token t runs iff token t + 1 is real
    assert rows.input_ids.tolist() == [[5, 6, 7, 9, 10, 11]]  # the EOS-like last tokens score nothing, so do not run
    assert rows.position_ids.tolist() == [[0, 1, 2, 0, 1, 2]]
    assert rows.scored.tolist() == [[True, True, False], [True, False, False]]  # the real response tokens
    assert rows.source.tolist() == [1, 2, 5]  # hidden states of "6", "7" (row 0) and "11" (row 1)
    assert packing.unpack(torch.tensor([1.0, 2.0, 3.0]), rows).tolist() == [[1, 2, 0], [3, 0, 0]]
    assert rows.cu_seqlens.tolist() == [0, 3, 6] and rows.cu_seqlens.dtype == torch.int32 and rows.max_length == 3


def test_pack_gives_the_boundaries_of_ragged_rows():
    """Left padding of different widths and responses of different lengths: ``cu_seqlens`` marks where each row
    starts in the packed row (then its end), ``max_length`` is the longest row's run, a host int."""
    ids = torch.arange(1, 29).view(4, 7)  # prompt 3 columns, response 4
    am = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0], [0, 1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0]])
    rows = packing.pack(ids, am, 3, am[:, 4:])  # runs: 1+3, 3+0, 2+2, 3+0 tokens
    assert rows.cu_seqlens.tolist() == [0, 4, 7, 11, 14] and rows.max_length == 4
    assert type(rows.max_length) is int and rows.input_ids.shape == (1, 14)
    assert rows.position_ids[0, rows.cu_seqlens[:-1].long()].tolist() == [0, 0, 0, 0]  # each row restarts at 0


def test_a_prompt_not_left_padded_is_refused():
    ids, am = torch.tensor([[5, 6, 0, 7]]), torch.tensor([[1, 1, 0, 1]])
    with pytest.raises(ValueError, match="left-padded"):
        packing.pack(ids, am, 3, am[:, 4:])


def _model(model_type="qwen2", attn="sdpa"):
    return SimpleNamespace(config=SimpleNamespace(model_type=model_type, _attn_implementation=attn))


@pytest.mark.parametrize("model_type, attn, mode, packs", [
    ("qwen2", "sdpa", "auto", False),  # an [M, M] mask: auto packs only where attention is per sequence
    ("qwen2", "sdpa", True, True),
    ("llama", "eager", True, True),
    ("qwen2", "flash_attention_2", "auto", True),
    ("llama", "flash_attention_3", "auto", True),
    ("qwen2", "flash_attention_2", False, False),
    ("gpt2", "flash_attention_2", "auto", False),  # a model type not tested equal: padded, reason logged
    ("qwen2", "flex_attention", True, False),
])
def test_when_packing_applies(model_type, attn, mode, packs):
    assert packing.packs(_model(model_type, attn), mode) is packs


def test_unsupported_models_say_why():
    assert "model_type='gpt2'" in packing.unsupported_reason(_model("gpt2"))
    assert "flex_attention" in packing.unsupported_reason(_model(attn="flex_attention"))
    assert packing.unsupported_reason(_model()) is None


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_packed_critic_values_and_gradients_equal_the_padded_critic(arch):
    """The critic reads a value at every real input token, the EOS included (Open-Instruct's after_last)."""
    model, tok, d = _load(*MODELS["qwen2_gqa" if arch == "qwen2" else "llama_gqa_bias"])
    roll = _rollout(model, tok, seed=3)
    critic = load_critic(d, schema.node(schema.CriticConfig, head_seed=0),
                         schema.node(schema.ModelConfig, dtype="float32"))
    inputs = roll.attention_mask[:, roll.prompt_length - 1:-1].bool()  # [N, R] the input token of each slot is real
    assert (inputs & ~roll.response_mask.bool()).any(), "the slot after an EOS is scored too"
    w = torch.randn(inputs.shape, generator=torch.Generator().manual_seed(2))
    out = {}
    for mode in (False, True):
        critic.zero_grad(set_to_none=True)
        v = token_values(critic, roll.input_ids, roll.attention_mask, roll.prompt_length, packing=mode)
        (v * w * inputs).sum().backward()
        out[mode] = (v.detach(), {n: p.grad.clone() for n, p in critic.named_parameters()})
    torch.testing.assert_close(out[True][0][inputs], out[False][0][inputs], atol=1e-5, rtol=1e-5)
    assert (out[True][0][~inputs] == 0).all()
    assert _assert_grads_close(out[False][1], out[True][1]) == len(list(critic.parameters()))
    chunks = chunked_values(critic, roll.input_ids, roll.attention_mask, roll.prompt_length, 5, packing=True)
    torch.testing.assert_close(chunks[inputs], out[False][0][inputs], atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------------------------------------------------
# Variable-length flash attention on a CPU: transformers' own flash path (``flash_attention_forward`` ->
# ``_flash_attention_forward``) with flash-attn's varlen kernel swapped for a per-sequence sdpa stand-in, so what
# reaches the kernel, and whether transformers derived the boundaries itself, can be checked without a GPU.


def _cpu_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                causal=False):
    """``flash_attn_varlen_func`` on ``q [M, H, D]``, ``k, v [M, H_kv, D]``: causal attention inside each
    ``[cu[i], cu[i + 1])`` (per-sequence sdpa); records the boundaries it was given."""
    _cpu_varlen.seen.append((cu_seqlens_q, max_seqlen_q))
    out = torch.empty_like(q)
    bounds = cu_seqlens_q.tolist()
    for a, b in zip(bounds, bounds[1:]):
        o = torch.nn.functional.scaled_dot_product_attention(
            q[a:b].transpose(0, 1), k[a:b].transpose(0, 1), v[a:b].transpose(0, 1), is_causal=causal,
            scale=softmax_scale, enable_gqa=True)  # [H, L, D]
        out[a:b] = o.transpose(0, 1)
    return out


@pytest.fixture
def cpu_flash(monkeypatch):
    """transformers' flash-attention path runs on the CPU stand-in; returns the count of boundary derivations
    from position ids (``_prepare_from_posids``, what each layer runs when no ``cu_seq_lens`` are given)."""
    from transformers import modeling_flash_attention_utils as fa

    derived = [0]
    real = fa._prepare_from_posids

    def counted(*a, **k):
        derived[0] += 1
        return real(*a, **k)

    _cpu_varlen.seen = []
    fns = ((None, _cpu_varlen, None, None, None), (fa._lazy_define_process_function(_cpu_varlen), dict))
    monkeypatch.setattr(fa, "lazy_import_flash_attention", lambda *a, **k: fns)
    monkeypatch.setattr(fa, "_prepare_from_posids", counted)
    return derived


def _as_flash(model):
    model.config._attn_implementation = "flash_attention_2"  # the stand-in kernel answers it (cpu_flash)
    return model


def test_packed_flash_forwards_hand_the_boundaries_to_every_layer(cpu_flash):
    """Under flash attention a packed forward passes ``cu_seq_lens_q/k`` and ``max_length_q/k`` (pack's, an int)
    to transformers, which hands them to the varlen kernel in every layer and never derives them again from the
    position ids; log-probs and gradients equal the padded sdpa forward's."""
    model, tok, _ = _load(*MODELS["qwen2_gqa"])
    roll = _rollout(model, tok)
    padded, _, keep = _both(model, roll)
    _as_flash(model)
    model.zero_grad(set_to_none=True)
    lp, ent = response_logprobs(model, roll.input_ids, roll.attention_mask, roll.prompt_length, 0.7,
                                with_entropy=True, entropy_grad=True, packing="auto")  # auto: flash packs
    w = torch.randn(keep.shape, generator=torch.Generator().manual_seed(0))
    ((lp * w * keep).sum() + (ent * keep).sum()).backward()
    rows = packing.pack(roll.input_ids, roll.attention_mask, roll.prompt_length,
                        roll.attention_mask[:, roll.prompt_length + 1:])
    assert len(_cpu_varlen.seen) == model.config.num_hidden_layers and cpu_flash[0] == 0
    for cu, longest in _cpu_varlen.seen:
        assert torch.equal(cu, rows.cu_seqlens) and type(longest) is int and longest == rows.max_length
    torch.testing.assert_close(lp[keep], padded[0][keep], atol=1e-5, rtol=1e-5)
    _assert_grads_close(padded[2], {n: p.grad for n, p in model.named_parameters()})


def test_without_the_boundaries_every_layer_derives_them(cpu_flash):
    """What the kwargs save: the same packed row without them makes transformers derive the boundaries from the
    position ids in every layer (host syncs each time on a GPU)."""
    model, tok, _ = _load(*MODELS["qwen2_gqa"])
    roll = _rollout(model, tok)
    rows = packing.pack(roll.input_ids, roll.attention_mask, roll.prompt_length,
                        roll.attention_mask[:, roll.prompt_length + 1:])
    with torch.no_grad():
        _as_flash(model)(input_ids=rows.input_ids, position_ids=rows.position_ids, use_cache=False)
    assert cpu_flash[0] == model.config.num_hidden_layers


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_sdpa_and_eager_forwards_get_no_flash_kwargs(attn, monkeypatch):
    """sdpa and eager keep building their block-diagonal mask from the position ids: no flash kwargs reach them,
    whereas a flash model's packed forward (policy and critic) receives them."""
    model, tok, d = _load(*MODELS["qwen2_gqa"], attn=attn)
    roll = _rollout(model, tok)
    critic = load_critic(d, schema.node(schema.CriticConfig), schema.node(schema.ModelConfig, attn_implementation=attn))
    kwargs = []
    for m in (model, critic.model):
        real = m.forward
        monkeypatch.setattr(m, "forward", lambda *a, _real=real, **k: kwargs.append(k) or _real(*a, **k))
    response_logprobs(model, roll.input_ids, roll.attention_mask, roll.prompt_length, packing=True)
    token_values(critic, roll.input_ids, roll.attention_mask, roll.prompt_length, packing=True)
    assert len(kwargs) == 2 and not any("cu_seq_lens_q" in k for k in kwargs)


def test_packed_flash_critic_and_reward_model_hand_the_boundaries_over(cpu_flash):
    """The critic's packed forward and the reward model's packed pairs under flash attention: the kernel gets
    their boundaries in every layer, none is derived again, and the values equal the padded sdpa forward's."""
    from core.models import reward_model as RM

    model, tok, d = _load(*MODELS["qwen2_gqa"])
    roll = _rollout(model, tok)
    critic = load_critic(d, schema.node(schema.CriticConfig), schema.node(schema.ModelConfig))
    args = (roll.input_ids, roll.attention_mask, roll.prompt_length)
    pairs = [{"chosen": [5, 6, 7, 8], "rejected": [5, 9]}, {"chosen": [10, 11], "rejected": [12, 13, 14]}]
    with torch.no_grad():
        padded = token_values(critic, *args, packing=False), RM.sequence_rewards(critic, RM.pair_batch(pairs, 0))
        packed = token_values(_as_flash(critic), *args, packing="auto"), RM.sequence_rewards(critic, RM.packed_batch(pairs))
    layers = critic.config.num_hidden_layers
    assert len(_cpu_varlen.seen) == 2 * layers and cpu_flash[0] == 0
    assert _cpu_varlen.seen[-1][0].tolist() == [0, 4, 2 + 4, 2 + 4 + 2, 2 + 4 + 2 + 3] and _cpu_varlen.seen[-1][1] == 4
    keep = roll.response_mask.bool()
    torch.testing.assert_close(packed[0][keep], padded[0][keep], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed[1], padded[1], atol=1e-5, rtol=1e-5)
