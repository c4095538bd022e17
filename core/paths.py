"""Where things live: the project root, the shared data folder, the local cache.

Relative paths in configs are resolved against the project root (the folder that holds ``conf/``),
never against the working directory, so ``python -m recipes.run`` behaves the same from anywhere.
"""
from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = PROJECT_ROOT / "conf"
# `../shared/data` beside the clone by default; RLR_DATA_DIR overrides (CI, clusters).
DEFAULT_DATA_DIR = os.environ.get("RLR_DATA_DIR", "../shared/data")
# The results table and run dirs (conf/config.yaml paths.results_dir; recipes.compare reads the same).
DEFAULT_RESULTS_DIR = os.environ.get("RLR_RESULTS_DIR", str(PROJECT_ROOT / "results"))
# Locally built tiny models and tokenizers are cached here (git-ignored).
DEFAULT_CACHE_DIR = os.environ.get("RLR_CACHE_DIR", ".cache")


def resolve(path: str | os.PathLike) -> Path:
    """Absolute path: ``~`` expanded, relative paths taken from the project root."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else (PROJECT_ROOT / p).resolve()


def data_dir() -> Path:
    return resolve(DEFAULT_DATA_DIR)


def cache_dir() -> Path:
    return resolve(DEFAULT_CACHE_DIR)
