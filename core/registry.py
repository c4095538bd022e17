"""A tiny name -> function registry shared by advantages, losses, KL estimators and aggregations."""
from __future__ import annotations

from typing import Callable, Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """Functions keyed by config name. Duplicate names raise; a miss lists the valid names."""

    def __init__(self, kind: str):
        self.kind = kind
        self._fns: dict[str, F] = {}
        self._meta: dict[str, dict] = {}

    def register(self, name: str, **meta) -> Callable[[F], F]:
        """Decorator; ``meta`` holds facts config validation needs (e.g. ``min_group_size=2``)."""

        def deco(fn: F) -> F:
            if name in self._fns and self._fns[name] is not fn:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._fns[name] = fn
            self._meta[name] = meta
            return fn

        return deco

    def get(self, name: str) -> F:
        if name not in self._fns:
            raise KeyError(f"unknown {self.kind} {name!r}; registered: {', '.join(sorted(self._fns))}")
        return self._fns[name]

    def meta(self, name: str) -> dict:
        self.get(name)
        return self._meta[name]

    def names(self) -> list[str]:
        return sorted(self._fns)

    def __contains__(self, name: str) -> bool:
        return name in self._fns
