"""Qwen2.5-Math answer extraction and normalisation, as vendored by SimpleRL-Zoo.

Source: hkust-nlp/simpleRL-reason (branch v1 @ cf1c785) ``verl/utils/reward_score/qwen_math_eval_toolkit/parser.py``,
itself from QwenLM/Qwen2.5-Math ``evaluation/parser.py`` (MIT, (c) 2024 Zhibin Gou). Behaviour is kept verbatim,
including quirks (``"and"`` removed anywhere, single-letter unit words stripped, word numbers converted by the
``word2number`` package). ``word2number`` is optional: without it that one step is skipped, with a warning.
"""
from __future__ import annotations

import logging
import re

log = logging.getLogger(__name__)
try:  # pure-python dependency of the original toolkit
    from word2number import w2n
except ImportError:  # pragma: no cover - depends on the environment
    w2n = None
    log.warning("word2number is not installed: SimpleRL/Qwen-Math strip_string skips word-number conversion")


def _fix_fracs(string: str) -> str:
    substrs = string.split("\\frac")
    new_str = substrs[0]
    for substr in substrs[1:]:
        new_str += "\\frac"
        if len(substr) > 0 and substr[0] == "{":
            new_str += substr
            continue
        if len(substr) < 2:
            return string
        a, b = substr[0], substr[1]
        if b != "{":
            new_str += "{" + a + "}{" + b + "}" + substr[2:]
        else:
            new_str += "{" + a + "}" + b + substr[2:]
    return new_str


def _fix_a_slash_b(string: str) -> str:
    if len(string.split("/")) != 2:
        return string
    a, b = string.split("/")
    try:
        if "sqrt" not in a:
            a = int(a)
        if "sqrt" not in b:
            b = int(b)
        assert string == "{}/{}".format(a, b)
        return "\\frac{" + str(a) + "}{" + str(b) + "}"
    except (ValueError, AssertionError):
        return string


def _fix_sqrt(string: str) -> str:
    return re.sub(r"\\sqrt(\w+)", r"\\sqrt{\1}", string)


def convert_word_number(text: str) -> str:
    if w2n is None:
        return text
    try:
        text = str(w2n.word_to_num(text))
    except Exception:  # noqa: BLE001 - the original swallows everything
        pass
    return text


# units mainly from MathQA (verbatim list, duplicates included)
unit_texts = [
    "east", "degree", "mph", "kmph", "ft", "m sqaure", " m east", "sq m", "deg", "mile", "q .", "monkey", "prime",
    "ratio", "profit of rs", "rd", "o", "gm", "p . m", "lb", "tile", "per", "dm", "lt", "gain", "ab", "way", "west",
    "a .", "b .", "c .", "d .", "e .", "f .", "g .", "h .", "t", "a", "h", "no change", "men", "soldier", "pie", "bc",
    "excess", "st", "inches", "noon", "percent", "by", "gal", "kmh", "c", "acre", "rise", "a . m", "th", "π r 2", "sq",
    "mark", "l", "toy", "coin", "sq . m", "gallon", "° f", "profit", "minw", "yr", "women", "feet", "am", "pm", "hr",
    "cu cm", "square", "v â € ™", "are", "rupee", "rounds", "cubic", "cc", "mtr", "s", "ohm", "number", "kmph", "day",
    "hour", "minute", "min", "second", "man", "woman", "sec", "cube", "mt", "sq inch", "mp", "∏ cm ³", "hectare",
    "more", "sec", "unit", "cu . m", "cm 2", "rs .", "rs", "kg", "g", "month", "km", "m", "cm", "mm", "apple", "liter",
    "loss", "yard", "pure", "year", "increase", "decrease", "d", "less", "Surface", "litre", "pi sq m", "s .", "metre",
    "meter", "inch",
]
unit_texts.extend([t + "s" for t in unit_texts])
_UNIT_RES = [re.compile(r"(^|\W)" + u + r"($|\W)") for u in unit_texts]


def _strip_units_and_text(string: str, skip_unit: bool) -> str:
    _string = re.sub(r"\\text{.*?}$", "", string).strip()
    if _string != "" and _string != string:
        string = _string
    if not skip_unit:
        for _ in range(2):
            for unit_re in _UNIT_RES:
                _string = unit_re.sub(r"\1\2", string)
                if _string != "":
                    string = _string
    string = string.replace("^{\\circ}", "").replace("^\\circ", "")
    string = string.replace("\\$", "").replace("$", "")
    string = string.replace("\\(", "").replace("\\)", "")
    string = convert_word_number(string)
    string = re.sub(r"\\text\{(.*?)\}", r"\1", string)
    for key in ["x=", "y=", "z=", "x\\in", "y\\in", "z\\in", "x\\to", "y\\to", "z\\to"]:
        string = string.replace(key, "")
    string = string.replace("\\emptyset", r"{}")
    string = string.replace("(-\\infty,\\infty)", "\\mathbb{R}")
    string = string.replace("\\%", "").replace("\\%", "").replace("%", "")
    return string.replace(" .", " 0.").replace("{.", "{0.")


def strip_string(string, skip_unit: bool = False) -> str:
    """Qwen2.5-Math ``strip_string`` (verbatim order of operations)."""
    string = str(string).strip().replace("\n", "").rstrip(".")
    string = string.replace("\\!", "")
    string = re.sub(r"\\begin\{array\}\{.*?\}", r"\\begin{pmatrix}", string)
    string = re.sub(r"\\end\{array\}", r"\\end{pmatrix}", string)
    string = string.replace("bmatrix", "pmatrix")
    string = string.replace("tfrac", "frac").replace("dfrac", "frac")
    string = string.replace("\\neq", "\\ne").replace("\\leq", "\\le").replace("\\geq", "\\ge")
    string = string.replace("\\left", "").replace("\\right", "").replace("\\{", "{").replace("\\}", "}")
    string = _strip_units_and_text(string, skip_unit)
    if (string.startswith("{") and string.endswith("}") and string.isalnum()
            or string.startswith("(") and string.endswith(")") and string.isalnum()
            or string.startswith("[") and string.endswith("]") and string.isalnum()):
        string = string[1:-1]
    string = string.replace("infinity", "\\infty")
    if "\\infty" not in string:
        string = string.replace("inf", "\\infty")
    string = string.replace("+\\inity", "\\infty")
    string = string.replace("and", "").replace("\\mathbf", "")
    string = re.sub(r"\\mbox{.*?}", "", string)
    if "j" in string and "i" not in string:
        string = string.replace("j", "i")
    string = re.sub(r"(\d+)\.0*([^\d])", r"\1\2", string)
    string = re.sub(r"(\d+)\.0*$", r"\1", string)
    if len(string) == 0:
        return string
    if string[0] == ".":
        string = "0" + string
    if len(string.split("=")) == 2 and len(string.split("=")[0]) <= 2:
        string = string.split("=")[1]
    string = _fix_sqrt(string).replace(" ", "")
    return _fix_a_slash_b(_fix_fracs(string))


def _last_boxed_qwen(pred_str: str) -> str:
    ans = pred_str.split("boxed")[-1]
    if len(ans) == 0:
        return ""
    if ans[0] != "{":
        return ans.split("$")[0].strip()
    stack, a = 1, ""
    for c in ans[1:]:
        if c == "{":
            stack += 1
        elif c == "}":
            stack -= 1
            if stack == 0:
                break
        a += c
    return a


def extract_answer(pred_str: str, data_name: str = "math", use_last_number: bool = True) -> str:
    """Qwen2.5-Math ``extract_answer``: Minerva form, last boxed, "he answer is", "final answer is", last number."""
    pred_str = pred_str.replace("\u043a\u0438", "")
    if "final answer is $" in pred_str and "$. I hope" in pred_str:
        pred = pred_str.split("final answer is $", 1)[1].split("$. I hope", 1)[0].strip()
    elif "boxed" in pred_str:
        pred = _last_boxed_qwen(pred_str)
    elif "he answer is" in pred_str:
        pred = pred_str.split("he answer is")[-1].strip()
    elif "final answer is" in pred_str:
        pred = pred_str.split("final answer is")[-1].strip()
    elif "答案是" in pred_str:
        pred = pred_str.split("答案是")[1].strip().split("\n\n")[0].strip()
    elif use_last_number:
        found = re.findall(r"-?\d*\.?\d+", pred_str.replace(",", ""))
        pred = found[-1] if found else ""
    else:
        pred = ""
    pred = re.sub(r"\n\s*", "", pred)
    if pred != "" and pred[0] == ":":
        pred = pred[1:]
    if pred != "" and pred[-1] == ".":
        pred = pred[:-1]
    if pred != "" and pred[-1] == "/":
        pred = pred[:-1]
    return strip_string(pred, skip_unit=data_name in ["carp_en", "minerva_math"])
