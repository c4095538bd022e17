"""The one registry type: every plug-in a config string picks (estimators, losses, verifiers, rollout engines,
loops, shrinkers, layouts, sources) is a name in a :class:`Registry` (docs/extending.md).

An entry is either registered where it is defined, with a decorator (``@ADVANTAGES.register("grpo")``), or
declared by name with the ``module:attr`` that defines it (``ROLLOUT_ENGINES.declare("vllm",
"core.rollout.vllm:VLLMRollout")``), imported on its first :meth:`Registry.get`. :meth:`Registry.names` lists
both without importing anything, so an entry whose module needs a GPU package (vLLM) costs a run that does not
pick it nothing, and no entry depends on some other module having been imported first.

An entry may carry ``meta`` (facts config validation reads, e.g. ``min_group_size=2``) and a ``check``: a
function ``check(name, *args) -> list[str]`` returning the config problems of picking it, each naming the keys,
values and what was expected. :meth:`Registry.problems` runs the registry's own check (one for every entry) and
the entry's, so an engine's or a backend's checks live with the entry, not in the central validator. A check is
kept beside the declaration, so checking a lazy entry never imports its module. Duplicate names raise; a miss
lists the valid names (verl's ``register_policy_loss`` / ``get_policy_loss_fn`` do both).
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Optional, TypeVar

F = TypeVar("F", bound=Callable)
Check = Callable[..., "list[str]"]  # (name, *args) -> config problems of picking that entry


@dataclass
class _Entry:
    obj: Any = None  # the registered object; None for a declared entry until its first get
    target: str = ""  # a declared entry's "module:attr"
    check: Optional[Check] = None
    meta: dict = field(default_factory=dict)


class Registry(Generic[F]):
    """Objects keyed by config name. ``kind`` names what is picked (the config key, for messages); ``check``: run
    by :meth:`problems` for every entry; ``paths``: a name ``module:attr`` that is not an entry is imported as
    itself (a verifier of one's own without registering it: veRL's ``custom_reward_function.path``)."""

    def __init__(self, kind: str, check: Check | None = None, paths: bool = False):
        self.kind, self._check, self._paths = kind, check, paths
        self._entries: dict[str, _Entry] = {}

    def register(self, name: str, check: Check | None = None, **meta) -> Callable[[F], F]:
        """Decorator: the decorated object is entry ``name``."""

        def deco(obj: F) -> F:
            self._add(name, _Entry(obj=obj, check=check, meta=meta))
            return obj

        return deco

    def declare(self, name: str, target: str, check: Check | None = None, **meta) -> None:
        """Entry ``name`` is ``target`` (``"package.module:attr"``), imported on its first :meth:`get`."""
        if ":" not in target:
            raise ValueError(f"{self.kind} {name!r}: target {target!r} is not 'package.module:attr'")
        self._add(name, _Entry(target=target, check=check, meta=meta))

    def _add(self, name: str, entry: _Entry) -> None:
        old = self._entries.get(name)
        if old is not None and (old.obj is not entry.obj or old.target != entry.target):
            raise ValueError(f"{self.kind} {name!r} is already registered ({old.target or _where(old.obj)})")
        self._entries[name] = entry

    def get(self, name: str) -> F:
        """The entry ``name`` (a declared one imported now); a miss raises KeyError listing the names."""
        entry = self._entries.get(name)
        if entry is None:
            if self._paths and ":" in name:
                return _from_path(self.kind, name)
            raise KeyError(f"unknown {self.kind} {name!r}; registered: {', '.join(self.names())}"
                           + (" (or module.path:function, or path/to/file.py:function)" if self._paths else ""))
        if entry.obj is None:
            module, _, attr = entry.target.partition(":")
            entry.obj = getattr(importlib.import_module(module), attr)
        return entry.obj

    def meta(self, name: str) -> dict:
        """What entry ``name`` was registered or declared with (nothing is imported)."""
        if name not in self._entries:
            self.get(name)  # raises the miss (a path entry has no meta)
            return {}
        return self._entries[name].meta

    def problems(self, name: str, *args, **kwargs) -> list[str]:
        """The config problems of picking ``name``: the registry's check, then the entry's, each called as
        ``check(name, *args, **kwargs)``. A name that is not an entry gets the registry's check alone."""
        entry = self._entries.get(name)
        checks = [c for c in (self._check, entry.check if entry else None) if c is not None]
        return [p for c in checks for p in c(name, *args, **kwargs)]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries


def _where(obj) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', obj)}"


def _from_path(kind: str, spec: str):
    """``module:attr`` imported, or ``path/to/file.py:attr`` loaded from that file (relative to the project root,
    like the data paths; no ``PYTHONPATH`` needed). Failures are KeyErrors naming the spec (config input, not a
    bug)."""
    module, _, attr = spec.rpartition(":")
    try:
        obj = getattr(_load_file(module) if module.endswith(".py") else importlib.import_module(module), attr)
    except ModuleNotFoundError as e:
        raise KeyError(f"{kind} {spec!r}: no module {e.name!r} on the import path; give the file instead "
                       f"(path/to/{module.rsplit('.', 1)[-1]}.py:{attr}, relative to the project root), or put its "
                       f"folder on PYTHONPATH") from None
    except (ImportError, AttributeError, OSError, SyntaxError) as e:
        raise KeyError(f"{kind} {spec!r}: cannot import {attr!r} from {module!r} ({e})") from None
    if not callable(obj):
        raise KeyError(f"{kind} {spec!r}: {module}.{attr} is not callable")
    return obj


def _load_file(path: str):
    """The module of a ``.py`` file, loaded once per file (kept in ``sys.modules`` under a name made from its
    absolute path, so a second lookup returns the same functions)."""
    from core.paths import resolve

    file = resolve(path)
    if not file.is_file():
        raise OSError(f"no such file {file}")
    name = "_rlr_file_" + "".join(c if c.isalnum() else "_" for c in str(file))
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


def installed(package: str) -> bool:
    """``package`` can be imported here (an entry's GPU-only dependency: vllm), found without
    importing it."""
    return importlib.util.find_spec(package) is not None
