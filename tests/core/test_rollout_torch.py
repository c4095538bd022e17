"""The ``torch`` rollout engine: same rollouts as ``hf`` greedily, log-probs equal a forward pass."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from core.models import build_tiny_model_dir, load_causal_lm, load_tokenizer
from core.policy import response_logprobs
from core.rollout import Sampling, _sample, build_engine

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 512, "tie_word_embeddings": True}


@pytest.fixture(scope="module")
def model_tok():
    d = str(build_tiny_model_dir("qwen2", TINY, 0))
    return load_causal_lm(d, OmegaConf.create({})), load_tokenizer(d)


def _prompts(tok, group=3):
    return [tok(s, add_special_tokens=False)["input_ids"] for s in ["12+3=", "1+1=", "45+67="] for _ in range(group)]


def _engine(name, model, tok):
    return build_engine(name, model, tok, OmegaConf.create({"generation_batch_size": 0}))


def test_greedy_equals_hf_generate(model_tok):
    model, tok = model_tok
    sp = Sampling(max_new_tokens=12, temperature=0.0)
    a = _engine("hf", model, tok).generate(_prompts(tok), sp)
    b = _engine("torch", model, tok).generate(_prompts(tok), sp)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.response_mask, b.response_mask)
    assert a.finish_reason == b.finish_reason
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_match_a_forward_pass(model_tok, temperature):
    model, tok = model_tok
    torch.manual_seed(0)
    roll = _engine("torch", model, tok).generate(_prompts(tok, 4), Sampling(max_new_tokens=10, temperature=temperature))
    lp, _ = response_logprobs(model.eval(), roll.input_ids, roll.attention_mask, roll.prompt_length, temperature)
    torch.testing.assert_close(lp * roll.response_mask, roll.logprobs, atol=1e-5, rtol=1e-5)
    assert roll.input_ids.shape[0] == 12 and set(roll.finish_reason) <= {"stop", "length"}


def test_top_k_and_top_p_truncate():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).expand(2000, 4)
    torch.manual_seed(0)
    k, _ = _sample(logits, Sampling(max_new_tokens=1, temperature=1.0, top_k=2))
    assert set(k.tolist()) == {0, 1}
    p, lp = _sample(logits, Sampling(max_new_tokens=1, temperature=1.0, top_p=0.8))
    assert set(p.tolist()) == {0, 1}  # 0.5 + 0.3 reaches 0.8
    torch.testing.assert_close(lp[p == 0], torch.full_like(lp[p == 0], torch.log(torch.tensor(0.5)).item()))
