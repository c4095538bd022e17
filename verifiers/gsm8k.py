"""GSM8K verifiers (Cobbe et al. 2021, arXiv:2110.14168).

* ``gsm8k`` -- Open-Instruct Tulu 3 release, allenai/open-instruct @3dd7a07d ``ground_truth_utils.verify_gsm8k_sample``:
  text after the last ``<|assistant|>\\n``, stripped (``open_instruct_text="grpo"``: the response as it is, as at
  c8b66a0e3); drop thousands separators (digit,digit); last match of
  ``[-+]?\\d*\\.\\d+|\\d+`` (note: integers carry no sign in that regex, so "-5" is read as "5"); case-insensitive
  string equality with the label, so "18.0" != "18". No number -> the whole text is compared.
* ``gsm8k_numeric`` -- tolerant: last signed number (thousands separators removed, "$"/"%" ignored), compared as a
  number with relative tolerance 1e-6, so "18.0" == "18" and "-5" == "-5".

Gold: ``answer`` / ``ground_truth`` / ``solution``. A full GSM8K solution ("... #### 1,234") is reduced to the label
after the last ``####`` with commas removed, as the Tulu 3 data (and every GSM8K loader) stores it.
"""
from __future__ import annotations

import math
import re

from verifiers._common import column, open_instruct_response, texts

_OI_NUMBER = re.compile(r"[-+]?\d*\.\d+|\d+")
_SIGNED_NUMBER = re.compile(r"-?\d*\.\d+|-?\d+")
GOLD_COLUMNS = ("answer", "ground_truth", "solution")


def gsm8k_label(gold) -> str:
    gold = str(gold)
    if "####" in gold:
        return gold.split("####")[-1].strip().replace(",", "")
    return gold.strip()


def open_instruct_prediction(model_output: str, open_instruct_text: str = "release") -> str:
    """The last number once ``d,d`` separators are dropped, else the whole response (read as
    ``open_instruct_text`` says: ``verifiers._common.open_instruct_response``)."""
    response = re.sub(r"(\d),(\d)", r"\1\2", open_instruct_response(model_output, open_instruct_text))
    numbers = _OI_NUMBER.findall(response)
    return numbers[-1] if numbers else response


def score_open_instruct(text: str, gold, open_instruct_text: str = "release") -> float:
    return float(str(open_instruct_prediction(text, open_instruct_text)).lower() == gsm8k_label(gold).lower())


def _last_number(text: str) -> float | None:
    response = re.sub(r"(\d),(?=\d{3}\b)", r"\1", text)
    for match in reversed(_SIGNED_NUMBER.findall(response)):
        try:
            value = float(match)
        except (ValueError, OverflowError):
            continue
        if math.isfinite(value):
            return value
    return None


def score_numeric(text: str, gold, rel_tol: float = 1e-6) -> float | None:
    """None when the label is not a number (skip); 0.0 when the completion has no number."""
    label = _last_number(gsm8k_label(gold).replace("$", ""))
    if label is None:
        return None
    pred = _last_number(text)
    return float(pred is not None and math.isclose(pred, label, rel_tol=rel_tol, abs_tol=1e-9))


def gsm8k_reward(completions, open_instruct_text: str = "release", **columns) -> list[float | None]:
    """Open-Instruct Tulu 3 GSM8K match (1.0 / 0.0); ``open_instruct_text``: "release" (@3dd7a07d) or "grpo"
    (@c8b66a0e3), how the source reads the response."""
    comps = texts(completions)
    open_instruct_response("", open_instruct_text)  # an unknown value is refused before any sample is scored
    golds = column(columns, GOLD_COLUMNS, len(comps), "gsm8k")
    return [score_open_instruct(c, g, open_instruct_text) for c, g in zip(comps, golds)]


def gsm8k_numeric_reward(completions, **columns) -> list[float | None]:
    """Numerically tolerant GSM8K match (1.0 / 0.0; None if the label is not a number)."""
    comps = texts(completions)
    golds = column(columns, GOLD_COLUMNS, len(comps), "gsm8k_numeric")
    return [score_numeric(c, g) for c, g in zip(comps, golds)]
