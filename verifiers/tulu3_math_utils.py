"""Open-Instruct's (Tulu 3) MATH answer rules: the boxed answer, Minerva's answer sentence and normalisation,
Hendrycks' string equivalence and the sympy equivalence, which ``verify_math_sample`` ORs.

Source of the rules: allenai/open-instruct @3dd7a07d ``open_instruct/math_utils.py`` (the same file at the GRPO commit
c8b66a0e3; itself from EleutherAI lm-evaluation-harness ``minerva_math`` and hendrycks/math). The two normalisers are
tables of steps in the source's order (:data:`MINERVA_STEPS`, :data:`HENDRYCKS_STEPS`), each citing its line in that
file (``L<n>``), run by ``verifiers.normalize``; the sources' exceptions are kept where the result depends on them
(Hendrycks' ``_fix_sqrt``, ``fix_fracs`` and ``fix_a_slash_b`` raise on some inputs, and ``hendrycks_is_equiv``
then compares the raw strings). tests/fidelity/rewards holds the whole reward to the source's own over the reward
corpus.

``is_equiv`` calls sympy ``parse_latex``. The release ran its ANTLR backend, which needs antlr4-python3-runtime 4.11,
but hydra-core/omegaconf pin 4.9.*; so we use the ANTLR backend when it works, else sympy's ``lark`` backend (needs
the ``lark`` package), else ``is_equiv`` is off (always False, as the release's ``except Exception`` would give) and
a warning says so. ``SYMPY_LATEX_BACKEND`` tells which applies; the two backends read some LaTeX differently
(docs/fidelity.md "Found").
"""
from __future__ import annotations

import logging
import re
import signal
import threading

import sympy

from verifiers.normalize import Step, brace_fracs, brace_sqrt_first, cut_spaced_text_unit, drop_short_lhs, lead_zero
from verifiers.normalize import literal, pattern, replace_if, run, slash_to_frac

log = logging.getLogger(__name__)
INVALID_ANSWER = "[invalidanswer]"


def _pick_backend() -> str | None:
    from sympy.parsing.latex import parse_latex

    for backend in ("antlr", "lark"):
        # sympy's ANTLR backend builds unevaluated expressions (1*2**-1, not the object Rational(1, 2)): compare values
        try:
            if sympy.simplify(parse_latex(r"\frac{1}{2}", backend=backend) - sympy.Rational(1, 2)) == 0:
                return backend
        except Exception:  # noqa: BLE001 - ImportError / version mismatch
            continue
    log.warning("sympy parse_latex has no working backend (antlr4 4.11 or lark): Tulu 3 is_equiv is disabled")
    return None


SYMPY_LATEX_BACKEND = _pick_backend()


def get_unnormalized_answer(text: str) -> str:
    """L58-69: the X of Minerva's "Final Answer: The final answer is X. I hope it is correct." (the sentence's end
    is appended first, so a cut-off last sentence still counts), stripped; else ``[invalidanswer]``."""
    found = re.search(r"Final Answer: The final answer is(.*?). I hope it is correct.", text + "I hope it is correct.")
    return found.group(1).strip() if found else INVALID_ANSWER


# L72-83, in order.
SUBSTITUTIONS = (
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), (r"\ ", ""), (" ", ""), ("mbox", "text"),
    (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
)
# L84-127, in order.
REMOVED_EXPRESSIONS = (
    "square", "ways", "integers", "dollars", "mph", "inches", "ft", "hours", "km", "units", "\\ldots", "sue",
    "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals", "edges",
    "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2",
    "\\text{}^3", "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;", r",\!", "{,}", '"',
    "\\dots",
)
# normalize_final_answer, L130-165 (Lewkowycz et al. 2022, appendix D).
MINERVA_STEPS: tuple[Step, ...] = (
    Step(lambda s: s.split("=")[-1], "L136"),
    *(Step(literal(old, new), "L138-139") for old, new in SUBSTITUTIONS),
    *(Step(literal(expr), "L140-141") for expr in REMOVED_EXPRESSIONS),
    Step(pattern(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$"), "L145"),
    *(Step(pattern(rf"(\\{cmd}\{{)(.*?)(\}})", "\\2"), f"L{line}")
      for cmd, line in (("text", 146), ("textbf", 147), ("overline", 148))),
    Step(pattern(r"(\\boxed\{)(.*)(\})", "\\2"), "L149"),
    Step(pattern(r"(frac)([^{])(.)", "frac{\\2}{\\3}"), "L157"), Step(pattern(r"(sqrt)([^{])", "sqrt{\\2}"), "L158"),
    Step(literal("$"), "L159"),
    Step(replace_if(lambda s: s.replace(",", "").isdigit(), literal(",")), "L162-163"),
)
# strip_string, L299-361 (Hendrycks et al. 2021, modeling/math_equivalence.py).
HENDRYCKS_STEPS: tuple[Step, ...] = (
    Step(literal("\n"), "L301"), Step(literal("\\!"), "L304"), Step(literal("\\\\", "\\"), "L307"),
    Step(literal("tfrac", "frac"), "L310"), Step(literal("dfrac", "frac"), "L311"),
    Step(literal("\\left"), "L314"), Step(literal("\\right"), "L315"),
    Step(literal("^{\\circ}"), "L318"), Step(literal("^\\circ"), "L319"), Step(literal("\\$"), "L322"),
    Step(cut_spaced_text_unit, "L325 (remove_right_units, L274-281)"),
    Step(literal("\\%"), "L328"), Step(literal("\\%"), "L329 (the same string again: a second pass)"),
    Step(literal(" .", " 0."), "L332"), Step(literal("{.", "{0."), "L333"),
    # L335-336 return an empty string early; every later step leaves "" as it is.
    Step(lead_zero, "L337-338"), Step(drop_short_lhs, "L341-343"),
    Step(brace_sqrt_first, "L346 (fix_sqrt, L284-296)"), Step(literal(" "), "L349"),
    Step(lambda s: brace_fracs(s, short_piece="raise"), "L352 (fix_fracs, L227-256)"),
    Step(replace_if(lambda s: s == "0.5", lambda s: "\\frac{1}{2}"), "L355-356"),
    Step(slash_to_frac, "L359 (fix_a_slash_b, L259-271)"),
)


def normalize_final_answer(final_answer: str) -> str:
    """Minerva's normalisation: :data:`MINERVA_STEPS` in order."""
    return run(MINERVA_STEPS, final_answer)


def hendrycks_strip_string(string: str) -> str:
    """Hendrycks' ``strip_string``: :data:`HENDRYCKS_STEPS` in order (some inputs raise, as there)."""
    return run(HENDRYCKS_STEPS, string)


def hendrycks_is_equiv(str1, str2) -> bool:
    """L364-378: equal after :func:`hendrycks_strip_string`; where that raises, equal as given; two Nones are equal."""
    if str1 is None or str2 is None:
        return str1 is None and str2 is None
    try:
        return hendrycks_strip_string(str1) == hendrycks_strip_string(str2)
    except Exception:  # noqa: BLE001 - the source's bare fallback
        return str1 == str2


class _Timeout:
    """The release's 5 s SIGALRM guard (L168-181; main thread only, where the worker pool adds a hard wall clock)."""

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
    """L184-224: sympy ``parse_latex`` both, then ``simplify(x1 - x2) == 0``; any error or timeout is False."""
    if SYMPY_LATEX_BACKEND is None:
        return False
    from sympy.parsing.latex import parse_latex

    try:
        with _Timeout(seconds=5):
            diff = parse_latex(x1, backend=SYMPY_LATEX_BACKEND) - parse_latex(x2, backend=SYMPY_LATEX_BACKEND)
            return bool(sympy.simplify(diff) == 0)
    except Exception:  # noqa: BLE001 - the release returns False (or None) on any parse/sympy error and on timeout
        return False


def last_boxed_only_string(string: str) -> str | None:
    """L14-41: ``\\boxed <x>`` up to the next ``$`` if that spaced form occurs anywhere; else the last ``\\boxed``
    (or, without one, the last ``\\fbox``) through the brace that closes its first group; None if none closes."""
    if "\\boxed " in string:
        return "\\boxed " + string.split("\\boxed ")[-1].split("$")[0]
    start = string.rfind("\\boxed")
    start = start if start >= 0 else string.rfind("\\fbox")
    if start < 0:
        return None
    depth = 0
    for end, ch in enumerate(string[start:], start):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if ch == "}" and depth == 0:
            return string[start:end + 1]
    return None


def remove_boxed(s: str) -> str | None:
    """L44-55: what ``\\boxed `` or ``\\boxed{...}`` holds; where the source's assertions fail (``\\fbox{}``, a spaced
    form not at the start), None, as ``verify_math_sample`` makes of the AssertionError."""
    if "\\boxed " in s:
        return s[len("\\boxed "):] if s.startswith("\\boxed ") else None
    return s[len("\\boxed{"):-1] if s.startswith("\\boxed{") and s.endswith("}") else None
