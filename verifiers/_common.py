"""Shared helpers for verifiers: completion text, aligned dataset columns, and brace-matched ``\\boxed{}``.

The verifier contract (TRL's reward-function contract) gives completions either as plain strings or, for
conversational datasets, as a list of messages; Open-R1's rewards read ``completion[0]["content"]``
(huggingface/open-r1 ``src/open_r1/rewards.py`` @ c1e1192).
"""
from __future__ import annotations

from typing import Any, Sequence


def completion_text(completion: Any) -> str:
    """Return the text of one completion: a string, or the content of the last message of a chat."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)) and completion and isinstance(completion[-1], dict):
        content = completion[-1].get("content", "")
        return content if isinstance(content, str) else str(content)
    if isinstance(completion, bytes):
        # Invalid UTF-8 must not raise inside a reward: replace bad bytes instead.
        return completion.decode("utf-8", errors="replace")
    if completion is None:
        return ""
    raise TypeError(f"completion must be a str or a list of chat messages, got {type(completion).__name__}")


def texts(completions: Sequence[Any]) -> list[str]:
    if isinstance(completions, (str, bytes)):
        raise TypeError("completions must be a list of completions, not a single string")
    return [completion_text(c) for c in completions]


def column(columns: dict, names: Sequence[str], n: int, verifier: str) -> list:
    """The first present column among ``names``, checked to be aligned with the ``n`` completions."""
    for name in names:
        if name in columns and columns[name] is not None:
            values = columns[name]
            if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
                raise TypeError(f"{verifier}: column {name!r} must be a list aligned with completions")
            if len(values) != n:
                raise ValueError(f"{verifier}: column {name!r} has {len(values)} rows but there are {n} completions")
            return list(values)
    raise ValueError(f"{verifier}: needs one of the columns {', '.join(names)}; got {', '.join(sorted(columns)) or 'none'}")


# How Open-Instruct's verifiers read a response (``open_instruct_text``): "release" (@3dd7a07d, the Tulu 3 RLVR
# recipes) decodes prompt and response together and keeps what follows the last "<|assistant|>\n", stripped, which
# for a response without that string of its own is the response stripped; "grpo" (@c8b66a0e3, the Tulu 3.1 GRPO
# recipe) hands over the decoded response as it is (ground_truth_utils.py there drops the cut and the strip, except
# for IFEval checkers with arguments).
OPEN_INSTRUCT_TEXTS = ("release", "grpo")


def open_instruct_response(text: str, open_instruct_text: str = "release") -> str:
    """The text Open-Instruct's ``verify_*_sample`` works on, from the completion, for ``open_instruct_text``."""
    if open_instruct_text == "release":
        return text.split("<|assistant|>\n")[-1].strip()
    if open_instruct_text == "grpo":
        return text
    raise ValueError(f"open_instruct_text={open_instruct_text!r}; expected one of {OPEN_INSTRUCT_TEXTS}")


def last_boxed_only_string(text: str) -> str | None:
    """The last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces, including the wrapper.

    Same algorithm as Hendrycks MATH ``last_boxed_only_string`` (hendrycks/math ``modeling/math_equivalence``),
    which Open-Instruct and the Qwen-Math evaluator copy; also handles the ``\\boxed 5`` form.
    """
    idx = text.rfind("\\boxed")
    if idx < 0:
        idx = text.rfind("\\fbox")
        if idx < 0:
            return None
    if text.startswith("\\boxed ", idx):
        rest = text[idx + len("\\boxed "):]
        return "\\boxed " + rest.split("$")[0].split()[0] if rest.strip() else None
    depth = 0
    for i in range(idx, len(text)):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[idx : i + 1]
    return None


def remove_boxed(s: str | None) -> str | None:
    """Strip the ``\\boxed{`` / ``\\fbox{`` / ``\\boxed `` wrapper (Hendrycks ``remove_boxed``)."""
    if s is None:
        return None
    for left in ("\\boxed ",):
        if s.startswith(left):
            return s[len(left):]
    for left in ("\\boxed{", "\\fbox{"):
        if s.startswith(left) and s.endswith("}"):
            return s[len(left):-1]
    return None


def last_boxed_content(text: str) -> str | None:
    return remove_boxed(last_boxed_only_string(text))
