"""What text a verifier reads of each sample (``verifier.text``), keyed by config name.

``completion`` (the default) is the generated text with special tokens skipped: TRL's ``completions``, which
every verifier here is written for. ``prompt_completion_raw`` is what veRL's reward manager hands its score
function: the prompt's and the response's kept tokens decoded together, special tokens kept
(``tokenizer.decode(cat(valid_prompt_ids, valid_response_ids))``, hkust-nlp/simpleRL-reason
``verl/trainer/main_ppo.py::RewardManager.__call__`` @cf1c785). SimpleRL-Zoo's score function depends on both:
it keeps the text from the first ``<|im_start|>assistant`` (the prompt's, since the data is pre-templated) and
cuts at the first ``<|im_end|>`` / ``<|endoftext|>`` (the 14B and 32B runs have no stop ids, so their
responses run past ``<|im_end|>`` into new turns, and only the first turn is scored).
"""
from __future__ import annotations

from typing import Callable

from core.registry import Registry
from core.rollout.batch import RolloutBatch

# name -> fn(tokenizer, rollout batch, decoded completions) -> one text per sample
TextFn = Callable[[object, RolloutBatch, "list[str]"], "list[str]"]
REWARD_TEXTS: Registry[TextFn] = Registry("verifier text")


@REWARD_TEXTS.register("completion")
def completion(tokenizer, roll: RolloutBatch, completions: list[str]) -> list[str]:
    """The decoded completions as they are (special tokens skipped)."""
    return completions


@REWARD_TEXTS.register("prompt_completion_raw")
def prompt_completion_raw(tokenizer, roll: RolloutBatch, completions: list[str]) -> list[str]:
    """Prompt and response tokens under the attention mask (real prompt tokens, response tokens up to and
    including the stop token) decoded together with their special tokens."""
    keep = roll.attention_mask.bool()  # [N, P+R]
    return [tokenizer.decode(row[m].tolist(), skip_special_tokens=False) for row, m in zip(roll.input_ids, keep)]
