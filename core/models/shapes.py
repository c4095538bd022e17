"""The architecture of each checkpoint the recipes name, kept here: ``config.json`` shape fields by hub name.

There is no model hub on a CPU box or a cluster's login node, yet ``python -m recipes.probe`` builds every recipe's
models at their real shapes. ``hub_configs/<org>--<name>.json`` holds each checkpoint's ``config.json`` fields that
set its shape and memory (``hidden_size``, ``intermediate_size``, ``num_hidden_layers``, ``num_attention_heads``,
``num_key_value_heads``, ``vocab_size``, ``tie_word_embeddings``, ``max_position_embeddings``, ``rope_theta``,
``rms_norm_eps``, ``model_type``); ``_source`` says where the values come from.
"""
from __future__ import annotations

import json
from pathlib import Path

from core.errors import InputError

FOLDER = Path(__file__).with_name("hub_configs")


def known() -> list[str]:
    """Hub names with a local config, sorted."""
    return sorted(p.stem.replace("--", "/", 1) for p in FOLDER.glob("*.json"))


def local_config(name: str, key: str = "model.name_or_path"):
    """The ``transformers`` config of hub checkpoint ``name`` from its local copy; ``key`` names the setting
    that asked for it in the error when there is none."""
    from transformers import AutoConfig

    path = FOLDER / f"{str(name).replace('/', '--', 1)}.json"
    if not path.exists():
        raise InputError(f"{key}={name}: no local config.json of that checkpoint; known: {', '.join(known())} "
                         f"(add core/models/hub_configs/{path.name} with its hub config.json fields)")
    fields = {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}
    return AutoConfig.for_model(fields.pop("model_type"), **fields)


def shape_config(model_cfg, path: str | None = None, key: str = "model.name_or_path"):
    """The config of the model ``model_cfg`` names (``path``, if given, instead of its ``name_or_path``): the local
    copy of a hub checkpoint's, or, for a locally built tiny model (no name), the one ``model.tiny`` builds."""
    path = model_cfg.name_or_path if path is None else path
    if path:
        return local_config(str(path), key)
    from core.models.loading import tiny_config

    return tiny_config(model_cfg)
