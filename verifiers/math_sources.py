"""Source-exact math verifiers: SimpleRL-Zoo (``math_simplerl``) and Open-Instruct Tulu 3 (``math_tulu3``).

* ``math_simplerl`` -- hkust-nlp/simpleRL-reason v1 @ cf1c785 ``verl/utils/reward_score/hf_math_verify.py``
  (``compute_score``, mode "mix"): keep text from the first ``<|im_start|>assistant``; cut at the first ``</s>``,
  ``<|im_end|>``, ``<|endoftext|>``; Qwen-Math ``extract_answer(data_name="math")``; wrap prediction and gold in
  ``\\boxed{}`` unless they contain one; math-verify ``verify(parse(gold), parse(pred))`` with default extraction;
  any exception -> wrong, and a 10 s timeout (their 16-process pool) -> wrong. correct 1.0, wrong 0.0.
* ``math_tulu3`` -- allenai/open-instruct @3dd7a07d ``ground_truth_utils.verify_math_sample`` ("flex" match):
  text after the last ``<|assistant|>\\n``, stripped (``open_instruct_text="grpo"``: the response as it is, as at
  c8b66a0e3); candidates = last boxed, Minerva final-answer form, else the text between the last two ``$``, else the
  whole output (normalised); correct if any candidate ``is_equiv`` or ``hendrycks_is_equiv`` the gold. 1.0 / 0.0
  (multiply by 10 with ``verifiers.compose`` for Open-Instruct's scale).
"""
from __future__ import annotations

import re

from verifiers._common import column, open_instruct_response, texts
from verifiers.mv import mv_parse, mv_verify, numeric_fast_path, parse_gold_cached
from verifiers.pool import map_scores
from verifiers.qwen_math_parser import extract_answer
from verifiers.tulu3_math_utils import INVALID_ANSWER, get_unnormalized_answer, hendrycks_is_equiv, is_equiv
from verifiers.tulu3_math_utils import last_boxed_only_string, normalize_final_answer, remove_boxed

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


def _minerva_candidate(output: str) -> str | None:
    answer = normalize_final_answer(get_unnormalized_answer(output))
    return None if answer == INVALID_ANSWER else answer


def _between_last_dollars(output: str) -> list[str]:
    marks = [m.start() for m in re.finditer(r"\$", output)]
    return [normalize_final_answer(output[marks[-2] + 1:marks[-1]])] if len(marks) > 1 else []


def tulu3_candidates(text: str, open_instruct_text: str = "release") -> list[str]:
    """``verify_math_sample``'s candidate answers, in its order: what the last box holds and Minerva's normalised
    answer sentence; if neither, the normalised text between the last two ``$``; if not that either, the whole text
    normalised. The text is the response as ``open_instruct_text`` reads it (``verifiers._common``)."""
    output = open_instruct_response(text, open_instruct_text)
    boxed = last_boxed_only_string(output)
    found = [a for a in (None if boxed is None else remove_boxed(boxed), _minerva_candidate(output)) if a is not None]
    return found or _between_last_dollars(output) or [normalize_final_answer(output)]


def score_tulu3(text: str, gold: str, open_instruct_text: str = "release") -> float:
    """1.0 when a candidate equals the gold by ``is_equiv`` or ``hendrycks_is_equiv`` (the source tries both)."""
    gold = str(gold)
    candidates = tulu3_candidates(text, open_instruct_text)
    return float(any(hendrycks_is_equiv(a, gold) or is_equiv(a, gold) for a in candidates))


def fast_tulu3(text: str, gold: str, open_instruct_text: str = "release") -> float | None:
    # Identical strings after the Hendrycks normalisation are a match whatever is_equiv says (the source ORs them).
    if any(hendrycks_is_equiv(a, str(gold)) for a in tulu3_candidates(text, open_instruct_text)):
        return 1.0
    return None


def math_simplerl_reward(completions, **columns) -> list[float | None]:
    """SimpleRL-Zoo rule reward (see module docstring). Gold: ``ground_truth``/``answer``/``gt_answer``/``target``."""
    comps = texts(completions)
    golds = column(columns, ("ground_truth", "answer", "gt_answer", "target"), len(comps), "math_simplerl")
    return map_scores(score_simplerl, list(zip(comps, golds)), fast_simplerl,
                      timeout=columns.get("timeout", 10.0), workers=columns.get("workers"), on_timeout=0.0)


def math_tulu3_reward(completions, open_instruct_text: str = "release", **columns) -> list[float | None]:
    """Open-Instruct Tulu 3 flex math match (see module docstring). Gold: ``ground_truth`` or ``answer``.
    ``open_instruct_text``: "release" (@3dd7a07d) or "grpo" (@c8b66a0e3), how the source reads the response."""
    comps = texts(completions)
    open_instruct_response("", open_instruct_text)  # an unknown value is refused before any sample is scored
    golds = column(columns, ("ground_truth", "answer"), len(comps), "math_tulu3")
    items = [(c, g, open_instruct_text) for c, g in zip(comps, golds)]
    return map_scores(score_tulu3, items, fast_tulu3,
                      timeout=columns.get("timeout", 10.0), workers=columns.get("workers"), on_timeout=0.0)
