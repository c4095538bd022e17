"""The HF rollout engine: shapes, masks, EOS handling, log-probs against a separate forward pass, and the
sampling distribution the recipe asks for whatever the checkpoint's generation_config.json says."""
from __future__ import annotations

import pytest
import torch

from core.config import schema
from core.models.logprobs import response_logprobs
from core.rollout import Sampling, build_rollout
from core.rollout.batch import assemble, concat_rollouts, left_pad, response_mask_from_ids
from tests.helpers import tiny_model


@pytest.fixture(scope="module")
def model_tok():
    return tiny_model()


def _prompts(tok):
    texts = ["1+2=", "10+20=", "3=", "99+99+99="]  # different lengths: exercises left padding
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def _engine(model, tok, **kw):
    return build_rollout("hf", model, tok, schema.node(schema.RolloutConfig, {"generation_batch_size": 0, **kw}))


def test_response_mask_stops_after_first_eos():
    resp = torch.tensor([[5, 1, 7, 1], [5, 6, 7, 8], [1, 2, 3, 4]])  # eos id 1
    mask, stopped = response_mask_from_ids(resp, [1])
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert stopped.tolist() == [True, False, True]
    roll = assemble(*left_pad([[3], [3, 4], [2]], 0), resp, [1], 0, torch.zeros(3, 4))
    assert roll.finish_reason == ["stop", "length", "stop"]
    assert roll.response_ids.tolist() == [[5, 1, 0, 0], [5, 6, 7, 8], [1, 0, 0, 0]]  # pad after EOS


def test_left_pad():
    ids, mask = left_pad([[7], [8, 9, 10]], 0)
    assert ids.tolist() == [[0, 0, 7], [8, 9, 10]] and mask.tolist() == [[0, 0, 1], [1, 1, 1]]


def test_shapes_masks_and_finish_reasons(model_tok):
    model, tok = model_tok
    eng = _engine(model, tok)
    # Many EOS ids so that some samples stop and some run to the length limit.
    eng.eos_ids = sorted(set(tok("abcdef", add_special_tokens=False)["input_ids"]))
    torch.manual_seed(0)
    prompts = _prompts(tok) * 8
    roll = eng.generate(prompts, Sampling(max_new_tokens=12, temperature=1.0))
    N, P = len(prompts), max(len(p) for p in prompts)
    R = roll.response_mask.shape[1]
    assert roll.input_ids.shape == (N, P + R) and roll.attention_mask.shape == (N, P + R)
    assert roll.logprobs.shape == (N, R) and R <= 12 and roll.prompt_length == P
    assert roll.attention_mask[:, :P].sum(1).tolist() == [len(p) for p in prompts]
    reasons = set(roll.finish_reason)
    assert reasons == {"stop", "length"}, reasons  # both cases exercised
    for i in range(N):
        m, ids = roll.response_mask[i], roll.response_ids[i]
        n = int(m.sum())
        assert m[:n].all() and not m[n:].any()  # contiguous
        is_eos = torch.isin(ids[:n], torch.tensor(eng.eos_ids))
        if roll.finish_reason[i] == "stop":
            assert is_eos[-1] and not is_eos[:-1].any()  # EOS included, and only at the end
        else:
            assert n == 12 and not is_eos.any()
        assert (roll.logprobs[i, n:] == 0).all() and (roll.logprobs[i, :n] <= 0).all()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_a_separate_forward_pass(model_tok, temperature):
    model, tok = model_tok
    torch.manual_seed(1)
    roll = _engine(model, tok).generate(_prompts(tok) * 2, Sampling(max_new_tokens=10, temperature=temperature))
    with torch.no_grad():
        lp, _ = response_logprobs(model, roll.input_ids, roll.attention_mask, roll.prompt_length, temperature)
    m = roll.response_mask.bool()
    assert m.sum() > 20
    torch.testing.assert_close(lp[m], roll.logprobs[m], atol=2e-4, rtol=1e-4)


def test_greedy_is_deterministic_and_chunking_does_not_change_it(model_tok):
    model, tok = model_tok
    sp = Sampling(max_new_tokens=8, temperature=0.0)
    a = _engine(model, tok).generate(_prompts(tok), sp)
    b = _engine(model, tok, generation_batch_size=3).generate(_prompts(tok), sp)
    assert torch.equal(a.input_ids, b.input_ids) and a.finish_reason == b.finish_reason


def test_seeded_sampling_repeats_bit_for_bit(model_tok):
    model, tok = model_tok
    outs = []
    for _ in range(2):
        torch.manual_seed(3)
        outs.append(_engine(model, tok).generate(_prompts(tok), Sampling(max_new_tokens=8)))
    assert torch.equal(outs[0].input_ids, outs[1].input_ids)
    assert torch.equal(outs[0].logprobs, outs[1].logprobs)


def test_logprobs_not_asked_for_are_none_and_the_draws_are_the_same(model_tok):
    """``Sampling(logprobs=False)``: the batch's log-probs are None (in chunks too), and the tokens are those drawn
    with them (recording them draws nothing)."""
    model, tok = model_tok
    outs = []
    for asked in (True, False):
        torch.manual_seed(3)
        outs.append(_engine(model, tok, generation_batch_size=3).generate(
            _prompts(tok), Sampling(max_new_tokens=8, logprobs=asked)))
    assert outs[0].logprobs is not None and outs[1].logprobs is None and outs[1].head(2).logprobs is None
    assert torch.equal(outs[0].input_ids, outs[1].input_ids)


def test_concat_rollouts_repads_both_sides(model_tok):
    model, tok = model_tok
    eng = _engine(model, tok)
    sp = Sampling(max_new_tokens=6, temperature=0.0)
    p = _prompts(tok)
    parts = [eng.generate(p[:1], sp), eng.generate(p[3:], sp)]
    both = concat_rollouts(parts, tok.pad_token_id)
    for i, part in enumerate(parts):
        n = int(part.response_mask.sum())
        assert both.response_ids[i, :n].tolist() == part.response_ids[0, :n].tolist()
        assert int(both.attention_mask[i].sum()) == int(part.attention_mask[0].sum())


def test_unknown_engine_lists_names(model_tok):
    model, tok = model_tok
    with pytest.raises(KeyError, match="hf"):
        build_rollout("nope", model, tok, schema.node(schema.RolloutConfig))


def test_the_checkpoints_generation_defaults_do_not_leak_in(model_tok):
    """A checkpoint's generation_config.json (Qwen2.5-Instruct: top_k 20, top_p 0.8, repetition_penalty
    1.05) must not change the recipe's sampling: the same draws with and without such defaults."""
    model, tok = model_tok
    outs = []
    for defaults in ({}, {"top_k": 2, "top_p": 0.5, "repetition_penalty": 3.0, "temperature": 0.1}):
        saved = model.generation_config
        model.generation_config = type(saved)(**{**saved.to_dict(), **defaults})
        try:
            torch.manual_seed(7)
            outs.append(_engine(model, tok).generate(_prompts(tok) * 2, Sampling(max_new_tokens=10, temperature=1.0)))
        finally:
            model.generation_config = saved
    assert torch.equal(outs[0].input_ids, outs[1].input_ids)
    assert torch.equal(outs[0].logprobs, outs[1].logprobs)


def test_stop_token_ids_end_a_completion_like_an_eos(model_tok):
    """``rollout.stop_token_ids`` (SimpleRL-Zoo's vLLM stop ids): generation stops on the first one, which stays in
    the response and its mask, and the completion finishes as "stop"."""
    model, tok = model_tok
    sp, prompts = Sampling(max_new_tokens=8, temperature=0.0), _prompts(tok)
    free = _engine(model, tok).generate(prompts, sp)
    # a token first appearing before a row's last masked position (not an EOS): the id to stop on
    picks = [(r, p) for r in range(len(prompts)) for p in range(int(free.response_mask[r].sum()) - 1)
             if free.response_ids[r, p] not in free.response_ids[r, :p]]
    assert picks, "the tiny model's greedy completions must give a token to stop on"
    row, pos = max(picks, key=lambda rp: rp[1])  # the latest: most of the row must match the free run
    resp = free.response_ids[row].tolist()
    stopped = _engine(model, tok, stop_token_ids=[resp[pos]]).generate([prompts[row]], sp)
    assert stopped.response_ids[0, :pos + 1].tolist() == resp[:pos + 1]
    assert stopped.response_mask[0].tolist() == [1] * (pos + 1) + [0] * (stopped.response_mask.shape[1] - pos - 1)
    assert stopped.finish_reason == ["stop"]
