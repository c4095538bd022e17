"""``logger.wandb``: metrics and sample tables mirrored to a Weights & Biases run, offline (no network), one
W&B run per run dir so a resume continues it."""
from __future__ import annotations

import json

import pytest

from core.config import schema
from core.reporting.metrics import MetricsWriter

pytest.importorskip("wandb")


def test_offline_wandb_gets_the_metrics_and_samples_and_a_resume_continues_its_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = schema.node(schema.WandbConfig, enabled=True, mode="offline")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    writer = MetricsWriter(run_dir, tensorboard=False, wandb=cfg, config=schema.node(schema.LoggerConfig))
    writer.log(1, {"reward/mean": 0.25, "loss": float("nan")})
    writer.samples(1, [{"prompt": "12+30=", "completion": "\\boxed{42}", "reward": 1.0}])
    writer.close()
    writer = MetricsWriter(run_dir, tensorboard=False, wandb=cfg, config={})  # the resume of the same dir
    writer.log(2, {"reward/mean": 0.5})
    writer.close()
    runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and len({r.name.rsplit("-", 1)[1] for r in runs}) == 1  # one W&B run id
    log = b"".join(r.joinpath(f"run-{r.name.rsplit('-', 1)[1]}.wandb").read_bytes() for r in runs)
    assert b"reward/mean" in log
    tables = list(runs[0].glob("files/media/table/samples_1_*.table.json"))
    assert len(tables) == 1
    table = json.loads(tables[0].read_text())
    assert table["columns"] == ["completion", "prompt", "reward", "step"]
    assert table["data"] == [["\\boxed{42}", "12+30=", "1.0", "1"]]
