"""Source-exact math verifiers: SimpleRL-Zoo (``math_simplerl``) and Open-Instruct Tulu 3 (``math_tulu3``).

* ``math_simplerl`` -- hkust-nlp/simpleRL-reason v1 @ cf1c785 ``verl/utils/reward_score/hf_math_verify.py``
  (``compute_score``, mode "mix"): keep text from the first ``<|im_start|>assistant``; cut at the first ``</s>``,
  ``<|im_end|>``, ``<|endoftext|>``; Qwen-Math ``extract_answer(data_name="math")``; wrap prediction and gold in
  ``\\boxed{}`` unless they contain one; math-verify ``verify(parse(gold), parse(pred))`` with default extraction;
  any exception -> wrong, and a 10 s timeout (their 16-process pool) -> wrong. correct 1.0, wrong 0.0.
* ``math_tulu3`` -- allenai/open-instruct @3dd7a07d ``ground_truth_utils.verify_math_sample`` ("flex" match):
  text after the last ``<|assistant|>\\n``; candidates = last boxed, Minerva final-answer form, else the text
  between the last two ``$``, else the whole output (normalised); correct if any candidate ``is_equiv`` or
  ``hendrycks_is_equiv`` the gold. 1.0 / 0.0 (multiply by 10 with ``verifiers.compose`` for Open-Instruct's scale).
"""
from __future__ import annotations

import re

from verifiers._common import column, texts
from verifiers.mv import mv_parse, mv_verify, numeric_fast_path, parse_gold_cached
from verifiers.pool import map_scores
from verifiers.qwen_math_parser import extract_answer
from verifiers.tulu3_math_utils import get_unnormalized_answer, hendrycks_is_equiv, is_equiv, normalize_final_answer
from verifiers.tulu3_math_utils import last_boxed_only_string as oi_last_boxed_only_string
from verifiers.tulu3_math_utils import remove_boxed as oi_remove_boxed

SIMPLERL_STOP_WORDS = ["</s>", "<|im_end|>", "<|endoftext|>"]


def simplerl_extract(solution_str: str) -> str:
    """``extract_solution``: assistant turn, stop strings, Qwen-Math extraction (``data_name="math"``)."""
    model_output = re.sub(r"^.*?<\|im_start\|>assistant", "<|im_start|>assistant", solution_str,
                          flags=re.DOTALL, count=1)
    for stop_word in SIMPLERL_STOP_WORDS:
        if stop_word in model_output:
            model_output = model_output.split(stop_word)[0].strip()
    return extract_answer(model_output, data_name="math")


def _boxed(s: str) -> str:
    return s if "\\boxed" in s else "\\boxed{" + s + "}"


def fast_simplerl(text: str, gold: str) -> float | None:
    pred = simplerl_extract(text)
    return numeric_fast_path(pred, str(gold))


def score_simplerl(text: str, gold: str) -> float:
    pred = simplerl_extract(text)
    fast = numeric_fast_path(pred, str(gold))
    if fast is not None:
        return fast
    try:  # hf_verify_with_try: any exception counts as wrong
        gold_parsed = parse_gold_cached(_boxed(str(gold)), extraction_mode="any_match")
        return 1.0 if mv_verify(list(gold_parsed), mv_parse(_boxed(pred), extraction_mode="any_match")) else 0.0
    except Exception:  # noqa: BLE001
        return 0.0


def tulu3_candidates(model_output: str) -> list[str]:
    model_output = model_output.split("<|assistant|>\n")[-1].strip()
    raw_answer = model_output
    all_answers = []
    boxed = oi_last_boxed_only_string(raw_answer)
    boxed = oi_remove_boxed(boxed) if boxed is not None else None
    if boxed is not None:
        all_answers.append(boxed)
    minerva_answer = normalize_final_answer(get_unnormalized_answer(raw_answer))
    if minerva_answer is not None and minerva_answer != "[invalidanswer]":
        all_answers.append(minerva_answer)
    if len(all_answers) == 0:
        dollars = [m.start() for m in re.finditer("\\$", raw_answer)]
        if len(dollars) > 1:
            all_answers.append(normalize_final_answer(raw_answer[dollars[-2] + 1: dollars[-1]]))
    if len(all_answers) == 0:
        all_answers.append(normalize_final_answer(model_output))
    return all_answers


def score_tulu3(text: str, gold: str) -> float:
    gold = str(gold)
    for answer in tulu3_candidates(text):
        if hendrycks_is_equiv(answer, gold) or is_equiv(answer, gold):
            return 1.0
    return 0.0


def fast_tulu3(text: str, gold: str) -> float | None:
    # Identical strings after the Hendrycks normalisation are a match whatever is_equiv says (the release ORs them).
    for answer in tulu3_candidates(text):
        if hendrycks_is_equiv(answer, str(gold)):
            return 1.0
    return None


def math_simplerl_reward(completions, **columns) -> list[float | None]:
    """SimpleRL-Zoo rule reward (see module docstring). Gold: ``ground_truth``/``answer``/``gt_answer``/``target``."""
    comps = texts(completions)
    golds = column(columns, ("ground_truth", "answer", "gt_answer", "target"), len(comps), "math_simplerl")
    return map_scores(score_simplerl, list(zip(comps, golds)), fast_simplerl,
                      timeout=columns.get("timeout", 10.0), workers=columns.get("workers"), on_timeout=0.0)


def math_tulu3_reward(completions, **columns) -> list[float | None]:
    """Open-Instruct Tulu 3 flex math match (see module docstring). Gold: ``ground_truth`` or ``answer``."""
    comps = texts(completions)
    golds = column(columns, ("ground_truth", "answer"), len(comps), "math_tulu3")
    return map_scores(score_tulu3, list(zip(comps, golds)), fast_tulu3,
                      timeout=columns.get("timeout", 10.0), workers=columns.get("workers"), on_timeout=0.0)
