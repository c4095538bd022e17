"""Reward composition: a weighted sum of named verifiers, with None handling, penalties and per-verifier metrics;
registered as the ``weighted`` verifier (TRL's several reward functions with weights) and, with a router from a
dataset column to verifiers and a scale, as ``routed`` (Open-Instruct Tulu 3's GSM8K / MATH / IFEval at 10).

None handling follows TRL GRPOTrainer (reference open_r1.md §2): a verifier's None becomes NaN and the weighted sum
is a ``nansum``, so it contributes 0; a sample whose every term is None stays None (skipped).
Open-Instruct Tulu 3 (allenai/open-instruct @3dd7a07d, reference open_instruct.md §3.1): ``verify_reward=10`` for a
verified sample, and when the response did not stop (no EOS) the score is *replaced* by ``penalty_reward_value``
(-10): see :func:`open_instruct_reward`.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Sequence

from verifiers import get_verifier


@dataclass
class Term:
    name: str
    weight: float = 1.0
    kwargs: dict = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.weight, (int, float)) or not math.isfinite(self.weight):
            raise ValueError(f"weight of {self.name!r} must be a finite number, got {self.weight!r}")
        get_verifier(self.name)  # unknown names fail here, listing the registered ones


def as_term(spec: Any) -> Term:
    if isinstance(spec, Term):
        return spec
    if isinstance(spec, str):
        return Term(spec)
    if isinstance(spec, Mapping):  # a dict, or a config node (an evaluation set's verifier_kwargs)
        return Term(**dict(spec))
    if isinstance(spec, (tuple, list)) and len(spec) in (2, 3):
        return Term(*spec)
    raise TypeError(f"a reward term is a name, (name, weight[, kwargs]), a dict or a Term; got {spec!r}")


class ComposedReward:
    """``ComposedReward(["math", ("format", 0.5)])(completions, **columns) -> list[float | None]``.

    ``non_stop_penalty``: if given, samples with ``finished[i] == False`` (pass ``finished=[...]``) get exactly this
    value (Open-Instruct's override). ``last_metrics`` holds per-verifier mean (over non-None), None rate and the
    total's mean after each call, named ``rewards/<name>/mean`` etc. like TRL's logs.
    """

    def __init__(self, terms: Sequence[Any], non_stop_penalty: float | None = None):
        self.terms = [as_term(t) for t in terms]
        if not self.terms:
            raise ValueError("ComposedReward needs at least one term")
        self.non_stop_penalty = non_stop_penalty
        self.last_metrics: dict[str, float] = {}

    def __call__(self, completions, finished: Sequence[bool] | None = None, **columns) -> list[float | None]:
        n = len(completions)
        totals, per_term = self.score_terms(completions, **columns)
        if self.non_stop_penalty is not None:
            if finished is None or len(finished) != n:
                raise ValueError("non_stop_penalty needs finished=[bool per completion]")
            totals = [t if done else float(self.non_stop_penalty) for t, done in zip(totals, finished)]
        self._metrics(per_term, totals)
        return totals

    def score_terms(self, completions, **columns) -> tuple[list[float | None], list[list[float | None]]]:
        """The weighted sums and each term's rewards (``per_term[j][i]``: term ``j`` of completion ``i``), before
        any penalty."""
        n, per_term = len(completions), []
        for t in self.terms:
            vals = list(get_verifier(t.name)(completions, **{**columns, **t.kwargs}))
            if len(vals) != n:
                raise RuntimeError(f"verifier {t.name!r} returned {len(vals)} rewards for {n} completions")
            per_term.append(vals)
        return [self._total(i, per_term) for i in range(n)], per_term

    def _total(self, i: int, per_term: list) -> float | None:
        vals = [(t.weight, v[i]) for t, v in zip(self.terms, per_term)]
        if all(v is None for _, v in vals):
            return None
        return float(sum(w * v for w, v in vals if v is not None))

    def _metrics(self, per_term: list, totals: list) -> None:
        m: dict[str, float] = {}
        for t, vals in zip(self.terms, per_term):
            ok = [v for v in vals if v is not None]
            m[f"rewards/{t.name}/mean"] = sum(ok) / len(ok) if ok else float("nan")
            m[f"rewards/{t.name}/none_frac"] = 1 - len(ok) / len(vals) if vals else 0.0
        ok = [v for v in totals if v is not None]
        m["reward/mean"] = sum(ok) / len(ok) if ok else float("nan")
        self.last_metrics = m


def open_instruct_reward(verifier: str, verification_reward: float = 10.0,
                         penalty_reward_value: float = -10.0) -> ComposedReward:
    """Tulu 3 RLVR reward: ``verification_reward`` x verified, replaced by the penalty for non-stopped responses."""
    return ComposedReward([Term(verifier, verification_reward)], non_stop_penalty=penalty_reward_value)


# --------------------------------------------------------------------------------------- as named verifiers
def weighted(completions: list[str], terms: Sequence[Any] = (), **columns) -> list[float | None]:
    """Several rewards summed with weights, as TRL's ``reward_funcs`` with ``reward_weights`` (Open-R1: accuracy +
    format + tag_count, or code + 0.1 code_format; reference open_r1.md §2). ``terms``: a list of
    ``{name, weight, kwargs}`` (``verifier.kwargs.terms``); None per term handled as :class:`ComposedReward`."""
    return ComposedReward(terms)(completions, **columns)


def routed(completions: list[str], routes: dict | None = None, route_column: str = "dataset", scale: float = 1.0,
           **columns) -> list[float | None]:
    """Each row scored by the verifier its ``route_column`` names, times ``scale``: Open-Instruct Tulu 3's
    ``apply_verifiable_reward`` dispatches on ``dataset.lower()`` (gsm8k, math, ifeval) and pays
    ``verify_reward=10`` for a verified sample (allenai/open-instruct@3dd7a07d ``model_utils.py``,
    ``ground_truth_utils.py``; reference open_instruct.md §3.1). ``routes`` maps the lower-cased column value to a
    verifier name, or to ``{name, kwargs}`` when that verifier takes settings of its own (the IFEval route's
    release checkers); a value it does not name is refused (naming the value and the routes)."""
    n = len(completions)
    if not routes:
        raise ValueError("verifier routed needs kwargs.routes: {column value: verifier name}")
    if route_column not in columns:
        raise KeyError(f"verifier routed: the rows have no {route_column!r} column (kwargs.route_column); "
                       f"columns: {sorted(k for k, v in columns.items() if _is_column(v, n))}")
    tags = [str(v).lower() for v in columns[route_column]]
    unknown = sorted(set(tags) - set(routes))
    if unknown:
        raise KeyError(f"verifier routed: {route_column} value(s) {unknown} have no route; routes: {dict(routes)}")
    out: list[float | None] = [None] * n
    for tag in sorted(set(tags)):
        idx = [i for i, t in enumerate(tags) if t == tag]
        cols = {k: [v[i] for i in idx] if _is_column(v, n) else v for k, v in columns.items()}
        name, kwargs = _route(tag, routes[tag])
        vals = get_verifier(name)([completions[i] for i in idx], **{**cols, **kwargs})
        for i, v in zip(idx, vals):
            out[i] = None if v is None else float(scale) * float(v)
    return out


def _route(tag: str, spec: Any) -> tuple[str, dict]:
    """A route's verifier name and its own keyword arguments: ``"name"`` or ``{"name": ..., "kwargs": {...}}``."""
    if isinstance(spec, str):
        return spec, {}
    if isinstance(spec, Mapping) and "name" in spec and set(spec) <= {"name", "kwargs"}:
        return str(spec["name"]), dict(spec.get("kwargs") or {})
    raise TypeError(f"verifier routed: route {tag!r} is {spec!r}; expected a verifier name or {{name, kwargs}}")


def _is_column(value: Any, n: int) -> bool:
    """A dataset column reaches a verifier as a list aligned with the completions; anything else is a setting."""
    return isinstance(value, (list, tuple)) and len(value) == n
