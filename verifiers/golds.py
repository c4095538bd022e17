"""Gold answers of evaluation sets (``sets.<name>.gold``, :data:`verifiers.GOLDS`): some sets keep the answer inside a
longer column, and the sources take it out before grading; SimpleRL-Zoo's evaluator does it in ``parse_ground_truth``
(hkust-nlp/simpleRL-reason @ cf1c785 ``examples/simplelr_math_eval/parser.py``). They live beside the verifiers
because they parse answers as the verifiers do (verifiers/gsm8k.py, verifiers/qwen_math_parser.py).
"""
from __future__ import annotations

from verifiers.gsm8k import gsm8k_label as _label
from verifiers.qwen_math_parser import extract_answer


def as_is(value):
    """The column's value as it is (MATH500 ``answer``, AIME ``answer``)."""
    return value


def gsm8k_label(value) -> str:
    """The label after the last ``####`` of a GSM8K solution, thousands separators dropped (SimpleRL-Zoo:
    ``example["answer"].split("####")``; every GSM8K loader)."""
    return _label(value)


def minerva_boxed(value) -> str:
    """Minerva Math keeps its answer in the solution: Qwen-Math ``extract_answer(solution, "minerva_math")``
    (SimpleRL-Zoo ``parse_ground_truth`` for ``minerva_math``)."""
    return extract_answer(str(value), data_name="minerva_math")


def strip_dollars(value) -> str:
    """OlympiadBench ``final_answer[0].strip("$")`` (SimpleRL-Zoo ``parse_ground_truth``); with
    ``answer_key: final_answer.0``."""
    return str(value).strip("$")
