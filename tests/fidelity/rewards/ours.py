"""Score the reward corpus with this project's verifiers, as the named recipes configure them:

    .venv/bin/python -m tests.fidelity.rewards.ours CORPUS.jsonl OUT.json

The same rows and the same reward names as tests/fidelity/rewards/source_rewards.py. Each part takes its verifier
from a recipe's composed config (``verifier.name``, ``.kwargs``, ``.text``): ``open_r1`` the terms of
``open_r1_grpo_1_5b`` (``math_open_r1``, ``format``, ``tag_count``: the reward names ``accuracy``, ``format``,
``tag_count``), ``simplerl`` ``simplerl_zoo_7b``'s ``math_simplerl`` given the text ``verifier.text:
prompt_completion_raw`` makes (the prompt in Qwen's chat template, the response and its stop string, as veRL's reward
manager decodes them), ``open_instruct_release`` ``open_instruct_rlvr_8b``'s and ``open_instruct_grpo``
``open_instruct_grpo_8b``'s ``routed`` verifier (each row sent down the gsm8k, math or ifeval route), divided by its
scale of 10 to compare with the sources' verified / not verified; and ``math_tulu3``'s score with sympy's
``is_equiv`` off (``math_no_sympy``, as the Open-Instruct driver does).
"""
from __future__ import annotations

import sys
from unittest import mock

from omegaconf import OmegaConf

from core.config.composition import compose
from tests.fidelity.rewards.source_rewards import QWEN_PROMPT, open_r1_gold, read_rows, write
from verifiers import get_verifier, math_sources

OPEN_R1_NAMES = {"math_open_r1": "accuracy", "format": "format", "tag_count": "tag_count"}


def verifier_of(recipe: str) -> dict:
    return OmegaConf.to_container(compose([f"recipe={recipe}"]).verifier, resolve=True)


def _score(spec: dict, rows: list[dict], completions: list[str], **columns) -> list:
    return get_verifier(spec["name"])(completions, **columns, **(spec.get("kwargs") or {})) if rows else []


def open_r1(rows: list[dict]) -> dict:
    conf = verifier_of("open_r1_grpo_1_5b")
    assert conf["name"] == "weighted" and conf["text"] == "completion", conf
    out: dict = {r["id"]: {} for r in rows}
    for term in conf["kwargs"]["terms"]:
        accuracy = term["name"] == "math_open_r1"
        part = [r for r in rows if r["task"] in ("math", "gsm8k")] if accuracy else rows
        golds = {"solution": [open_r1_gold(r) for r in part]} if accuracy else {}
        scores = _score(term, part, [r["completion"] for r in part], **golds)
        for r, v in zip(part, scores):
            out[r["id"]][OPEN_R1_NAMES[term["name"]]] = v
    return out


def simplerl(rows: list[dict]) -> dict:
    conf = verifier_of("simplerl_zoo_7b")
    assert conf["text"] == "prompt_completion_raw", conf
    math = [r for r in rows if r["task"] in ("math", "gsm8k")]
    texts = [QWEN_PROMPT.format(r["problem"]) + r["completion"] + r["end"] for r in math]
    scores = _score(conf, math, texts, ground_truth=[r["answer"] for r in math])
    return {r["id"]: {"math": v} for r, v in zip(math, scores)}


def open_instruct(rows: list[dict], recipe: str) -> dict:
    conf = verifier_of(recipe)
    assert conf["name"] == "routed" and conf["text"] == "completion", conf
    scale = conf["kwargs"]["scale"]
    out: dict = {r["id"]: {} for r in rows}
    for route, tasks in (("gsm8k", ("math", "gsm8k")), ("math", ("math", "gsm8k")), ("ifeval", ("ifeval",))):
        part = [r for r in rows if r["task"] in tasks]
        golds = [r["ground_truth"] if r["task"] == "ifeval" else r["answer"] for r in part]
        scores = _score(conf, part, [r["completion"] for r in part], ground_truth=golds, dataset=[route] * len(part))
        for r, v in zip(part, scores):
            out[r["id"]][route] = None if v is None else v / scale
    how = conf["kwargs"].get("open_instruct_text", "release")
    with mock.patch.object(math_sources, "is_equiv", lambda x1, x2: False):  # the string rules alone
        for r in rows:
            if r["task"] != "ifeval":
                out[r["id"]]["math_no_sympy"] = math_sources.score_tulu3(r["completion"], r["answer"], how)
    return out


PARTS = {"open_r1": open_r1, "simplerl": simplerl,
         "open_instruct_release": lambda rows: open_instruct(rows, "open_instruct_rlvr_8b"),
         "open_instruct_grpo": lambda rows: open_instruct(rows, "open_instruct_grpo_8b")}


def main(argv: list[str]) -> None:
    corpus, out = argv
    rows = read_rows(corpus)
    write(out, {name: fn(rows) for name, fn in PARTS.items()})


if __name__ == "__main__":
    main(sys.argv[1:])
