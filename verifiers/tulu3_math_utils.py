"""Open-Instruct (Tulu 3 release) MATH helpers: Minerva answer form, normalisation, sympy and Hendrycks equivalence.

Source: allenai/open-instruct @3dd7a07d ``open_instruct/math_utils.py`` (itself from EleutherAI lm-eval-harness
``minerva_math`` and hendrycks/math), used by ``ground_truth_utils.verify_math_sample``.

``is_equiv`` calls sympy ``parse_latex``. The release ran its ANTLR backend, which needs antlr4-python3-runtime 4.11,
but hydra-core/omegaconf pin 4.9.*; so we use the ANTLR backend when it works, else sympy's ``lark`` backend (needs
the ``lark`` package), else ``is_equiv`` is off (always False, as the release's ``except Exception`` would give) and
a warning says so. ``SYMPY_LATEX_BACKEND`` tells which applies.
"""
from __future__ import annotations

import logging
import re
import signal
import threading

import sympy

log = logging.getLogger(__name__)


def _pick_backend() -> str | None:
    from sympy.parsing.latex import parse_latex

    for backend in ("antlr", "lark"):
        try:
            if parse_latex(r"\frac{1}{2}", backend=backend) == sympy.Rational(1, 2):
                return backend
        except Exception:  # noqa: BLE001 - ImportError / version mismatch
            continue
    log.warning("sympy parse_latex has no working backend (antlr4 4.11 or lark): Tulu 3 is_equiv is disabled")
    return None


SYMPY_LATEX_BACKEND = _pick_backend()


def get_unnormalized_answer(text: str) -> str:
    INVALID_ANSWER = "[invalidanswer]"
    end_seq = "I hope it is correct."
    text += end_seq
    match = re.search(r"Final Answer: The final answer is(.*?). I hope it is correct.", text)
    if match:
        return match.group(1).strip()
    return INVALID_ANSWER


SUBSTITUTIONS = [
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), (r"\ ", ""), (" ", ""), ("mbox", "text"),
    (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
]
REMOVED_EXPRESSIONS = [
    "square", "ways", "integers", "dollars", "mph", "inches", "ft", "hours", "km", "units", "\\ldots", "sue",
    "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals", "edges",
    "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2",
    "\\text{}^3", "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;", r",\!", "{,}", '"',
    "\\dots",
]


def normalize_final_answer(final_answer: str) -> str:
    """Minerva normalisation (Lewkowycz et al. 2022, appendix D.1)."""
    final_answer = final_answer.split("=")[-1]
    for before, after in SUBSTITUTIONS:
        final_answer = final_answer.replace(before, after)
    for expr in REMOVED_EXPRESSIONS:
        final_answer = final_answer.replace(expr, "")
    final_answer = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", final_answer)
    final_answer = re.sub(r"(\\text\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\textbf\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\overline\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", final_answer)
    final_answer = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", final_answer)
    final_answer = final_answer.replace("$", "")
    if final_answer.replace(",", "").isdigit():
        final_answer = final_answer.replace(",", "")
    return final_answer


class _Timeout:
    """The release's 5 s SIGALRM guard (main thread only; the worker pool adds a hard wall clock)."""

    def __init__(self, seconds: int = 5):
        self.seconds = seconds
        self.armed = threading.current_thread() is threading.main_thread()

    def _raise(self, signum, frame):
        raise TimeoutError("Timeout")

    def __enter__(self):
        if self.armed:
            self.old = signal.signal(signal.SIGALRM, self._raise)
            signal.alarm(self.seconds)

    def __exit__(self, *exc):
        if self.armed:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, self.old)


def is_equiv(x1: str, x2: str) -> bool:
    """sympy ``parse_latex`` both, then ``simplify(x1 - x2) == 0``; any error or timeout is False."""
    if SYMPY_LATEX_BACKEND is None:
        return False
    from sympy.parsing.latex import parse_latex

    try:
        with _Timeout(seconds=5):
            diff = parse_latex(x1, backend=SYMPY_LATEX_BACKEND) - parse_latex(x2, backend=SYMPY_LATEX_BACKEND)
            return bool(sympy.simplify(diff) == 0)
    except Exception:  # noqa: BLE001 - the release returns False on any parse/sympy error and on timeout
        return False


def _fix_fracs(string: str) -> str:
    substrs = string.split("\\frac")
    new_str = substrs[0]
    for substr in substrs[1:]:
        new_str += "\\frac"
        if substr and substr[0] == "{":
            new_str += substr
            continue
        if len(substr) < 2:
            return string
        a, b = substr[0], substr[1]
        new_str += ("{" + a + "}{" + b + "}" if b != "{" else "{" + a + "}" + b) + substr[2:]
    return new_str


def _fix_a_slash_b(string: str) -> str:
    if len(string.split("/")) != 2:
        return string
    a, b = string.split("/")
    try:
        a, b = int(a), int(b)
        assert string == f"{a}/{b}"
        return "\\frac{" + str(a) + "}{" + str(b) + "}"
    except (AssertionError, ValueError):
        return string


def _remove_right_units(string: str) -> str:
    if "\\text{ " in string:
        splits = string.split("\\text{ ")
        assert len(splits) == 2
        return splits[0]
    return string


def _fix_sqrt(string: str) -> str:
    if "\\sqrt" not in string:
        return string
    splits = string.split("\\sqrt")
    new_string = splits[0]
    for split in splits[1:]:
        new_string += ("\\sqrt{" + split[0] + "}" + split[1:]) if split[0] != "{" else "\\sqrt" + split
    return new_string


def hendrycks_strip_string(string: str) -> str:
    """Hendrycks MATH ``_strip_string`` (hendrycks/math ``modeling/math_equivalence.py``)."""
    for a, b in (("\n", ""), ("\\!", ""), ("\\\\", "\\"), ("tfrac", "frac"), ("dfrac", "frac"), ("\\left", ""),
                 ("\\right", ""), ("^{\\circ}", ""), ("^\\circ", ""), ("\\$", "")):
        string = string.replace(a, b)
    string = _remove_right_units(string)
    string = string.replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.")
    if len(string) == 0:
        return string
    if string[0] == ".":
        string = "0" + string
    if len(string.split("=")) == 2 and len(string.split("=")[0]) <= 2:
        string = string.split("=")[1]
    string = _fix_fracs(_fix_sqrt(string).replace(" ", ""))
    if string == "0.5":
        string = "\\frac{1}{2}"
    return _fix_a_slash_b(string)


def hendrycks_is_equiv(str1, str2) -> bool:
    if str1 is None and str2 is None:
        return True
    if str1 is None or str2 is None:
        return False
    try:
        return hendrycks_strip_string(str1) == hendrycks_strip_string(str2)
    except Exception:  # noqa: BLE001 - e.g. the assert in _remove_right_units / IndexError in _fix_sqrt
        return str1 == str2


def last_boxed_only_string(string: str) -> str | None:
    """open-instruct ``math_utils.last_boxed_only_string`` (Hendrycks): the ``\\boxed `` form wins if present."""
    idx = string.rfind("\\boxed")
    if "\\boxed " in string:
        return "\\boxed " + string.split("\\boxed ")[-1].split("$")[0]
    if idx < 0:
        idx = string.rfind("\\fbox")
        if idx < 0:
            return None
    depth = 0
    for i in range(idx, len(string)):
        if string[i] == "{":
            depth += 1
        elif string[i] == "}":
            depth -= 1
            if depth == 0:
                return string[idx: i + 1]
    return None


def remove_boxed(s: str) -> str | None:
    """open-instruct ``remove_boxed``; its AssertionError (e.g. on ``\\fbox{}``) becomes None as the caller does."""
    if "\\boxed " in s:
        return s[len("\\boxed "):] if s.startswith("\\boxed ") else None
    left = "\\boxed{"
    return s[len(left):-1] if s.startswith(left) and s.endswith("}") else None
