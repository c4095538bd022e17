"""Compose the real configs (conf/) with overrides, as recipes/run.py does, without running Hydra."""
from __future__ import annotations

import pytest
import torch
from hydra.core.global_hydra import GlobalHydra

from core.config.composition import compose

# Tiny models on 2 shared cores: one intra-op thread is several times faster than two under load.
torch.set_num_threads(1)


@pytest.fixture
def compose_cfg():
    """``compose_cfg(*overrides)`` -> the composed primary config."""

    def _compose(*overrides: str):
        GlobalHydra.instance().clear()
        return compose(list(overrides))

    yield _compose
    GlobalHydra.instance().clear()
