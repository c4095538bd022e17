"""Open-R1 format and shaping rewards."""
from __future__ import annotations

import math

import pytest

from verifiers import get_verifier

GOOD = "<think>\nreason\n</think>\n<answer>\n42\n</answer>"


def test_format_and_tag_count():
    assert get_verifier("format")([GOOD, "<think>reason</think><answer>42</answer>"]) == [1.0, 0.0]
    assert get_verifier("tag_count")([GOOD, "<think>\nx", ""]) == [1.0, 0.25, 0.0]


def test_reasoning_steps_no_multiline():
    assert get_verifier("reasoning_steps")(["Step 1: a Step 2: b Step 3: c", "x\n1. a\n2. b", "1. a"]) == [1.0, 0.0, 1 / 3]


def test_cosine_lengths_and_correctness():
    f = get_verifier("cosine")
    short_ok, short_bad = r"\boxed{2}", r"\boxed{3}"
    out = f([short_ok, short_bad, "x" * 1000 + r"\boxed{2}"], solution=["$2$"] * 3)
    c = math.cos(len(short_ok) / 1000 * math.pi)
    assert out[0] == pytest.approx(0.5 + 0.25 * (1 + c))
    assert out[1] == pytest.approx(-0.5 + 0.25 * (1 + c))
    assert out[2] == pytest.approx(0.5, abs=1e-3)


def test_repetition_and_overlong():
    assert get_verifier("repetition_penalty")(["a b c a b c a b c", "one two", "a b c d"]) == [
        pytest.approx(-(1 - 3 / 7)), 0.0, 0.0]
    f = get_verifier("soft_overlong_punishment")
    assert f(["x"] * 3, completion_lengths=[100, 14336, 16384 + 1], max_completion_len=16384) == [0.0, -0.125 * 0 + (16384 - 4096 - 14336) / 4096, -1.0]
    with pytest.raises(ValueError):
        get_verifier("repetition_penalty")(["a"], max_penalty=1.0)


def _answer(body: str) -> str:
    return f"<think>\nplan\n</think>\n<answer>\n{body}\n</answer>"


def test_code_format_is_open_r1s_pattern():
    """The pattern string of open-r1 src/open_r1/rewards.py@c1e1192 get_code_format_reward, for cpp."""
    from verifiers.format import code_format_pattern

    assert code_format_pattern("cpp") == "^<think>\\n.*?\\n</think>\\n<answer>\\n.*?```cpp.*?```.*?\\n</answer>$"


def test_code_format_language_from_the_row_else_code_language():
    f = get_verifier("code_format")
    py, cpp = _answer("Here:\n```python\nprint(1)\n```"), _answer("```cpp\nint main(){}\n```")
    assert f([py, cpp]) == [1.0, 0.0]  # default code_language python
    assert f([py, cpp], code_language="cpp") == [0.0, 1.0]
    assert f([py, cpp], language=["cpp", "cpp"], code_language="python") == [0.0, 1.0]  # the column wins
    assert f([py, py], language=["python", "cpp"]) == [1.0, 0.0]


def test_code_format_needs_the_layout_and_the_block_in_the_answer():
    f = get_verifier("code_format")
    outside = "<think>\n```python\nx\n```\n</think>\n<answer>\n42\n</answer>"
    no_newlines = "<think>plan</think><answer>```python\nx\n```</answer>"
    assert f([outside, no_newlines, _answer("no code"), GOOD]) == [0.0] * 4
    # Open-R1's quirks, kept: MULTILINE lets text follow "</answer>" on later lines, and the language is a prefix match
    assert f([_answer("```python\nx\n```") + "\nmore", _answer("```pythonic\nx\n```")]) == [1.0, 1.0]
