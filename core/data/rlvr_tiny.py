"""The local stand-in for Open-Instruct's RLVR data (``allenai/RLVR-GSM-MATH-IF-Mixed-Constraints``) at ``scale=tiny``.

Rows carry that dataset's columns: ``messages`` (one user message), ``ground_truth`` and ``dataset``, the tag
Open-Instruct's ``apply_verifiable_reward`` routes on (allenai/open-instruct@3dd7a07d ``model_utils.py``): ``gsm8k``
rows from GSM8K (the label after ``####``, commas dropped, as the hub rows store it), ``MATH`` rows from MATH500
(its ``answer``), and ``ifeval`` rows generated here: a short writing task plus one IFEval-style constraint, whose
ground truth is the JSON ``verifiers/ifeval.py`` reads (``func_name`` and every checker argument slot,
unused ones null, as the hub rows hold them). The phrasing of the prompts is ours; only the question texts and
answers come from the files.

Split ``train`` takes GSM8K train and the first half of MATH500, ``test`` GSM8K test and the second half; the IF rows
of the two are drawn from different seeds. The three sources are interleaved, so any prefix (the first
``train.eval_prompts`` rows Open-Instruct evaluates on) holds all three. Settings: ``data.generator``
(``data_dir``, ``rows_per_source``, ``seed``).
"""
from __future__ import annotations

import json
import random

from core import paths
from core.data.prompts import DataError, read_rows

# The keyword slots of an IF-Mixed-Constraints ground truth (if_functions.py argument names).
IF_SLOTS = ("N", "quantifier", "end_phrase", "keyword_list", "word", "forbidden_words", "letter", "i", "first_word",
            "postscript_marker", "options", "section_splitter", "original_prompt")
TASKS = ("Write a short note to a friend about {t}.", "Describe {t} to a ten-year-old.",
         "Give three pieces of advice about {t}.", "Write a product review of {t}.", "Explain why {t} matters.")
TOPICS = ("rainy weekends", "learning to cook", "city gardens", "night trains", "board games", "public libraries",
          "morning walks", "old maps")
WORDS = ("river", "lantern", "window", "garden", "bridge", "coffee", "market", "letter")
QUANTIFIERS = ("at least", "at most")


def _constraint(rng: random.Random) -> tuple[str, dict]:
    """One IFEval-style instruction and its checker arguments (phrased as the IFEval instructions are)."""
    n, w, w2 = rng.randint(1, 4), rng.choice(WORDS), rng.choice(WORDS)
    q = rng.choice(QUANTIFIERS)
    kinds = [
        (f"Include keywords {w}, {w2} in the response.", "verify_keywords", {"keyword_list": [w, w2]}),
        (f"In your response, the word {w} should appear {n} times.", "verify_keyword_frequency", {"word": w, "N": n}),
        (f"Do not include keywords {w} in the response.", "validate_forbidden_words", {"forbidden_words": [w]}),
        (f"In your response, the letter {w[0]} should appear {n + 5} times.", "verify_letter_frequency",
         {"letter": w[0], "N": n + 5}),
        (f"There should be {n + 1} paragraphs. Paragraphs are separated with the markdown divider: * * *",
         "verify_paragraph_count", {"N": n + 1}),
        (f"Answer with {q} {20 * n} words.", "validate_word_constraint", {"N": 20 * n, "quantifier": q}),
        (f"Your response should contain {q} {n + 1} sentences.", "verify_sentence_constraint",
         {"N": n + 1, "quantifier": q}),
        ("At the end of your response, please explicitly add a postscript starting with P.S.", "verify_postscript",
         {"postscript_marker": "P.S."}),
        (f"The response must contain at least {n} placeholders represented by square brackets, such as [address].",
         "validate_placeholders", {"N": n}),
        (f"Your answer must contain exactly {n + 1} bullet points. Use the markdown bullet points such as:\n"
         f"* This is point 1.", "verify_bullet_points", {"N": n + 1}),
        ("Your answer must contain a title, wrapped in double angular brackets, such as <<poem of joy>>.",
         "validate_title", {}),
        (f"Highlight at least {n} sections in your answer with markdown, i.e. *highlighted section*.",
         "validate_highlighted_sections", {"N": n}),
        ("Entire output should be wrapped in JSON format.", "validate_json_format", {}),
        ("Your entire response should be in English, and in all capital letters.", "validate_uppercase", {}),
        ("Your entire response should be in English, and in all lowercase letters. No capital letters are allowed.",
         "validate_lowercase", {}),
        ("Finish your response with this exact phrase Any other questions?. No other words should follow this "
         "phrase.", "validate_end", {"end_phrase": "Any other questions?"}),
        ("Wrap your entire response with double quotation marks.", "validate_quotation", {}),
        ("In your entire response, refrain from the use of any commas.", "validate_no_commas", {}),
        ("Give two different responses. Responses and only responses should be separated by 6 asterisk symbols: "
         "******.", "validate_two_responses", {}),
        (f"In your response, words with all capital letters should appear {q} {n} times.",
         "validate_frequency_capital_words", {"N": n, "quantifier": q}),
    ]
    text, func, kwargs = rng.choice(kinds)
    return text, {"func_name": func, **{k: kwargs.get(k) for k in IF_SLOTS}}


def if_rows(n: int, seed: int) -> list[dict]:
    """``n`` generated instruction-following rows (seeded)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        task = rng.choice(TASKS).format(t=rng.choice(TOPICS))
        text, truth = _constraint(rng)
        out.append(_row(f"{task} {text}", json.dumps(truth), "ifeval"))
    return out


def _row(content: str, truth: str, dataset: str) -> dict:
    return {"messages": [{"role": "user", "content": content}], "ground_truth": truth, "dataset": dataset}


def mixture(name: str, data_dir, n: int, seed: int) -> list[dict]:
    """The ``train`` or ``test`` mixture: ``n`` rows of each source, interleaved gsm8k, MATH, ifeval."""
    if name not in ("train", "test"):
        raise DataError(f"data.split / data.eval_split={name!r}: the tiny RLVR mixture has splits train and test")
    root = paths.resolve(data_dir)
    gsm = read_rows(root / "gsm8k" / f"{name}.jsonl", "data.generator.data_dir")[:n]
    math500 = read_rows(root / "math500" / "test.jsonl", "data.generator.data_dir")
    half = len(math500) // 2
    math_rows = (math500[:half] if name == "train" else math500[half:])[:n]
    sources = [[_row(r["question"], r["answer"].split("####")[-1].strip().replace(",", ""), "gsm8k") for r in gsm],
               [_row(r["problem"], r["answer"], "MATH") for r in math_rows],
               if_rows(n, seed + (name == "test"))]
    return [rows[i] for i in range(n) for rows in sources if i < len(rows)]


def rows(cfg, split: str) -> list[dict]:
    """Rows of ``split`` (``train`` reads ``data.split``, ``eval`` reads ``data.eval_split``)."""
    g = cfg.generator or {}
    missing = [k for k in ("data_dir", "rows_per_source", "seed") if k not in g]
    if missing:
        raise DataError(f"data.source=rlvr_mixture_tiny needs data.generator.{', data.generator.'.join(missing)}")
    name = cfg.split if split == "train" else cfg.eval_split
    return mixture(name, g["data_dir"], int(g["rows_per_source"]), int(g["seed"]))
