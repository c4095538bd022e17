"""What a reward says about correctness: the accuracy the RL loop logs (``accuracy``, the progress bar's ``acc``), its
greedy held-out evaluation and ``python -m recipes.eval`` count by it (docs/verifiers.md "Accuracy").

A plain verifier is its own correctness term: a completion is correct when its reward is above the verifier's
``correct_above`` (declared beside it in verifiers/__init__.py: 0 for the 1/0 math, GSM8K and IFEval checkers and
``routed``'s x10, 0.99 for the code rewards that pay the fraction of tests passed, Open-R1's ``binary_code`` cut),
and a format or shaping reward (``correct_above=None``: format, tag_count, ...) is none. A verifier of one's own is
correct above 0 unless its function says otherwise (``fn.correct_above = 0.5``, or ``None`` for a format reward).

A ``weighted`` sum is scored term by term (:class:`Scorer`): the sum trains, each term is logged
(``rewards/<term>/mean``), and accuracy is its correctness term's verdict, not ``sum > 0`` (a 0.1 format bonus puts
every sum above 0). ``verifier.accuracy_term`` names that term; null picks the one correctness term, and a sum with
none or several is refused before a model is built, naming the key (:func:`accuracy_term`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from verifiers import VERIFIERS, get_verifier
from verifiers.compose import ComposedReward, Term, as_term, weighted

ACCURACY_KEY = "verifier.accuracy_term"


@dataclass(frozen=True)
class Scores:
    """One call's rewards (what trains; None: skipped), a weighted sum's rewards per term label (empty for a plain
    verifier), and the accuracy term's rewards with the bar a correct one is above."""

    rewards: list
    terms: dict[str, list]
    accuracy: list
    threshold: float

    @property
    def correct(self) -> list[bool | None]:
        """Per completion: the accuracy term's verdict; None where that term gave None (not judged)."""
        return [None if r is None else float(r) > self.threshold for r in self.accuracy]


def correct_above(name: str) -> float | None:
    """The reward above which verifier ``name`` calls a completion correct; None for a format or shaping reward."""
    meta = VERIFIERS.meta(name)
    if "correct_above" in meta:
        return meta["correct_above"]
    return getattr(get_verifier(name), "correct_above", 0.0)


def weighted_terms(name: str, kwargs: Mapping | None) -> list[Term] | None:
    """The terms of a ``weighted`` verifier (``kwargs.terms``); None for any other verifier."""
    if get_verifier(name) is not weighted:
        return None
    return [as_term(t) for t in (kwargs or {}).get("terms") or ()]


def term_labels(terms: Sequence[Term]) -> list[str]:
    """What the metrics and ``verifier.accuracy_term`` call each term: its name, ``name#k`` for its k-th repeat."""
    seen: dict[str, int] = {}
    labels = []
    for t in terms:
        seen[t.name] = seen.get(t.name, 0) + 1
        labels.append(t.name if seen[t.name] == 1 else f"{t.name}#{seen[t.name]}")
    return labels


def accuracy_term(name: str, kwargs: Mapping | None, chosen: str | None,
                  key: str = ACCURACY_KEY) -> tuple[int | None, float]:
    """``(index of the accuracy term in a weighted sum, None for a plain verifier; the bar a correct reward is
    above)``. A named term counts above its own bar (0 for a format reward: the choice is the user's). Raises
    ValueError naming ``key`` for a term that is not there, or a reward with no correctness term or several."""
    terms = weighted_terms(name, kwargs)
    if terms is None:
        if chosen is not None and chosen != name:
            raise ValueError(f"{key}={chosen!r}: verifier {name} is not a weighted sum; its own reward is its "
                             f"accuracy (leave {key} null, or set it to {name!r})")
        bar = correct_above(name)
        if bar is None and chosen is None:
            raise ValueError(f"{key}=null: verifier {name} is a format reward, not a correctness one, so 'accuracy' "
                             f"would count well-formed answers; score with a correctness verifier, or set "
                             f"{key}={name} to count its reward > 0 as correct anyway")
        return None, bar or 0.0
    if not terms:
        raise ValueError(f"verifier {name}: kwargs.terms is empty; list the rewards it sums ({{name, weight}} each)")
    labels = term_labels(terms)
    if chosen is not None:
        if chosen not in labels:
            raise ValueError(f"{key}={chosen!r}: not a term of this weighted reward; its terms: {', '.join(labels)}")
        i = labels.index(chosen)
        return i, correct_above(terms[i].name) or 0.0
    found = [(i, bar) for i, t in enumerate(terms) if (bar := correct_above(t.name)) is not None]
    if len(found) == 1:
        return found[0]
    what = "no correctness term (only format or shaping rewards)" if not found else \
        f"several correctness terms ({', '.join(labels[i] for i, _ in found)})"
    raise ValueError(f"{key}=null: the weighted reward of {', '.join(labels)} has {what}, so accuracy has no single "
                     f"meaning; name the term it counts, e.g. {key}={labels[found[0][0]] if found else labels[0]}")


class Scorer:
    """``Scorer(name, kwargs, accuracy_term)(completions, **columns) -> Scores``: verifier ``name`` with its options;
    a ``weighted`` one is summed here term by term, so each term's rewards come back beside the sum (the same sum
    ``weighted`` returns). Construction raises ValueError as :func:`accuracy_term` does."""

    def __init__(self, name: str, kwargs: Mapping | None = None, chosen: str | None = None, key: str = ACCURACY_KEY):
        self.name, self.kwargs = name, dict(kwargs or {})
        self.fn = get_verifier(name)
        self.index, self.threshold = accuracy_term(name, self.kwargs, chosen, key)
        terms = weighted_terms(name, self.kwargs)
        self.composed = ComposedReward(terms) if terms else None
        self.labels = term_labels(terms) if terms else []

    @property
    def accuracy_name(self) -> str:
        """What accuracy counts by: the accuracy term's label, or the verifier's name."""
        return self.name if self.index is None else self.labels[self.index]

    def __call__(self, completions: list[str], **columns: Any) -> Scores:
        if self.composed is None:
            rewards = list(self.fn(completions, **columns, **self.kwargs))
            return Scores(rewards, {}, rewards, self.threshold)
        options = {k: v for k, v in self.kwargs.items() if k != "terms"}  # weighted hands them to every term
        rewards, per_term = self.composed.score_terms(completions, **columns, **options)
        return Scores(rewards, dict(zip(self.labels, per_term)), per_term[self.index], self.threshold)
