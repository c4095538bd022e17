"""Verifiers: reward functions keyed by config name (``verifier.name``; docs/verifiers.md lists them).

Contract (TRL's reward-function contract): a verifier is a plain CPU function

    fn(completions: list[str], **columns) -> list[float | None]

``columns`` are the dataset row's columns as lists aligned with ``completions`` (for example
``answer=[...]``); extra keyword arguments are accepted and ignored. ``None`` means "skip this
sample". Verifiers work on their own, with no trainer.

Every name is declared below with the function that implements it (:data:`VERIFIERS`, a
:class:`core.registry.Registry`), and a module is imported when one of its names is first asked for. A name
``package.module:function`` is that function, unregistered (TRL's callable rewards), and so is
``path/to/file.py:function``, loaded from the file (veRL's ``custom_reward_function.path`` and ``.name``; relative
to the project root, no ``PYTHONPATH`` needed). :data:`GOLDS` holds the gold-answer extractors evaluation sets grade against
(``sets.<name>.gold``): they take answers out of solutions as the verifiers do.

Dependencies run one way: this package uses nothing of ``core`` but the registry type, and ``core`` reaches it only
through these two registries (``from verifiers import VERIFIERS, GOLDS``; tests/test_plugins.py checks both).
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

from core.registry import Registry

VerifierFn = Callable[..., "list[float | None]"]


def kwargs_problems(name: str, kwargs: Mapping, key: str, kwargs_key: str, accuracy_key: str | None = None,
                    accuracy_term: str | None = None, sample: Mapping | None = None) -> list[str]:
    """The config problems of verifier ``name`` set at ``key`` with options ``kwargs`` set at ``kwargs_key``: a
    name that does not resolve, or an option the function takes no parameter for (unless it takes ``**columns``);
    with ``accuracy_key``, a reward whose accuracy term (``accuracy_term``, null: its one correctness term) is not
    there or not one (verifiers/correctness.py); with ``sample`` (a row of the data, once it is read), what a
    function of one's own does with it (verifiers/trial.py)."""
    try:
        fn = VERIFIERS.get(name)
    except (KeyError, ImportError, AttributeError, ValueError) as e:
        return [f"{key}={name!r}: {e.args[0] if e.args else e}"]
    params = inspect.signature(fn).parameters
    found = [] if any(p.kind is p.VAR_KEYWORD for p in params.values()) else \
        [f"{kwargs_key}.{k}: verifier {name} takes no {k!r} (it takes {', '.join(params)})"
         for k in kwargs or {} if k not in params]
    if accuracy_key and not found and not _unset(kwargs, "terms"):  # a required ??? is the schema check's to report
        from verifiers.correctness import accuracy_term as resolve

        try:
            resolve(name, kwargs, accuracy_term, accuracy_key)
        except (KeyError, TypeError, ValueError) as e:
            found.append(str(e.args[0] if e.args else e))
    if sample is not None and not found:
        from verifiers.trial import trial_problems

        found += trial_problems(name, kwargs or {}, key, kwargs_key, sample)
    return found


def _unset(kwargs: Mapping, key: str) -> bool:
    """``key`` of a config node left ``???`` (required, not given)."""
    from omegaconf import DictConfig, OmegaConf

    return isinstance(kwargs, DictConfig) and key in kwargs.keys() and OmegaConf.is_missing(kwargs, key)


VERIFIERS: Registry[VerifierFn] = Registry("verifier", check=kwargs_problems, paths=True)
# correct_above: a reward above it is a correct answer (verifiers/correctness.py, the accuracy the runs report); None:
# a format or shaping reward, no verdict on the answer. 0.99 for the fraction-of-tests rewards: every test passed.
# ``weighted`` has none of its own: its accuracy term's (verifier.accuracy_term).
VERIFIERS.declare("math", "verifiers.math:math_reward", correct_above=0.0)
VERIFIERS.declare("math_open_r1", "verifiers.math:math_open_r1_reward", correct_above=0.0)
VERIFIERS.declare("math_simplerl", "verifiers.math_sources:math_simplerl_reward", correct_above=0.0)
VERIFIERS.declare("math_tulu3", "verifiers.math_sources:math_tulu3_reward", correct_above=0.0)
VERIFIERS.declare("gsm8k", "verifiers.gsm8k:gsm8k_reward", correct_above=0.0)
VERIFIERS.declare("gsm8k_numeric", "verifiers.gsm8k:gsm8k_numeric_reward", correct_above=0.0)
VERIFIERS.declare("ifeval", "verifiers.ifeval:ifeval_reward", correct_above=0.0)
VERIFIERS.declare("format", "verifiers.format:format_reward", correct_above=None)
VERIFIERS.declare("code_format", "verifiers.format:code_format_reward", correct_above=None)
VERIFIERS.declare("tag_count", "verifiers.format:tag_count_reward", correct_above=None)
VERIFIERS.declare("reasoning_steps", "verifiers.format:reasoning_steps_reward", correct_above=None)
VERIFIERS.declare("cosine", "verifiers.format:cosine_reward", correct_above=0.0)
VERIFIERS.declare("repetition_penalty", "verifiers.format:repetition_penalty_reward", correct_above=None)
VERIFIERS.declare("soft_overlong_punishment", "verifiers.format:soft_overlong_punishment", correct_above=None)
VERIFIERS.declare("code", "verifiers.code:code_reward", correct_above=0.99)
VERIFIERS.declare("code_binary", "verifiers.code:code_binary_reward", correct_above=0.0)
VERIFIERS.declare("code_mbpp", "verifiers.code:code_mbpp_reward", correct_above=0.0)
VERIFIERS.declare("code_mbpp_fraction", "verifiers.code:code_mbpp_fraction_reward", correct_above=0.99)
VERIFIERS.declare("code_humaneval", "verifiers.code:code_humaneval_reward", correct_above=0.0)
VERIFIERS.declare("code_cpp", "verifiers.cpp:code_cpp_reward", correct_above=0.99)
VERIFIERS.declare("cf_code", "verifiers.codeforces:cf_code_reward", correct_above=0.99)
VERIFIERS.declare("weighted", "verifiers.compose:weighted")
VERIFIERS.declare("routed", "verifiers.compose:routed", correct_above=0.0)

# sets.<name>.gold -> fn(column value) -> the gold answer a verifier grades against (verifiers/golds.py).
GOLDS: Registry[Callable[[Any], Any]] = Registry("sets.<name>.gold")
GOLDS.declare("as_is", "verifiers.golds:as_is")
GOLDS.declare("gsm8k_label", "verifiers.golds:gsm8k_label")
GOLDS.declare("minerva_boxed", "verifiers.golds:minerva_boxed")
GOLDS.declare("strip_dollars", "verifiers.golds:strip_dollars")


def register_verifier(name: str, correct_above: float | None = 0.0):
    """Decorator: register ``fn`` under ``name`` in this process (a name used twice for different functions
    raises); a module of one's own is imported before the run asks for it, or named ``module:function``.
    ``correct_above``: a reward above it is a correct answer (the runs' accuracy); None for a format reward."""
    return VERIFIERS.register(name, correct_above=correct_above)


def get_verifier(name: str) -> VerifierFn:
    """The verifier registered as ``name``, or for ``package.module:function`` that function; a miss raises a
    KeyError listing the registered names."""
    return VERIFIERS.get(name)


def list_verifiers() -> list[str]:
    return VERIFIERS.names()
