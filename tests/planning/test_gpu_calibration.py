"""``recipes.plan`` and ``recipes.probe`` against what a GPU measured for the same configs (bench/gpu_measured.json: the
H200 run of issue 36; ``make gpu-check`` writes its successor in the same schema, docs/planner.md "Calibration on a
GPU"). Every phase's seconds within 25%; the probe's per-GPU peak, what ``torch.cuda.max_memory_allocated`` reports,
within 10% and never under; the plan's total above it by what the allocator does not see.

The probe's reports of the runs are stored under tests/planning/reports/gpu (``python -m bench.plan_gpu --reports
tests/planning/reports/gpu --write`` rewrites them; a run the file changed is probed afresh); the slow test holds
them to a fresh probe.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import plan_gpu

DATA = plan_gpu.load()
REPORTS = Path(__file__).with_name("reports") / "gpu"


@pytest.fixture(scope="module")
def rows():
    return plan_gpu.rows(DATA, REPORTS)


def test_the_file_holds_measured_runs():
    """Counted, so the tests below cannot pass on an empty file: four runs, ten phase times, four peaks; the
    device, date and versions they ran with."""
    assert len(DATA["runs"]) == 4 and sum(len(r["seconds"]) for r in DATA["runs"]) == 10
    assert DATA["device"]["name"] and DATA["date"] and DATA["versions"]["torch"]


def test_every_phase_within_25_percent(rows):
    times = [r for r in rows if r["unit"] == "s"]
    assert len(times) == 10
    off = [(r["run"], r["figure"], round(r["ratio"], 2)) for r in times if not 0.75 <= r["ratio"] <= 1.25]
    assert not off, off


def test_probe_peak_within_10_percent_and_never_under(rows):
    peaks = [r for r in rows if r["figure"] == "peak"]
    assert len(peaks) == 4
    off = [(r["run"], round(r["ratio"], 3)) for r in peaks if not 1.0 <= r["ratio"] <= 1.10]
    assert not off, off


def test_plan_total_adds_what_the_allocator_does_not_report(rows):
    """At world size 1: the CUDA context, DeepSpeed's buckets (ZeRO-2/3) and fragmentation; no NCCL communicator."""
    from core.planning.memory import CUDA_CONTEXT

    for r in (r for r in rows if r["figure"] == "peak"):
        assert r["plan_total"] - r["predicted"] > CUDA_CONTEXT / 2 ** 30, r


def test_a_bad_file_is_named_with_what_it_misses(tmp_path):
    from core.errors import InputError

    bad = tmp_path / "gpu.json"
    bad.write_text('{"schema": 1, "date": "2026-11", "runs": [{"name": "x"}]}')
    with pytest.raises(InputError, match=r"gpu.json: expected schema 1 .* missing device, versions, predict_overrides, "
                                         r"runs\[0\].overrides"):
        plan_gpu.load(bad)


@pytest.mark.slow
def test_stored_reports_are_the_probes():
    """Every run's stored report is what the probe gives now, in every key it stores."""
    for run in DATA["runs"]:
        stored = json.loads((REPORTS / f"{run['name']}.json").read_text())
        fresh = json.loads(json.dumps(plan_gpu.report_of(DATA, run), sort_keys=True))
        assert {k: fresh[k] for k in stored} == stored, run["name"]
