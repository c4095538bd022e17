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


def kwargs_problems(name: str, kwargs: Mapping, key: str, kwargs_key: str) -> list[str]:
    """The config problems of verifier ``name`` set at ``key`` with options ``kwargs`` set at ``kwargs_key``: a
    name that does not resolve, or an option the function takes no parameter for (unless it takes ``**columns``)."""
    try:
        fn = VERIFIERS.get(name)
    except (KeyError, ImportError, AttributeError, ValueError) as e:
        return [f"{key}={name!r}: {e.args[0] if e.args else e}"]
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return []
    return [f"{kwargs_key}.{k}: verifier {name} takes no {k!r} (it takes {', '.join(params)})"
            for k in kwargs or {} if k not in params]


VERIFIERS: Registry[VerifierFn] = Registry("verifier", check=kwargs_problems, paths=True)
VERIFIERS.declare("math", "verifiers.math:math_reward")
VERIFIERS.declare("math_open_r1", "verifiers.math:math_open_r1_reward")
VERIFIERS.declare("math_simplerl", "verifiers.math_sources:math_simplerl_reward")
VERIFIERS.declare("math_tulu3", "verifiers.math_sources:math_tulu3_reward")
VERIFIERS.declare("gsm8k", "verifiers.gsm8k:gsm8k_reward")
VERIFIERS.declare("gsm8k_numeric", "verifiers.gsm8k:gsm8k_numeric_reward")
VERIFIERS.declare("ifeval", "verifiers.ifeval:ifeval_reward")
VERIFIERS.declare("format", "verifiers.format:format_reward")
VERIFIERS.declare("code_format", "verifiers.format:code_format_reward")
VERIFIERS.declare("tag_count", "verifiers.format:tag_count_reward")
VERIFIERS.declare("reasoning_steps", "verifiers.format:reasoning_steps_reward")
VERIFIERS.declare("cosine", "verifiers.format:cosine_reward")
VERIFIERS.declare("repetition_penalty", "verifiers.format:repetition_penalty_reward")
VERIFIERS.declare("soft_overlong_punishment", "verifiers.format:soft_overlong_punishment")
VERIFIERS.declare("code", "verifiers.code:code_reward")
VERIFIERS.declare("code_binary", "verifiers.code:code_binary_reward")
VERIFIERS.declare("code_mbpp", "verifiers.code:code_mbpp_reward")
VERIFIERS.declare("code_mbpp_fraction", "verifiers.code:code_mbpp_fraction_reward")
VERIFIERS.declare("code_humaneval", "verifiers.code:code_humaneval_reward")
VERIFIERS.declare("code_cpp", "verifiers.cpp:code_cpp_reward")
VERIFIERS.declare("cf_code", "verifiers.codeforces:cf_code_reward")
VERIFIERS.declare("weighted", "verifiers.compose:weighted")
VERIFIERS.declare("routed", "verifiers.compose:routed")

# sets.<name>.gold -> fn(column value) -> the gold answer a verifier grades against (verifiers/golds.py).
GOLDS: Registry[Callable[[Any], Any]] = Registry("sets.<name>.gold")
GOLDS.declare("as_is", "verifiers.golds:as_is")
GOLDS.declare("gsm8k_label", "verifiers.golds:gsm8k_label")
GOLDS.declare("minerva_boxed", "verifiers.golds:minerva_boxed")
GOLDS.declare("strip_dollars", "verifiers.golds:strip_dollars")


def register_verifier(name: str):
    """Decorator: register ``fn`` under ``name`` in this process (a name used twice for different functions
    raises); a module of one's own is imported before the run asks for it, or named ``module:function``."""
    return VERIFIERS.register(name)


def get_verifier(name: str) -> VerifierFn:
    """The verifier registered as ``name``, or for ``package.module:function`` that function; a miss raises a
    KeyError listing the registered names."""
    return VERIFIERS.get(name)


def list_verifiers() -> list[str]:
    return VERIFIERS.names()
