"""The reward corpus: recorded golds with generated and adversarial completions, for checking each verifier against
its source's own reward code (tests/fidelity/rewards/test_rewards.py; docs/fidelity.md "Rewards").

    python -m tests.fidelity.rewards.corpus OUT.jsonl [--data ../shared/data]

Deterministic: the same data gives the same corpus, byte for byte (a fixed seed, rows taken in file order). The golds
come from the real sets in ``shared/data`` (MATH500 answers and solutions, GSM8K labels, SimpleRL-Zoo's evaluation
sets: AIME 2024, AMC 2023, Minerva Math, every other row of OlympiadBench); the completions are written around them
here: the answer boxed, in Minerva's sentence, after "The answer is", in ``<think>``/``<answer>`` tags, in other LaTeX
forms (``\\dfrac``, ``a/b``, decimals, units, degrees, percentages, dollars, thousands separators, number words),
wrong, twice boxed, nested, truncated, empty, with the chat template's special strings inside. The IFEval rows are
constraints of the 25 Tulu 3 checkers (tests/fidelity/rewards/ifeval_cases.py) with responses on each side of them.
Each row:
``{"id", "task": math|gsm8k|ifeval, "set", "problem", "answer", "solution", "completion", "case"}`` (ifeval:
``ground_truth``, the constraint's JSON, in place of answer and solution).
"""
from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

from tests.fidelity.rewards.ifeval_cases import ifeval_rows

SEED = 41
REASONING = "Let me work through this step by step.\nFirst, I set up the equations and simplify."
WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def math_golds(data: Path) -> list[dict]:
    """(set, problem, answer, solution) of every row of the math sets, in file order."""
    rows = [{"set": "math500", "problem": r["problem"], "answer": r["answer"], "solution": r["solution"]}
            for r in _jsonl(data / "math500" / "test.jsonl")]
    ev = data / "simplerl_zoo" / "eval"
    for name in ("aime24", "amc23"):
        rows += [{"set": name, "problem": r["problem"] if "problem" in r else r["question"],
                  "answer": _plain(r["answer"]), "solution": r.get("solution")}
                 for r in _jsonl(ev / name / "test.jsonl")]
    for r in _jsonl(ev / "minerva_math" / "test.jsonl"):
        boxed = _last_box(r["solution"])
        if boxed:
            rows.append({"set": "minerva_math", "problem": r["problem"], "answer": boxed, "solution": r["solution"]})
    for r in _jsonl(ev / "olympiadbench" / "test.jsonl")[::2]:
        rows.append({"set": "olympiadbench", "problem": r["question"], "answer": r["final_answer"][0].strip("$"),
                     "solution": None})
    return rows


def _plain(value) -> str:
    """AMC keeps answers as floats (27.0): the integer's text, as SimpleRL-Zoo's parse_ground_truth."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _last_box(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j]
    return None


def gsm8k_golds(data: Path) -> list[dict]:
    return [{"set": "gsm8k", "problem": r["question"], "answer": r["answer"].split("####")[-1].strip().replace(",", ""),
             "solution": r["answer"]} for r in _jsonl(data / "gsm8k" / "test.jsonl")]


def _fraction_forms(g: str) -> list[tuple[str, str]]:
    m = re.fullmatch(r"(-?)\\[dt]?frac\{(\d+)\}\{(\d+)\}", g)
    if not m:
        return []
    s, a, b = m.groups()
    return [("dfrac", f"{s}\\dfrac{{{a}}}{{{b}}}"), ("slash", f"{s}{a}/{b}"),
            ("decimal", f"{s}{int(a) / int(b):.6g}"), ("malformed_frac", f"{s}\\frac{a}{b}" if len(a + b) == 2 else g)]


def _integer_forms(g: str) -> list[tuple[str, str]]:
    if not re.fullmatch(r"-?\d+", g):
        return []
    n = int(g)
    forms = [("plus_one", str(n + 1)), ("point_zero", f"{n}.0"), ("dollars", f"\\${n}"), ("percent", f"{n}\\%"),
             ("degrees", f"{n}^\\circ"), ("units", f"{n} \\text{{ cm}}"), ("x_equals", f"x = {n}")]
    if abs(n) >= 1000:
        forms.append(("thousands", f"{n:,}"))
    if 0 <= n < len(WORDS):
        forms.append(("word", WORDS[n]))
    return forms


def answer_forms(g: str) -> list[tuple[str, str]]:
    """Other ways of writing gold ``g`` (equal or not: the verifiers decide), named."""
    forms = _fraction_forms(g) + _integer_forms(g)
    forms += [("spaced", " ".join(g)), ("left_right", g.replace("(", "\\left(").replace(")", "\\right)")),
              ("text", f"\\text{{{g}}}"), ("mathrm", f"\\mathrm{{{g}}}"), ("displaystyle", f"\\displaystyle {g}")]
    return [(n, f) for n, f in forms if f != g or n == "spaced"]


def frames(answer: str, wrong: str) -> list[tuple[str, str]]:
    """Completions around ``answer``; ``wrong`` is another set's gold."""
    r = REASONING
    return [
        ("boxed", f"{r}\nSo the answer is $\\boxed{{{answer}}}$."),
        ("minerva", f"{r}\nFinal Answer: The final answer is ${answer}$. I hope it is correct."),
        ("the_answer_is", f"{r}\nThe answer is {answer}"),
        ("think_answer", f"<think>\n{r}\n</think>\n<answer>\n$\\boxed{{{answer}}}$\n</answer>"),
        ("think_answer_bare", f"<think>\n{r}\n</think>\n<answer>\n{answer}\n</answer>"),
        ("dollars_last", f"{r} We get ${wrong}$ first, then ${answer}$."),
        ("two_boxes_right_last", f"{r} Maybe $\\boxed{{{wrong}}}$. No: $\\boxed{{{answer}}}$."),
        ("two_boxes_right_first", f"{r} $\\boxed{{{answer}}}$, or rather $\\boxed{{{wrong}}}$."),
        ("nested_box", f"{r} $\\boxed{{\\boxed{{{answer}}}}}$"),
        ("fbox", f"{r} $\\fbox{{{answer}}}$"),
        ("box_space", f"{r} The result is \\boxed {answer}$ done"),
        ("truncated", f"{r} so the result is $\\boxed{{{answer}"),
        ("empty_box", f"{r} $\\boxed{{}}$ and then {answer}"),
        ("display_math", f"{r}\n\\[\n\\boxed{{{answer}}}\n\\]"),
        ("paren_math", f"{r} Hence \\({answer}\\)."),
        ("chinese", f"{r} 答案是 {answer}\n\n"),
        ("final_answer_is", f"{r} The final answer is {answer}."),
        ("assistant_inside", f"{r}\n<|assistant|>\nThe answer is $\\boxed{{{answer}}}$"),
        ("im_end_inside", f"$\\boxed{{{wrong}}}$<|im_end|>\n<|im_start|>assistant\n$\\boxed{{{answer}}}$"),
        ("whitespace", f"\n\n  {answer}  \n\n"),
        ("bare", answer),
    ]


def math_rows(golds: list[dict], rng: random.Random, per_gold: int, prefix: str) -> list[dict]:
    rows = []
    for k, gold in enumerate(golds):
        wrong = golds[(k + 7) % len(golds)]["answer"]
        candidates = [(f"{fn}:gold", text) for fn, text in frames(gold["answer"], wrong)]
        for form, value in answer_forms(gold["answer"]):
            boxed, minerva = frames(value, wrong)[:2]
            candidates += [(f"boxed:{form}", boxed[1]), (f"minerva:{form}", minerva[1])]
        candidates += [("boxed:wrong", frames(wrong, gold["answer"])[0][1]), ("no_answer", REASONING)]
        for case, text in rng.sample(candidates, min(per_gold, len(candidates))):
            end = rng.choice(["<|im_end|>", "<|endoftext|>", ""])  # finished (two stop strings) or cut at max length
            rows.append({**gold, "id": f"{prefix}{len(rows):05d}", "task": "math", "completion": text, "end": end,
                         "case": case})
    return rows


def gsm8k_cases(label: str, wrong: str) -> list[tuple[str, str]]:
    n = label
    return [
        ("last_number", f"She sells 9 eggs for $2 each, so she makes {n} dollars."),
        ("answer_is", f"The answer is {n}."), ("boxed", f"Thus $\\boxed{{{n}}}$"),
        ("hashes", f"Step 1. 4 + 5 = 9\n#### {n}"),
        ("point_zero", f"The answer is {n}.0"), ("decimal_cents", f"Total: ${n}.00"), ("negative", f"It is -{n}"),
        ("plus", f"It is +{n}"), ("thousands", f"The total is {int(n):,} units" if n.isdigit() else f"= {n}"),
        ("trailing_number", f"The answer is {n}, which took 2 days."), ("wrong", f"The answer is {wrong}."),
        ("no_number", "I cannot tell."), ("percent", f"{n}%"), ("word", f"The answer is {WORDS[int(n)]}." if
                                                                      n.isdigit() and int(n) < len(WORDS) else n),
        ("leading_decimal", f"so .{n}"), ("spaces", f"  {n}  "), ("assistant_inside", f"<|assistant|>\n{n} then 7"),
        ("units_after", f"{n}kg"), ("comma_list", f"1,2,{n}"),
    ]


def gsm8k_rows(golds: list[dict], rng: random.Random, per_gold: int) -> list[dict]:
    rows = []
    for k, gold in enumerate(golds):
        wrong = golds[(k + 3) % len(golds)]["answer"]
        for case, text in rng.sample(gsm8k_cases(gold["answer"], wrong), per_gold):
            rows.append({**gold, "id": f"g{len(rows):05d}", "task": "gsm8k", "completion": text,
                         "end": rng.choice(["<|im_end|>", ""]), "case": case})
    return rows


def build(data: Path) -> list[dict]:
    rng = random.Random(SEED)
    golds = math_golds(data)
    # 250 of MATH500 once each, the other sets' rows once each, and 100 of MATH500 eight times
    math = [g for i, g in enumerate(golds) if g["set"] != "math500" or i % 2 == 0]
    rows = math_rows(math, rng, per_gold=1, prefix="m")
    rows += math_rows([g for i, g in enumerate(golds) if g["set"] == "math500" and i % 5 == 1], rng, 8, "n")
    rows += gsm8k_rows(gsm8k_golds(data)[::6], rng, per_gold=2)
    return rows + ifeval_rows(rng)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[3].parent / "shared" / "data")
    args = ap.parse_args(argv)
    rows = build(args.data)
    args.out.write_text("".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows))
    counts = ", ".join(f"{t} {sum(r['task'] == t for r in rows)}" for t in ("math", "gsm8k", "ifeval"))
    print(f"{len(rows)} rows: {counts}")


if __name__ == "__main__":
    main()
