"""Range checks for the typed schema (core/config/schema.py): each field's ``check`` metadata is a function of
the value that returns what was expected, or None when the value fits. Registry names are looked up when
checked, so importing the schema imports no registry."""
from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any, Callable, Optional

Check = Callable[[Any], Optional[str]]  # value -> what was expected, or None when it fits


def at_least(lo: float, optional: bool = False) -> Check:
    return lambda v: None if (v is None and optional) or (v is not None and v >= lo) else \
        f"a number >= {lo}" + (" or null" if optional else "")


def above(lo: float, optional: bool = False) -> Check:
    return lambda v: None if (v is None and optional) or (v is not None and v > lo) else \
        f"a number > {lo}" + (" or null" if optional else "")


def between(lo: float, hi: float, hi_open: bool = False, optional: bool = False) -> Check:
    def check(v):
        if v is None and optional:
            return None
        return None if v is not None and lo <= v and (v < hi if hi_open else v <= hi) else \
            f"a number in [{lo}, {hi}{')' if hi_open else ']'}" + (" or null" if optional else "")
    return check


def one_of(*names) -> Check:
    return lambda v: None if v in names else f"one of {list(names)}"


def registered(module: str, attr: str) -> Check:
    """A name registered in ``module.attr``: a :class:`core.registry.Registry`, a collection of names or a function
    returning them, imported when checked, so importing the schema imports no registry. The check carries
    ``registry = "module:attr"``, so tests can tell which key picks from which registry."""
    def check(v):
        import importlib

        obj = getattr(importlib.import_module(module), attr)
        names = obj.names() if hasattr(obj, "names") else sorted(obj() if callable(obj) else obj)
        return None if v in names else f"one of {names}"
    check.registry = f"{module}:{attr}"
    return check


def ck(default: Any = dataclasses.MISSING, check: Check | None = None, factory: Callable | None = None):
    """A schema field with a default (or ``factory``) and an optional range ``check``."""
    meta = {"check": check} if check else {}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


POS = at_least(1)
NONNEG = at_least(0)
OPT_POS = at_least(1, optional=True)
BOOL_OR_AUTO = one_of("auto", True, False)
