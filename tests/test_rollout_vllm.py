"""The vLLM engine: output conversion on CPU; the engine itself on a GPU (``gpu`` marker)."""
from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
import torch

from core.config import schema
from core.rollout.vllm import _chosen_logprob, _to_rollout


def test_vllm_outputs_become_a_rollout_with_the_shared_layout():
    # two prompts; the first stops on EOS (id 1), the second is cut at 3 tokens
    roll = _to_rollout([[5, 6], [7]], [[9, 1], [9, 8, 9]], [[-0.5, -0.25], [-1.0, -2.0, -3.0]], [1], 0)
    assert roll.input_ids.tolist() == [[5, 6, 9, 1, 0], [0, 7, 9, 8, 9]]
    assert roll.response_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert roll.finish_reason == ["stop", "length"]
    assert roll.logprobs.tolist() == [[-0.5, -0.25, 0.0], [-1.0, -2.0, -3.0]]


def test_chosen_logprob_reads_the_sampled_token():
    step = {4: SimpleNamespace(logprob=-0.25), 7: SimpleNamespace(logprob=-3.0)}
    assert _chosen_logprob(step, 4) == -0.25 and _chosen_logprob(step, 7) == -3.0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("vllm") is None,
                    reason="needs a CUDA GPU and the gpu extra (vllm)")
def test_vllm_greedy_matches_hf_greedy_and_logprobs_match_a_forward():
    from core.models.logprobs import response_logprobs
    from core.rollout import Sampling, build_rollout
    from tests.helpers import tiny_model

    model, tok = tiny_model()
    model = model.cuda()
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in ["1+2=", "10+20=", "99+1="]]
    sp = Sampling(max_new_tokens=8, temperature=0.0)
    vllm = build_rollout("vllm", model, tok, schema.node(schema.RolloutConfig, {"vllm": {"dtype": "float32"}}))
    hf = build_rollout("hf", model, tok, schema.node(schema.RolloutConfig))
    a, b = vllm.generate(prompts, sp), hf.generate(prompts, sp)
    assert a.response_ids.tolist() == b.response_ids.tolist()
    with torch.no_grad():
        lp, _ = response_logprobs(model, a.input_ids, a.attention_mask, a.prompt_length)
    m = a.response_mask.bool()
    torch.testing.assert_close(lp[m], a.logprobs[m], atol=1e-3, rtol=1e-3)
