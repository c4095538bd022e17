"""Score the reward corpus with a source's own reward code, in that source's env (tests/fidelity/rewards/envs.sh):

    $FIDELITY_ENVS/rewards-open-r1/bin/python tests/fidelity/rewards/source_rewards.py open_r1 CORPUS.jsonl OUT.json

Sources: ``open_r1`` (huggingface/open-r1 ``src/open_r1/rewards.py`` @1416fa0: ``accuracy_reward``, ``format_reward``,
``tag_count_reward`` on math-verify 0.5.2), ``simplerl`` (hkust-nlp/simpleRL-reason v1 @cf1c785
``verl/utils/reward_score/hf_math_verify.py`` ``compute_score``, mode "mix", on math-verify 0.6.0),
``open_instruct_3dd7a07d`` and ``open_instruct_c8b66a0e3`` (allenai/open-instruct
``open_instruct/ground_truth_utils.py`` ``verify_gsm8k_sample``, ``verify_math_sample``, ``verify_ifeval_sample``).
The code is the env's ``src/`` (taken at the commit by envs.sh), imported unchanged; this file imports nothing of the
project. Each source gets the text its framework hands it: Open-R1 the completion (TRL decodes it without special
tokens); SimpleRL-Zoo the prompt in its chat template and the response with its stop string (veRL decodes both with
special tokens); Open-Instruct's release the Tulu prompt and the response (``apply_verifiable_reward`` decodes query
and response with ``skip_special_tokens``), its GRPO commit the response alone. Open-Instruct's math is also scored
with its sympy ``is_equiv`` off (``math_no_sympy``), which tells a difference of its string rules from one of the
LaTeX parser. Out: ``{row id: {reward name: value}}``, a value being the reward, null, or ``"raise:<exception type>"``
where the source's function raised (the trainer would have stopped).
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import sys
import types
from pathlib import Path

SRC = Path(sys.prefix) / "src"
QWEN_PROMPT = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{}\nPlease reason step "
               "by step, and put your final answer within \\boxed{{}}.<|im_end|>\n<|im_start|>assistant\n")
TULU_PROMPT = "<|user|>\n{}\n<|assistant|>\n"


def open_r1_gold(row: dict) -> str:
    """Open-R1's ``solution`` column: a worked solution where the set has one with a box, else the answer."""
    return row["solution"] if row["set"] in ("math500", "minerva_math") else row["answer"]


def _outcome(fn, *args, truth: bool = False):
    """``fn(*args)`` as a float (``truth``: its truth value, as Open-Instruct's ``if verified:`` reads it)."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the sources print per sample
            value = fn(*args)
    except Exception as e:  # noqa: BLE001 - recorded: the source's trainer would have stopped here
        return f"raise:{type(e).__name__}"
    return float(bool(value)) if truth else value if value is None else float(value)


def open_r1(rows: list[dict]) -> dict:
    """rewards.py imports Open-R1's code-execution clients (E2B, Morph, Piston: ``utils/code_providers.py``,
    ``utils/competitive_programming``) and, through ``utils/__init__.py``, trl and transformers; the math and format
    rewards call none of them, so those two modules are stand-ins whose every name raises if called."""
    sys.path.insert(0, str(SRC / "src"))

    def absent(name):
        def call(*_, **__):
            raise RuntimeError(f"{name} is not installed in the reward env")
        return call

    for name in ("open_r1.utils", "open_r1.utils.code_providers", "open_r1.utils.competitive_programming"):
        stub = types.ModuleType(name)
        stub.__path__ = []
        stub.__getattr__ = absent
        sys.modules[name] = stub
    rewards = importlib.import_module("open_r1.rewards")
    out = {}
    for row in rows:
        conv = [[{"role": "assistant", "content": row["completion"]}]]
        got = {"format": _outcome(lambda: rewards.format_reward(conv)[0]),
               "tag_count": _outcome(lambda: rewards.tag_count_reward(conv)[0])}
        if row["task"] in ("math", "gsm8k"):
            got["accuracy"] = _outcome(lambda: rewards.accuracy_reward(conv, [open_r1_gold(row)])[0])
        out[row["id"]] = got
    return out


def simplerl(rows: list[dict]) -> dict:
    """``verl/utils/reward_score`` loaded as a package of its own (``verl/__init__.py`` imports the trainer's
    torch, ray and tensordict stack, which the reward does not use)."""
    pkg = SRC / "verl" / "utils" / "reward_score"
    spec = importlib.util.spec_from_file_location("reward_score", pkg / "__init__.py",
                                                  submodule_search_locations=[str(pkg)])
    sys.modules["reward_score"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules["reward_score"])
    with contextlib.redirect_stdout(io.StringIO()):
        hf = importlib.import_module("reward_score.hf_math_verify")
    out = {}
    for row in rows:
        if row["task"] in ("math", "gsm8k"):
            text = QWEN_PROMPT.format(row["problem"]) + row["completion"] + row["end"]
            out[row["id"]] = {"math": _outcome(lambda: hf.compute_score(text, row["answer"])["score"])}
    return out


def open_instruct(rows: list[dict], release: bool) -> dict:
    sys.path.insert(0, str(SRC))
    from langdetect import DetectorFactory

    DetectorFactory.seed = 0  # langdetect draws at random unless seeded; both sides are seeded (docs/fidelity.md)
    gtu = importlib.import_module("open_instruct.ground_truth_utils")
    out = {}
    for row in rows:
        text = (TULU_PROMPT.format(row["problem"]) if release else "") + row["completion"]
        if row["task"] == "ifeval":
            out[row["id"]] = {"ifeval": _outcome(gtu.verify_ifeval_sample, text, row["ground_truth"], truth=True)}
        else:
            out[row["id"]] = {"gsm8k": _outcome(gtu.verify_gsm8k_sample, text, row["answer"], truth=True),
                              "math": _outcome(gtu.verify_math_sample, text, row["answer"], truth=True)}
    sympy_equiv, gtu.is_equiv = gtu.is_equiv, lambda x1, x2: False
    for row in rows:  # "math_no_sympy": the string rules alone (candidates, Hendrycks), sympy's is_equiv off
        if row["task"] != "ifeval":
            text = (TULU_PROMPT.format(row["problem"]) if release else "") + row["completion"]
            out[row["id"]]["math_no_sympy"] = _outcome(gtu.verify_math_sample, text, row["answer"], truth=True)
    gtu.is_equiv = sympy_equiv
    return out


SOURCES = {"open_r1": open_r1, "simplerl": simplerl,
           "open_instruct_3dd7a07d": lambda rows: open_instruct(rows, release=True),
           "open_instruct_c8b66a0e3": lambda rows: open_instruct(rows, release=False)}


def read_rows(corpus) -> list[dict]:
    return [json.loads(line) for line in Path(corpus).read_text().splitlines() if line.strip()]


def write(out, scores: dict) -> None:
    Path(out).write_text(json.dumps(scores, sort_keys=True))


def main(argv: list[str]) -> None:
    source, corpus, out = argv
    write(out, SOURCES[source](read_rows(corpus)))


if __name__ == "__main__":
    main(sys.argv[1:])
