"""A recording test double standing in for the ``vllm`` module on CPU: ``LLM`` and ``SamplingParams``.

Passed to ``VLLMRollout(..., vllm=vllm_double)``; production code never sees it. ``RecordingLLM`` keeps, in
order, every call the engine makes (``events``), each pushed weight (name, shape, a copy of its values),
and the prompts it generated for. ``generate`` is deterministic and reads only the prompt: ``max_tokens``
tokens counting up from the prompt's last token plus one, the log-prob of step ``k`` being
``-(k + 1) / 8 - prompt[0] / 128`` (:func:`completion`). ``probe``, when set, is called at each weight load and each generate and its value
recorded (the tests read how many parameter elements ZeRO-3 holds whole at that moment).
"""
from __future__ import annotations

from types import SimpleNamespace


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
        self.probe = None
        self.generate_probes: list = []
        runner = SimpleNamespace(model=_Model(self))
        self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(driver_worker=SimpleNamespace(
            model_runner=runner)))

    def generate(self, prompts, sampling_params, use_tqdm=True):
        self.events.append(("generate", len(prompts)))
        self.generate_probes.append(self.probe() if self.probe else None)
        ids = [list(p["prompt_token_ids"]) for p in prompts]
        self.prompts.append(ids)
        return [_output(p, sampling_params.max_tokens) for p in ids]

    def sleep(self, level: int = 1) -> None:
        self.events.append(("sleep", level))

    def wake_up(self, tags=None) -> None:
        self.events.append(("wake_up", tuple(tags) if tags is not None else None))

    def reset_prefix_cache(self) -> None:
        self.events.append(("reset_prefix_cache",))


def completion(prompt: list[int], max_tokens: int) -> tuple[list[int], list[float]]:
    """What :class:`RecordingLLM` generates for ``prompt``: tokens and their log-probs."""
    return ([prompt[-1] + 1 + k for k in range(max_tokens)],
            [-(k + 1) / 8 - prompt[0] / 128 for k in range(max_tokens)])


def _output(prompt: list[int], max_tokens: int):
    tokens, lps = completion(prompt, max_tokens)
    steps = [{t: SimpleNamespace(logprob=lp, rank=1)} for t, lp in zip(tokens, lps)]
    return SimpleNamespace(prompt_token_ids=prompt, outputs=[SimpleNamespace(token_ids=tokens, logprobs=steps)])


LLM = RecordingLLM  # the name the engine asks the module for
