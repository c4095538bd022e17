"""Shared fixtures. Tests that need ../shared/data skip with the reason when it is absent."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from core import paths  # noqa: E402

try:  # property tests draw the same examples every run: CI never flakes on a new random case
    from hypothesis import settings

    settings.register_profile("repeatable", derandomize=True, print_blob=True)
    settings.load_profile("repeatable")
except ImportError:  # hypothesis is a dev extra
    pass


@pytest.fixture(scope="session")
def shared_data():
    """Path of the real data folder (../shared/data or $RLR_DATA_DIR); skips when it is missing."""
    d = paths.data_dir()
    if not d.is_dir():
        pytest.skip(f"real data not found at {d} (set RLR_DATA_DIR to the shared data folder)")
    return d
