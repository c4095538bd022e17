"""``memory/peak_mb`` is each step's peak (core/reporting/metrics.py), not the process's since it started."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from core.reporting import metrics


def _step(alloc_mb: int) -> dict[str, float]:
    metrics.reset_peak_memory()
    if alloc_mb:
        x = torch.ones(alloc_mb * 2**20 // 4)  # every page written, so resident
        del x
    return metrics.peak_memory()


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="per-step CPU peak needs Linux /proc")
def test_a_step_without_the_large_tensor_reports_a_lower_peak():
    first, second = _step(512), _step(0)
    assert first["memory/peak_mb"] - second["memory/peak_mb"] > 400, (first, second)


def test_a_cpu_peak_that_cannot_be_reset_is_named_since_start(monkeypatch, tmp_path):
    monkeypatch.setattr(metrics, "_CLEAR_REFS", tmp_path / "missing" / "clear_refs")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    metrics.reset_peak_memory()
    assert list(metrics.peak_memory()) == ["memory/peak_since_start_mb"]
