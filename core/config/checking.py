"""The schema check (core/config/schema.py holds the schemas): every key of a composed config against its dataclass,
unknown keys with the nearest valid names, every value against its field's range check. The first check every loop
runs, before any model (core/config/pipeline.py ``prepare``, through core/config/validate.py ``problems``)."""
from __future__ import annotations

import dataclasses
import difflib

from omegaconf import DictConfig, ListConfig, OmegaConf

from core.config.schema import Config


def check_schema(cfg, root: type = Config, prefix: str = "") -> list[str]:
    """Every unknown key (with the nearest valid names) and every value out of its range in ``cfg`` (schema
    ``root``, keys named from ``prefix``), a composed ``DictConfig`` whose nodes carry their schema types."""
    errors: list[str] = []
    _walk(cfg, root, prefix, errors)
    return errors


def nearest_keys(key: str, schema: type) -> list[str]:
    """Up to three keys of ``schema`` (a dataclass) spelt most like ``key``."""
    return difflib.get_close_matches(key, [f.name for f in dataclasses.fields(schema)], n=3, cutoff=0.5)


def _walk(node, schema: type | None, prefix: str, errors: list[str]) -> None:
    if not isinstance(node, DictConfig):
        return
    if schema is None or not dataclasses.is_dataclass(schema):
        _unset(node, prefix, errors)
        return
    fields = {f.name: f for f in dataclasses.fields(schema)}
    for key in node.keys():
        path = f"{prefix}{key}"
        if key not in fields:
            near = nearest_keys(str(key), schema)
            hint = f"did you mean {' or '.join(prefix + n for n in near)}?" if near else \
                f"valid keys here: {', '.join(fields)}"
            errors.append(f"{path}: unknown key ({schema.__name__}); {hint}")
            continue
        if OmegaConf.is_missing(node, key):  # a required field (its group's YAML is its home) left as ???
            errors.append(f"{path}: required and not set (???); every option of its group sets it, or give "
                          f"{path}=VALUE")
            continue
        value = node._get_node(key)
        if isinstance(value, DictConfig):
            sub = OmegaConf.get_type(value)
            _walk(value, sub if dataclasses.is_dataclass(sub) else None, path + ".", errors)
            continue
        check = fields[key].metadata.get("check")
        if check is None:
            continue
        raw = OmegaConf.to_container(value, resolve=True) if isinstance(value, ListConfig) else node[key]
        problem = check(raw)
        if problem is not None:
            errors.append(f"{path}={raw!r}: expected {problem}")


def _unset(node: DictConfig, prefix: str, errors: list[str]) -> None:
    """In a free-form node (a verifier's ``kwargs``): every value a config left for the user to set (``???``)."""
    for key in node.keys():
        if OmegaConf.is_missing(node, key):
            errors.append(f"{prefix}{key}: required and not set (???); give {prefix}{key}=VALUE")
        elif isinstance(node._get_node(key), DictConfig):
            _unset(node._get_node(key), f"{prefix}{key}.", errors)
