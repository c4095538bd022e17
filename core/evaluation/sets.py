"""Evaluation sets: rows through the project's prompt loader, the gold answer each set's source grades against,
and the verifier that scores a completion.

A set (``sets.<name>``, :class:`core.evaluation.schema.EvalSetConfig`) names its file or hub dataset and
columns; the preset's prompt format (``data.template``, ``data.chat_template``, ``data.system_prompt``, ...)
is laid over it, so every set of a preset is asked the same way, and ``core/data/prompts.py`` loads and
tokenizes it exactly as training prompts are (dotted column keys, character and token limits).

Gold answers (``gold``, :data:`verifiers.GOLDS`, verifiers/golds.py): some sets keep the answer inside a longer
column, and the sources take it out before grading as the verifiers parse answers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from omegaconf import OmegaConf

from core.data import prompts as D
from core.registry import Registry
from verifiers import GOLDS

QUESTIONS: Registry[Callable[[Any, dict], Any]] = Registry("sets.<name>.question")


@QUESTIONS.register("as_is")
def question_as_is(value, row: dict):
    """The prompt column as it is."""
    return value


@QUESTIONS.register("mbpp_with_tests")
def mbpp_with_tests(value, row: dict) -> str:
    """MBPP's task text and its three asserts, which name the function to write (Austin et al. 2021,
    arXiv:2108.07732, section 2.1: "Your code should pass these tests:", the tests one per line)."""
    return f"{value}\nYour code should pass these tests:\n\n" + "\n".join(row["test_list"])


# The prompt-data keys a set supplies; the rest of the data node (template, chat template, system prompt,
# length limits) is the preset's prompt format.
SET_KEYS = ("source", "path", "hub_name", "hub_config", "split", "eval_path", "eval_holdout", "eval_split",
            "prompt_key", "answer_key", "eval_prompt_key", "eval_answer_key", "generator", "tiny")


def data_config(set_cfg, fmt):
    """The set as a prompt-data config (core/config/schema.py ``PromptDataConfig``) for its eval split."""
    return OmegaConf.merge(fmt, {
        "source": set_cfg.source, "eval_path": set_cfg.path, "hub_name": set_cfg.hub_name,
        "hub_config": set_cfg.hub_config, "eval_split": set_cfg.split, "prompt_key": set_cfg.prompt_key,
        "answer_key": set_cfg.answer_key, "eval_prompt_key": None, "eval_answer_key": None, "eval_holdout": None})


@dataclass
class EvalSet:
    """One set ready to sample: its rows (``prompt``, ``answer``, the other columns), their prompt ids, and the
    verifier that scores them."""

    name: str
    cfg: Any  # the typed EvalSetConfig node
    verifier_name: str
    rows: list[dict]
    ids: list[list[int]] | None = None

    def verifier_columns(self, samples: int) -> dict[str, list]:
        """The columns handed to the verifier, each repeated for the ``samples`` completions of a problem:
        ``answer`` and the set's ``columns`` (all but the prompt when null)."""
        keys = [k for k in self.rows[0] if k != "prompt"] if self.cfg.columns is None else \
            [*(["answer"] if self.cfg.answer_key else []), *self.cfg.columns]
        return {k: [r.get(k) for r in self.rows for _ in range(samples)] for k in keys}


def load_set(name: str, set_cfg, fmt, verifier_name: str, limit: int | None) -> EvalSet:
    """Rows of set ``name`` (after the format's character filter: its ``rows`` slice, then the first ``limit``), each
    prompt built from its row (``question``) and the gold answer taken out of its column (``gold``)."""
    rows = D.load_split(data_config(set_cfg, fmt), "eval")
    if set_cfg.rows is not None:
        rows = rows[slice(*set_cfg.rows)]
    rows = rows[:limit] if limit else rows
    question = QUESTIONS.get(set_cfg.question)
    for r in rows:
        r["prompt"] = question(r["prompt"], r)
    if set_cfg.answer_key:
        gold = GOLDS.get(set_cfg.gold)
        for r in rows:
            r["answer"] = gold(r["answer"])
    return EvalSet(name, set_cfg, verifier_name, rows)


def tokenize_set(s: EvalSet, fmt, tokenizer) -> None:
    """Prompt ids through the preset's format (``data.max_prompt_tokens`` may drop or truncate rows)."""
    s.rows, s.ids = D.tokenize_rows(s.rows, data_config(s.cfg, fmt), tokenizer)
