"""Token ids in the config checked against the model's vocabulary before any model is built: every key named
``*_id`` or ``*_ids`` holding whole numbers (``rollout.stop_token_ids``, a verifier option such as
``verifier.kwargs.eos_id``, ...) must be an id of the vocabulary the run's model has, read from its local
``config.json`` or, for the tiny model, from what it is built with (core/models/loading.py ``vocabulary``). An id
outside it is never generated, so a stop id beyond the vocabulary would train without a word. A hub name's
vocabulary is not known before it is fetched: its ids are left to the run.
"""
from __future__ import annotations

import json
from pathlib import Path

from omegaconf import OmegaConf

from core.models.loading import vocabulary

SUFFIXES = ("_id", "_ids")


def token_ids(node, prefix: str = "") -> list[tuple[str, object]]:
    """``(key, value)`` of every ``*_id`` / ``*_ids`` key under ``node`` (a config, or the plain dicts and lists of
    one) whose value is a whole number or a list holding one."""
    if OmegaConf.is_config(node):  # unresolved: ids are typed values, and ${hydra:...} resolves only in a job
        node = OmegaConf.to_container(node, resolve=False, throw_on_missing=False)
    found = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, value in items:
        key = f"{prefix}{k}" if isinstance(node, dict) else f"{prefix.rstrip('.')}[{k}]"
        if str(k).endswith(SUFFIXES) and _holds_int(value):
            found.append((key, value))
        elif isinstance(value, (dict, list)):
            found += token_ids(value, f"{key}.")
    return found


def _holds_int(value) -> bool:
    def whole(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)
    return whole(value) or (isinstance(value, list) and bool(value) and all(whole(v) for v in value))


def checked_ids(cfg, typed: tuple[str, ...]) -> list[tuple[str, object]]:
    """The token ids of ``cfg`` to check: all of them at ``scale=full``; under another scale only those ``typed`` on
    the command line. A recipe's ids name tokens of the model it names, and ``scale=tiny`` swaps that model for a tiny
    one with a character tokenizer and keeps them (the tiny model never generates them): they are checked at full
    scale, against the recipe's model."""
    ids = token_ids(cfg)
    if OmegaConf.select(cfg, "scale.name", default="full") == "full":
        return ids
    return [(key, v) for key, v in ids if any(key == t or key.startswith((f"{t}.", f"{t}[")) for t in typed)]


def token_id_problems(cfg, typed: tuple[str, ...] = ()) -> list[str]:
    """Every token id of ``cfg`` (:func:`checked_ids`, ``typed``: the keys set on the command line) outside
    ``[0, vocab_size)`` of the run's model, and of a local model dir's own
    ``config.json`` and ``generation_config.json`` (a pad or EOS id edited past the vocabulary) at or above it,
    naming the key, the ids and the vocabulary and where it was read."""
    ids = checked_ids(cfg, typed)
    vocab = vocabulary(cfg.model)
    if vocab is None:
        return []
    size, where = vocab
    errors = []
    for key, value in ids + _model_file_ids(cfg.model.name_or_path):
        values = value if isinstance(value, list) else [value]
        bad = [v for v in values if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < size]
        if bad:
            errors.append(f"{key}={value}: expected token ids in [0, {size}), the vocabulary of {where}; "
                          f"{', '.join(map(str, bad))} {'is' if len(bad) == 1 else 'are'} outside it (ids of "
                          f"another model's tokenizer?)")
    return errors


def _model_file_ids(name_or_path) -> list[tuple[str, object]]:
    """``(file: key, value)`` of the token ids a local model dir's config files set, those at or above 0 (some
    released configs write -1 for "none")."""
    d = Path(str(name_or_path or "")).expanduser()
    if not name_or_path or not d.is_dir():
        return []
    found = []
    for name in ("config.json", "generation_config.json"):
        try:
            data = json.loads((d / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):  # absent, or unreadable: model_source_problem names the config
            continue
        found += [(f"{d / name}: {key}", value) for key, value in token_ids(data)
                  if all(v >= 0 for v in (value if isinstance(value, list) else [value]))]
    return found


def tokenizer_problem(model_cfg, tokenizer) -> str | None:
    """A tokenizer with more tokens than the model has embeddings (another model's tokenizer beside the weights): its
    top ids would index past the embedding table. Checked once the tokenizer is loaded, before the model."""
    vocab = vocabulary(model_cfg)
    if vocab is None or len(tokenizer) <= vocab[0]:
        return None
    return (f"model.name_or_path={model_cfg.name_or_path}: its tokenizer has {len(tokenizer)} tokens but the model's "
            f"vocabulary ({vocab[1]}) has {vocab[0]}; expected a tokenizer of at most {vocab[0]} tokens (the one "
            f"saved with the model)")
