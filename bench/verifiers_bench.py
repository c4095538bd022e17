"""Verifier throughput: our ``math`` verifier vs a plain sequential math-verify ``parse`` + ``verify`` loop, and the
code sandbox's throughput (``code_mbpp`` on MBPP reference solutions: one sandboxed process per sample).

4096 realistic completions (long reasoning text ending in a boxed answer, half correct, answers in varied forms),
in groups of 8 per prompt like GRPO. Both sides use the same extraction config (verifiers.mv), so rewards must be
identical; the bench prints any mismatch. Golds come from MATH500 when ../shared/data is present, else synthetic.
"""
from __future__ import annotations

import json
import os
import random
import statistics
import time

N, GROUP = 4096, 8


def _golds() -> list[str]:
    from core import paths

    p = paths.data_dir() / "math500" / "test.jsonl"
    if p.is_file():
        return [json.loads(line)["answer"] for line in open(p)]
    return [str(i * 7) for i in range(500)] + [f"\\frac{{{i}}}{{{i + 1}}}" for i in range(1, 100)]


def _variant(gold: str, rng: random.Random) -> str:
    if gold.isdigit():
        return rng.choice([gold, gold + ".0", f"{gold}", f"\\frac{{{int(gold) * 2}}}{{2}}"])
    return gold


def make_corpus(seed: int = 0) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    golds = _golds()
    filler = ("We expand the expression and collect like terms, checking each step carefully. "
              "Substituting back, the equation holds, so we continue with the next case. ") * 20
    comps, answers = [], []
    for g in range(N // GROUP):
        gold = golds[g % len(golds)]
        for k in range(GROUP):
            wrong = golds[(g + 1 + k) % len(golds)] if not gold.isdigit() else str(int(gold) + 1 + k)
            ans = _variant(gold, rng) if k % 2 == 0 else wrong
            comps.append(f"Let's think step by step.\n{filler}\nTherefore the answer is $\\boxed{{{ans}}}$.")
            answers.append(gold)
    return comps, answers


def plain_loop(comps, answers):
    from math_verify import parse, verify

    from verifiers.math import gold_as_latex
    from verifiers.mv import DEFAULT_ANSWER_CONFIG, GOLD_CONFIG

    out, lat = [], []
    for c, a in zip(comps, answers):
        t = time.perf_counter()
        gold = parse(gold_as_latex(a), list(GOLD_CONFIG), extraction_mode="first_match")
        if not gold:
            out.append(None)
        else:
            pred = parse(c, list(DEFAULT_ANSWER_CONFIG), extraction_mode="first_match")
            out.append(1.0 if verify(gold, pred, float_rounding=6, strict=True) else 0.0)
        lat.append(time.perf_counter() - t)
    return out, lat


# Warm-up items outside the corpus: the first parse in a process pays math-verify's imports and
# parser set-up; a trainer pays that once, so both sides pay it before the clock starts and no
# corpus string is cached by it.
WARM = [("The answer is $\\boxed{\\frac{7}{9}\\sqrt{2}}$.", "\\frac{7\\sqrt{2}}{9}"),
        ("So $\\boxed{x^2+1}$.", "1+x^2"), ("Hence $\\boxed{(1, 2)}$.", "(1,2)")]


def warm_plain() -> None:
    plain_loop([c for c, _ in WARM], [g for _, g in WARM])


def _warm_worker(i: int) -> float:
    """Runs in a pool worker: math-verify imported and its parser set up, on a warm-up item."""
    from verifiers.math import score_default

    text, gold = WARM[i % len(WARM)]
    return score_default(text, gold)


def warm_ours() -> None:
    """Fresh workers, each warmed (imports, parser set-up) with the warm-up items only."""
    from verifiers.mv import parse_gold_cached
    from verifiers.pool import _CHUNK, get_pool

    pool = get_pool()
    pool.close()
    parse_gold_cached.cache_clear()
    pool.map(_warm_worker, [(i,) for i in range(_CHUNK * pool.n)])  # one full chunk per worker


def ours(comps, answers):
    from verifiers import get_verifier

    fn = get_verifier("math")
    warm_ours()
    t0 = time.perf_counter()
    out = fn(comps, answer=answers)
    total = time.perf_counter() - t0
    warm_ours()  # latency on fresh workers too: nothing of the corpus is cached from the full run
    lat = []
    for i in range(0, 512, GROUP):  # per-group latency, as an RL step scores a prompt's group at once
        t = time.perf_counter()
        fn(comps[i:i + GROUP], answer=answers[i:i + GROUP])
        lat.append(time.perf_counter() - t)
    return out, total, lat


def p99(xs):
    return statistics.quantiles(xs, n=100)[98]


def _mbpp_rows() -> list[dict]:
    from core import paths

    p = paths.data_dir() / "mbpp" / "mbpp.jsonl"
    if p.is_file():
        rows = [json.loads(line) for line in open(p)]
        return [r for r in rows if r["task_id"] != 123][:CODE_N]  # task 123 alone takes ~4 s (a slow reference)
    return [{"code": f"def f(x):\n    return x + {i}", "test_setup_code": "", "test_list": [f"assert f(1) == {i + 1}"]}
            for i in range(CODE_N)]


CODE_N = 128


def code_part() -> dict:
    """Sandboxed-process throughput: ``code_mbpp`` over reference solutions, all of which must pass."""
    from verifiers import get_verifier

    rows = _mbpp_rows()
    fn = get_verifier("code_mbpp")
    kw = dict(raw_code=True, timeout=20.0)
    fn([rows[0]["code"]], test_list=[rows[0]["test_list"]], test_setup_code=[rows[0]["test_setup_code"]], **kw)
    t0 = time.perf_counter()
    out = fn([r["code"] for r in rows], test_list=[r["test_list"] for r in rows],
             test_setup_code=[r["test_setup_code"] for r in rows], **kw)
    total = time.perf_counter() - t0
    lat = []
    for r in rows[:32]:  # one sample at a time: the sandbox's own start-up + run cost
        t = time.perf_counter()
        fn([r["code"]], test_list=[r["test_list"]], test_setup_code=[r["test_setup_code"]], **kw)
        lat.append(time.perf_counter() - t)
    res = {"code_n": len(rows), "code_sps": len(rows) / total, "code_pass": sum(v == 1.0 for v in out),
           "code_single_ms": 1e3 * statistics.median(lat)}
    print("verifiers bench (code_mbpp, sandbox): {code_n} reference solutions, {code_pass} pass; {code_sps:.1f} "
          "samples/s; one sample alone {code_single_ms:.0f} ms (median)".format(**res))
    return res


def main() -> dict:
    comps, answers = make_corpus()
    warm_plain()
    t0 = time.perf_counter()
    base, base_lat = plain_loop(comps, answers)
    base_s = time.perf_counter() - t0
    fast, fast_s, group_lat = ours(comps, answers)
    mism = sum(a != b for a, b in zip(base, fast))
    res = {"n": len(comps), "cores": len(os.sched_getaffinity(0)), "plain_sps": len(comps) / base_s,
           "ours_sps": len(comps) / fast_s, "speedup": base_s / fast_s, "plain_p99_ms": 1e3 * p99(base_lat),
           "ours_group8_p99_ms": 1e3 * p99(group_lat), "mismatches": mism, "correct_frac": sum(v == 1.0 for v in fast) / len(fast)}
    print("verifiers bench (math): {n} completions, {cores} cores".format(**res))
    print("  plain math-verify loop: {plain_sps:.1f} samples/s, p99 {plain_p99_ms:.1f} ms/sample".format(**res))
    print("  rlrecipes `math`:       {ours_sps:.1f} samples/s ({speedup:.2f}x), p99 {ours_group8_p99_ms:.1f} ms "
          "per group of 8".format(**res))
    print("  identical rewards: {} (mismatches {mismatches}); correct fraction {correct_frac:.3f}".format(mism == 0, **res))
    res.update(code_part())
    return res


if __name__ == "__main__":
    main()
