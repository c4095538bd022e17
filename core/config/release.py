"""Which framework release's defaults a recipe takes (``source.defaults``), applied in the pipeline before the scale
(core/config/pipeline.py ``prepare``).

A recipe file of a source framework sets some values and leaves the rest to the framework's defaults, which change
between releases (Open-R1's YAMLs: TRL 0.16's ``temperature`` 0.9 and ``top_k`` 50 became 1.0 and None in 0.18). A
recipe is written with the defaults of ``source.release`` (the release its source pins today); ``source.defaults=
written`` gives it those of ``source.written_release`` instead, the release pinned when the file was written, as the
recipe lists them in ``source.written_overrides`` (``key=value``, the values in YAML; a list, so a recipe that extends
another replaces it whole). Keys typed on the command line stay the user's, as under the scale."""
from __future__ import annotations

import yaml
from omegaconf import DictConfig, OmegaConf

from core.config.validate import refuse


def with_source_defaults(cfg: DictConfig, keep: tuple[str, ...] = ()) -> DictConfig:
    """``cfg`` with ``source.written_overrides`` applied when ``source.defaults`` is ``written`` (in place; ``keep``:
    the keys set on the command line, left as typed). A malformed entry or an unknown key is refused, naming it."""
    src = cfg.get("source")
    if src is None or src.defaults != "written":
        return cfg
    bad = []
    for entry in src.written_overrides:
        key, eq, text = str(entry).partition("=")
        if not eq or OmegaConf.select(cfg, key, default="<absent>") == "<absent>":
            bad.append(f"source.written_overrides entry {entry!r}: expected key=value with a key of the config")
        elif key not in keep:
            OmegaConf.update(cfg, key, yaml.safe_load(text), merge=False)
    if bad:
        refuse(bad)
    return cfg
