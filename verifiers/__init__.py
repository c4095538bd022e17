"""Verifiers: reward functions keyed by config name.

Contract (TRL's reward-function contract): a verifier is a plain CPU function

    fn(completions: list[str], **columns) -> list[float | None]

``columns`` are the dataset row's columns as lists aligned with ``completions`` (for example
``answer=[...]``); extra keyword arguments are accepted and ignored. ``None`` means "skip this
sample". Verifiers work on their own, with no trainer.
"""
from __future__ import annotations

from typing import Callable

VerifierFn = Callable[..., "list[float | None]"]

_REGISTRY: dict[str, VerifierFn] = {}


def register_verifier(name: str):
    """Decorator: register ``fn`` under ``name``; registering a different function twice raises."""

    def deco(fn: VerifierFn) -> VerifierFn:
        old = _REGISTRY.get(name)
        if old is not None and old is not fn:
            raise ValueError(f"verifier {name!r} is already registered ({old.__module__}.{old.__name__})")
        _REGISTRY[name] = fn
        return fn

    return deco


def get_verifier(name: str) -> VerifierFn:
    """The verifier registered as ``name``, or for ``package.module:function`` that function (a reward of
    one's own without registering it: veRL's ``custom_reward_function.path``, TRL's callable rewards)."""
    if ":" in name:
        return _imported(name)
    _load_builtin()
    if name not in _REGISTRY:
        raise KeyError(f"unknown verifier {name!r}; registered: {', '.join(sorted(_REGISTRY))} "
                       f"(or module.path:function)")
    return _REGISTRY[name]


def _imported(spec: str) -> VerifierFn:
    import importlib

    module, _, attr = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise KeyError(f"verifier {spec!r}: cannot import {attr!r} from {module!r} ({e})") from None
    if not callable(fn):
        raise KeyError(f"verifier {spec!r}: {module}.{attr} is not callable")
    return fn


def list_verifiers() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def _load_builtin() -> None:
    # Importing the modules runs their @register_verifier decorators.
    from verifiers import builtin  # noqa: F401
