"""Compose the real configs (conf/) with overrides, as recipes/run.py does, without running Hydra."""
from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from core.paths import CONF_DIR, PROJECT_ROOT

# Tiny models on 2 shared cores: one intra-op thread is several times faster than two under load.
torch.set_num_threads(1)

if not OmegaConf.has_resolver("root"):
    OmegaConf.register_new_resolver("root", lambda: str(PROJECT_ROOT))


@pytest.fixture
def compose_cfg():
    """``compose_cfg(*overrides)`` -> the composed primary config."""

    def _compose(*overrides: str):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name="config", overrides=list(overrides))

    yield _compose
    GlobalHydra.instance().clear()
