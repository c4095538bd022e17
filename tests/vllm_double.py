"""A recording test double standing in for the ``vllm`` module on CPU: ``LLM`` and ``SamplingParams``.

Passed to ``VLLMRollout(..., vllm=vllm_double)``; production code never sees it. ``RecordingLLM`` keeps, in
order, every call the engine makes (``events``), each pushed weight (name, shape, a copy of its values),
and, per generate call, the prompts, each request's parameters, its seed and the tokens it generated. ``probe``,
when set, is called at each weight load and each generate and its value recorded (the tests read how many parameter
elements ZeRO-3 holds whole at that moment).

It samples where vLLM 0.31.0's default GPU runner (Model Runner V2) takes its randomness from, so a test sees what
a rank's random state does to a colocated engine:

- ``LLM(seed=s)`` seeds the process's generators (python, numpy, torch) as vLLM's worker does when it starts
  (``vllm/utils/torch_utils.py`` ``set_random_seed``, called from ``v1/worker/gpu_worker.py``); under
  ``external_launcher`` that process is the trainer's rank;
- a request's seed is its ``SamplingParams.seed``, or, when it has none (or -1), one drawn from the process's numpy
  generator when the request is added, greedy or not (``v1/worker/gpu/sample/states.py`` ``add_request``): on each
  rank, from that rank's state;
- a sampled token's noise is a function of the request's seed and the token's position alone
  (``v1/worker/gpu/sample/gumbel.py``); temperature 0 takes the greedy token and uses no noise.

What it generates (:func:`completion`) reads only the prompt, and the seed when sampling: ``max_tokens`` tokens,
step ``k``'s greedy token being the prompt's last token plus ``1 + k``, a sampled one that plus ``d`` in 0..3 drawn
from (seed, position); its log-prob ``-(k + 1) / 8 - prompt[0] / 128 - d / 16`` (exact in float32). Token ids wrap
at the model's ``vocab_size`` (its ``config.json``). Log-probs come back only when the request asks for them
(``logprobs`` not None), as vLLM returns them.
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

INT64 = np.iinfo(np.int64)


class SamplingParams(SimpleNamespace):
    """vLLM's sampling parameters, kept as given."""


class _Model:
    def __init__(self, llm: "RecordingLLM"):
        self.llm = llm

    def load_weights(self, weights) -> None:
        for name, tensor in weights:
            self.llm.loads.append({"name": name, "shape": tuple(tensor.shape), "values": tensor.detach().clone(),
                                   "probe": self.llm.probe() if self.llm.probe else None})
            self.llm.events.append(("load_weights", name))


class RecordingLLM:
    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.events: list[tuple] = []
        self.loads: list[dict] = []
        self.prompts: list[list[list[int]]] = []  # per generate call
        self.params: list[list] = []  # per generate call: each request's SamplingParams
        self.seeds: list[list[int]] = []  # per generate call: each request's seed, given or drawn
        self.outputs: list[list[list[int]]] = []  # per generate call: each request's tokens
        self.probe = None
        self.generate_probes: list = []
        self.vocab = _vocab_size(kwargs.get("model"))
        runner = SimpleNamespace(model=_Model(self))
        self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(driver_worker=SimpleNamespace(
            model_runner=runner)))
        if kwargs.get("seed") is not None:  # vLLM's worker, at start: set_random_seed(model_config.seed)
            random.seed(kwargs["seed"])
            np.random.seed(kwargs["seed"])
            torch.manual_seed(kwargs["seed"])

    def generate(self, prompts, sampling_params, use_tqdm=True):
        self.events.append(("generate", len(prompts)))
        self.generate_probes.append(self.probe() if self.probe else None)
        ids = [list(p["prompt_token_ids"]) for p in prompts]
        params = sampling_params if isinstance(sampling_params, (list, tuple)) else [sampling_params] * len(ids)
        seeds = [_request_seed(p) for p in params]  # in the order the requests are added
        outs = [_output(p, sp, seed, self.vocab) for p, sp, seed in zip(ids, params, seeds)]
        self.prompts.append(ids)
        self.params.append(list(params))
        self.seeds.append(seeds)
        self.outputs.append([list(o.outputs[0].token_ids) for o in outs])
        return outs

    def sleep(self, level: int = 1) -> None:
        self.events.append(("sleep", level))

    def wake_up(self, tags=None) -> None:
        self.events.append(("wake_up", tuple(tags) if tags is not None else None))

    def reset_prefix_cache(self) -> None:
        self.events.append(("reset_prefix_cache",))


def _vocab_size(model) -> int | None:
    config = Path(str(model)) / "config.json" if model else None
    return json.loads(config.read_text()).get("vocab_size") if config and config.is_file() else None


def _request_seed(params) -> int:
    """The request's own seed, else one from numpy's global generator (Model Runner V2's ``add_request``)."""
    seed = getattr(params, "seed", None)
    return int(np.random.randint(INT64.min, INT64.max)) if seed is None or seed == -1 else int(seed)


def completion(prompt: list[int], max_tokens: int, temperature: float = 0.0, seed: int = 0,
               vocab: int | None = None) -> tuple[list[int], list[float]]:
    """What :class:`RecordingLLM` generates for ``prompt``: tokens and their log-probs."""
    tokens, lps = [], []
    for k in range(max_tokens):
        pos = len(prompt) + k  # the noise is placed by (seed, position), as vLLM's Gumbel kernel places it
        d = int(4 * random.Random(f"{seed}:{pos}").random()) if temperature > 0 else 0
        token = prompt[-1] + 1 + k + d
        tokens.append(token % vocab if vocab else token)
        lps.append(-(k + 1) / 8 - prompt[0] / 128 - d / 16)
    return tokens, lps


def _output(prompt: list[int], params, seed: int, vocab: int | None):
    tokens, lps = completion(prompt, params.max_tokens, params.temperature, seed, vocab)
    steps = [{t: SimpleNamespace(logprob=lp, rank=1)} for t, lp in zip(tokens, lps)] \
        if getattr(params, "logprobs", None) is not None else None
    return SimpleNamespace(prompt_token_ids=prompt, outputs=[SimpleNamespace(token_ids=tokens, logprobs=steps)])


LLM = RecordingLLM  # the name the engine asks the module for
