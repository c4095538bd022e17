"""``make gpu-check`` (bench/gpu_check.py): its whole run on the CPU with tiny shapes (every part, one ZeRO mode; all
three in the slow variant; the real one on a CUDA machine), and in process: parts that fail or would not fit are
recorded, the record is saved after every part, and a config that cannot be predicted is a failed row with its
error."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from core.paths import PROJECT_ROOT

PHASES = ("generate", "logprobs", "update", "score")
# a row of the measured-against-predicted table with a number in each of measured, plan and plan / measured
ROW = re.compile(r"^\| (\w+) \| ([\w ]+) \| ([\d,.]+) \| (?:-|[\d,.]+) \| ([\d,.]+) \| (?:-|[\d,.]+) \| ([\d,.]+) \|$",
                 re.M)


def _gpu_check(tmp_path, **env) -> tuple[dict, str]:
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "bench.gpu_check", "--out", str(out)], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, env={**os.environ, **env}, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "gpu_check.json").read_text()), (out / "gpu_check.md").read_text()


def _assert_calibration_file(tmp_path, data: dict) -> None:
    """The runs of ``recipes.run`` are written in the planner's calibration schema too (gpu_measured.json), which
    bench/plan_gpu.py reads as it reads bench/gpu_measured.json: every measured phase and peak gets a prediction."""
    from bench import plan_gpu

    cal = plan_gpu.load(tmp_path / "out" / "gpu_measured.json")
    runs = [n for n, c in data["configs"].items() if c["part"] != "trl"]
    assert [r["name"] for r in cal["runs"]] == runs and cal["device"]["name"] == data["device"]["name"]
    rows = plan_gpu.rows(cal)
    assert len(rows) == len(runs) * (len(PHASES) + 1), rows  # each phase and the peak of each run
    assert all(r["measured"] > 0 and r["predicted"] > 0 for r in rows), rows


def _assert_complete(data: dict, md: str, zeros: list[str]) -> None:
    """Every part ran; every config has its measured and predicted figures, in the JSON and in the table."""
    names = [f"zero_{z}" for z in zeros]
    assert list(data["parts"]) == ["predictions", "packed_vs_padded", *names, "long_completion", "trl"]
    assert {n: p["status"] for n, p in data["parts"].items()} == dict.fromkeys(data["parts"], "ok"), md
    assert list(data["configs"]) == [*names, "long_completion", "trl_ours"]
    for name, c in data["configs"].items():
        m, p = c["measured"], c["predicted"]
        assert set(m["phase_seconds"]) == set(PHASES) and all(v > 0 for v in m["phase_seconds"].values()), name
        assert m["peak_bytes"] > 0 and m["steps"] >= 1 and c["overrides"], name
        assert p["probe"]["peak_bytes"] > 0 and p["plan"]["per_gpu_bytes"] > 0 and p["plan"]["step_seconds"] > 0
        assert set(PHASES) <= set(p["plan"]["phase_seconds"]), name
        assert set(c["ratios"]) == {*PHASES, "step", "probe_peak", "plan_peak"}, name
    rows = ROW.findall(md)
    assert len(rows) == 6 * len(data["configs"]), md  # 4 phases, the step, the peak
    assert {r[0] for r in rows} == set(data["configs"])
    long = data["parts"]["long_completion"]["result"]
    assert long["exit_code"] == 75 and long["requeue"]["signal"] == "SIGTERM"
    assert long["checkpoint"] == f"checkpoint-{long['requeue']['step']}" and long["checkpoint"] in md
    assert data["parts"]["packed_vs_padded"]["result"]["failure"] is None
    assert data["parts"]["trl"]["result"]["ratio"] > 0 and "ours/TRL" in md
    assert data["versions"]["torch"] and data["versions"]["trl"] and data["commit"]["sha"] and data["date"]
    assert data["device"]["name"] in md and data["commit"]["sha"] in md


def test_gpu_check_runs_every_part_on_the_cpu(tmp_path):
    """Each part at its smallest: one ZeRO mode, one measured step, 16 new tokens (about 50 s on an idle 2-core
    machine)."""
    data, md = _gpu_check(tmp_path, GPU_SMOKE_DEVICE="cpu", GPU_SMOKE_SHAPES="tiny", GPU_SMOKE_ZERO="none")
    _assert_complete(data, md, ["none"])
    _assert_calibration_file(tmp_path, data)


@pytest.mark.slow
def test_gpu_check_runs_the_three_zero_modes_on_the_cpu(tmp_path):
    data, md = _gpu_check(tmp_path, GPU_SMOKE_DEVICE="cpu", GPU_SMOKE_SHAPES="tiny")
    _assert_complete(data, md, ["none", "stage2", "stage3"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_check(tmp_path):
    data, md = _gpu_check(tmp_path)
    _assert_complete(data, md, ["none", "stage2", "stage3"])
    assert data["elapsed_s"] < 480 and data["configs"]["zero_none"]["measured"]["mfu"] > 0


# ----------------------------------------------------------------------------- in process
def _report(tmp_path, parts: dict[str, float], configs: dict | None = None):
    from bench import gpu_check as G
    from bench.gpu_check_report import Report, environment

    meta = {**environment("cpu"), "mode": "test", "deadline_s": 9.0}
    configs = configs if configs is not None else G.configs(G.SIZES["tiny"])
    return Report(tmp_path, meta, parts, configs)


def test_failed_and_skipped_parts_are_recorded_and_the_record_is_saved_after_each(tmp_path):
    from bench.gpu_check import Context, Part, run_parts

    now = [0.0]
    seen = {}

    def ok(ctx, timeout):
        now[0] += 3.0
        return {"timeout": timeout}

    def boom(ctx, timeout):
        seen.update(json.loads((tmp_path / "gpu_check.json").read_text())["parts"])  # as saved before this part
        now[0] += 1.0
        raise RuntimeError("the device fell over")

    def bad(ctx, timeout):
        return {"failure": "packed and padded disagree"}

    todo = [Part("first", ok), Part("second", boom), Part("third", bad), Part("fourth", ok), Part("fifth", ok)]
    report = _report(tmp_path, {"first": 4, "second": 2, "third": 1, "fourth": 6, "fifth": 3}, {})
    run_parts(Context(report, None, tmp_path, "cpu", {}), todo, 9.0, lambda: now[0])
    parts = json.loads((tmp_path / "gpu_check.json").read_text())["parts"]
    assert seen["first"]["status"] == "ok" and seen["second"]["status"] == "pending"
    assert [p["status"] for p in parts.values()] == ["ok", "failed", "failed", "skipped", "ok"]
    assert parts["first"]["result"] == {"timeout": 8.0}  # twice its budget, inside the deadline
    assert parts["fifth"]["result"] == {"timeout": 5.0}  # what is left before the deadline
    assert "RuntimeError: the device fell over" in parts["second"]["error"]
    assert parts["third"]["error"] == "packed and padded disagree"
    assert parts["fourth"]["reason"] == "would not fit: 4 s elapsed + 6 s budget > 9 s deadline"
    md = (tmp_path / "gpu_check.md").read_text()
    assert md.count("| skipped |") == 1 and md.count("| failed |") == 2 and "would not fit" in md


def test_a_config_that_cannot_be_predicted_is_a_failed_row_with_its_error(tmp_path):
    from bench.gpu_check import Context, predictions

    report = _report(tmp_path, {"predictions": 10}, {**_report(tmp_path, {}).configs,
                                                      "unknown_model": {"part": "x", "overrides": ["model=nope"]}})
    result = predictions(Context(report, None, tmp_path, "NVIDIA B999", {}), 60.0)
    report.save()
    assert result["predicted"] == 0 and result["failed"] == list(report.configs)
    assert result["failure"].startswith(f"{len(report.configs)} of {len(report.configs)} predictions failed")
    for c in report.configs.values():
        assert "no conf/hardware profile for the device 'NVIDIA B999'" in c["predicted"]["error"]
    md = (tmp_path / "gpu_check.md").read_text()
    assert md.count("| prediction | - | failed | failed | - |") == len(report.configs)

    report = _report(tmp_path, {"predictions": 10}, {"unknown_model": report.configs["unknown_model"]})
    result = predictions(Context(report, None, tmp_path, "cpu", {}), 60.0)  # the planner's own error
    assert result["failed"] == ["unknown_model"] and "'model/nope'" in report.configs["unknown_model"]["predicted"]["error"]
