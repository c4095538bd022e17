"""pass@k and avg@k over n completions per problem.

pass@k is the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained on Code",
arXiv:2107.03374, section 2.1 and Figure 3): with ``n`` samples of a problem of which ``c`` are correct,
``pass@k = 1 - C(n - c, k) / C(n, k)``, the probability that a ``k``-subset of the samples holds a correct one,
averaged over problems. The paper computes it as ``1 - prod_{i = n-c+1}^{n} (1 - k / i)`` because
``C(n, k)`` overflows floats; here Python's integers are exact at any size, so the ratio is formed as an
exact fraction and rounded once (lighteval ``PassAtK.pass_at_k`` @ d3da6b9 uses the paper's product).

avg@k (SimpleRL-Zoo's "Avg@32": the mean score of 32 samples per problem) is the mean correctness of the
samples, which is exactly pass@1 of the same samples: ``1 - C(n - c, 1) / C(n, 1) = c / n``. Open-R1's
"pass@1 with 64 responses per query" (lighteval ``math_pass@1:64_samples``) is the same number.
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Sequence


def pass_at_k_fraction(n: int, c: int, k: int) -> Fraction:
    """Exact ``1 - C(n - c, k) / C(n, k)`` for one problem: ``n`` samples, ``c`` correct, ``1 <= k <= n``."""
    if not 0 <= c <= n:
        raise ValueError(f"pass@k: {c} correct of {n} samples; expected 0 <= c <= n")
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} with {n} samples per problem: expected 1 <= k <= n")
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))  # comb(n - c, k) = 0 when n - c < k


def pass_at_k(n: int, c: int, k: int) -> float:
    """:func:`pass_at_k_fraction` rounded once to a float."""
    return float(pass_at_k_fraction(n, c, k))


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """pass@k of a set: the mean over problems of each one's estimate, ``counts`` = ``(n, c)`` per problem;
    NaN for no problems."""
    if not counts:
        return float("nan")
    return float(sum(pass_at_k_fraction(n, c, k) for n, c in counts) / len(counts))


def mean_correct(counts: Sequence[tuple[int, int]]) -> float:
    """avg@n of a set: the mean over problems of ``c / n`` (greedy pass@1 when ``n = 1``); NaN for none."""
    if not counts:
        return float("nan")
    return float(sum(Fraction(c, n) for n, c in counts) / len(counts))


def set_metrics(counts: Sequence[tuple[int, int]], greedy: bool, samples: int, pass_k: Sequence[int]) -> dict:
    """The metrics of one set: greedy decoding reports ``pass@1``; sampling reports ``avg@<samples>`` and
    ``pass@<k>`` for each requested ``k``."""
    if greedy:
        return {"pass@1": mean_correct(counts)}
    return {f"avg@{samples}": mean_correct(counts), **{f"pass@{k}": mean_pass_at_k(counts, k) for k in pass_k}}
