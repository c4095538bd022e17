"""A reward function of one's own (``verifier.name=path/to/file.py:fn`` or ``package.module:fn``, or such a term of a
``weighted`` sum) tried once on a stand-in sample before any model is built: its signature bound to what the RL loop
passes, then one call, then its result checked, so a function that does not keep the contract fails in a second with
a message naming the function, its signature and the call, instead of a bare ``TypeError`` after the model is built.

The contract (verifiers/__init__.py, TRL's reward functions: ``trl/rewards/accuracy_rewards.py``): the loop calls
``fn(completions, **columns, **options)`` with ``completions`` a list of strings and each dataset column but the
prompt as a keyword list aligned with them (``answer=[...]``), plus ``verifier.kwargs``; it returns one
``float | None`` per completion (None: skipped). The stand-in sample is the first row of the split the function
scores, with its gold answer as the completion (recipes/rl_rewards.py ``score`` passes the same columns).
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

from verifiers import get_verifier

CONTRACT = ("the contract (TRL's reward functions): fn(completions, **columns) -> list[float | None], one score per "
            "completion; take **kwargs for the columns and options you do not use")


def own_functions(name: str, kwargs: Mapping, key: str, kwargs_key: str) -> list[tuple[str, Callable, dict, bool]]:
    """``(where it is set, function, the options it gets, whether they merge into the columns)`` of each function of
    one's own that the reward ``name`` calls: itself (its options beside the columns: a clash is a TypeError), or the
    terms of a ``weighted`` sum and the routes of a ``routed`` one (their own options over the columns and the sum's
    other options, verifiers/compose.py). The project's own verifiers (``verifiers.*``) are not tried: their tests
    hold them to the contract."""
    from verifiers.compose import _route, routed
    from verifiers.correctness import weighted_terms

    fn, kwargs = get_verifier(name), dict(kwargs or {})
    if _own(fn):
        return [(f"{key}={name}", fn, kwargs, False)]
    if fn is routed:
        shared = {k: v for k, v in kwargs.items() if k not in ("routes", "route_column", "scale")}
        routes = [(tag, *_route(tag, spec)) for tag, spec in (kwargs.get("routes") or {}).items()]
        return [(f"{kwargs_key}.routes.{tag}={route}", get_verifier(route), {**shared, **options}, True)
                for tag, route, options in routes if _own(get_verifier(route))]
    shared = {k: v for k, v in kwargs.items() if k != "terms"}
    return [(f"{kwargs_key}.terms[{i}].name={t.name}", get_verifier(t.name), {**shared, **t.kwargs}, True)
            for i, t in enumerate(weighted_terms(name, kwargs) or []) if _own(get_verifier(t.name))]


def _own(fn) -> bool:
    module = getattr(fn, "__module__", None) or ""
    return not (module == "verifiers" or module.startswith("verifiers."))


def trial_problems(name: str, kwargs: Mapping, key: str, kwargs_key: str, row: Mapping) -> list[str]:
    """The problems of each function of one's own in reward ``name`` (set at ``key``, options at ``kwargs_key``)
    called once on the stand-in ``row`` (a row of the split it scores, as the loop holds it)."""
    columns = {k: [v] for k, v in row.items() if k != "prompt"}
    completions = [str(row.get("answer", ""))]
    return [p for where, fn, options, merged in own_functions(name, kwargs, key, kwargs_key)
            for p in (_tried(where, fn, completions, {**columns, **options}, {}) if merged else
                      _tried(where, fn, completions, columns, options))]


def _tried(where: str, fn: Callable, completions: list[str], columns: dict, options: dict) -> list[str]:
    label = getattr(fn, "__qualname__", repr(fn))
    try:
        signature = f"{label}{inspect.signature(fn)}"
    except (TypeError, ValueError):  # a builtin or C callable: no signature to show
        signature = label
    call = _call_text(label, completions, {**columns, **options})
    clash = sorted(set(columns) & set(options))
    if clash:
        return [f"{where}: its options {clash} are also columns of the data, and {label} would get both; rename the "
                f"option or the column"]
    try:
        inspect.signature(fn).bind(completions, **columns, **options)
    except TypeError as e:
        return [f"{where}: {signature} cannot take what the loop passes, {call}: {e}; {CONTRACT}"]
    except ValueError:
        pass
    try:
        out = fn(completions, **columns, **options)
    except Exception as e:  # any failure of the user's code on a well-formed call is its to fix: named, not raised
        return [f"{where}: {signature} raised {type(e).__name__}: {e} when called on a stand-in sample, {call} "
                f"(row 0 of the data, its answer as the completion)"]
    problem = _result_problem(out)
    return [f"{where}: {signature} returned {problem} when called as {call}; {CONTRACT}"] if problem else []


def _call_text(label: str, completions: list[str], keywords: dict[str, Any]) -> str:
    shown = ", ".join(f"{k}={v!r}"[:60] for k, v in keywords.items())
    return f"{label}({completions!r}{', ' if shown else ''}{shown})"


def _result_problem(out) -> str | None:
    """What is wrong with ``out`` as the scores of one completion, or None."""
    if isinstance(out, (str, bytes, Mapping)) or not hasattr(out, "__iter__"):
        return f"{out!r} (a {type(out).__name__}), expected a list of one score per completion"
    scores = list(out)
    if len(scores) != 1:
        return f"{len(scores)} scores for 1 completion ({scores[:4]!r})"
    score = scores[0]
    if score is None:
        return None
    if isinstance(score, (str, bytes)):
        return f"[{score!r}]: a {type(score).__name__}, expected a float or None"
    try:
        float(score)
    except (TypeError, ValueError):
        return f"[{score!r}]: a {type(score).__name__}, expected a float or None"
    return None
