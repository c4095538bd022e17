"""The planner's time against every headline figure (bench/plan_calibration.py; docs/planner.md "Calibration").

The probe's reports are stored under tests/planning/reports (``python -m bench.plan_calibration --reports
tests/planning/reports --write`` rewrites them; the slow test holds one to a fresh probe), so these tests run the time
function alone. Bounds are the tolerance reached, per case, as docs/planner.md states it; a change to the model that
moves a prediction out of them fails here.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import plan_calibration as C

REPORTS = Path(__file__).with_name("reports")
CASES = {c.key: c for c in C.CASES}


def _predict(key: str, reading: int = 0) -> float:
    case = CASES[key]
    r = case.readings[reading]
    return C.predict(case, r, C.report_of(case, r, REPORTS))[0]


def test_every_headline_figure_has_a_case():
    """The reference's table has six time figures (RM 9 h, RLVR 65 h and 60 h, SimpleRL-Zoo 15 h, Open-R1 25 min,
    the 4090's 278 h and 24 h); each is a case, and each case's reports are stored."""
    assert len(C.CASES) == 8  # SimpleRL-Zoo's 15 h for both 7B and 14B, the 4090 figure's two settings
    stored = sorted(p.name for p in REPORTS.glob("*.json"))
    assert stored == sorted({C.report_name(c, r) for c in C.CASES for r in c.readings})


# (case, reading index) -> the band predicted / claimed lies in (docs/planner.md "Calibration": the RM within the 25%
# goal; the 70B run 1.88x, its prompts and completions taken at their 2048-token caps, no mean being published)
WELL_DEFINED = {("open_instruct_rm_8b", 0): (0.75, 1.25), ("open_instruct_rlvr_70b", 0): (1.5, 2.2)}
SLOW = {"open_instruct_rlvr_70b"}  # preparing the 70B config takes ~15 s here


@pytest.mark.parametrize("key,reading", [pytest.param(k, r, marks=[pytest.mark.slow] if k in SLOW else [])
                                         for k, r in sorted(WELL_DEFINED)])
def test_well_defined_figures_within_tolerance(key, reading):
    lo, hi = WELL_DEFINED[(key, reading)]
    ratio = _predict(key, reading) / CASES[key].value
    assert lo <= ratio <= hi, (key, ratio)


def test_4090_verdicts():
    """Issue #354: 8192 tokens + ZeRO-3 crawls (or does not fit) on six 4090s; 4096 + ZeRO-2 fits and is several
    times faster. The planner gives both verdicts, the speed-up with the stated margin."""
    slow, fast = _predict("openrlhf_rm_4090_8192_z3"), _predict("openrlhf_rm_4090_4096_z2")
    fast_report = C.report_of(CASES["openrlhf_rm_4090_4096_z2"], CASES["openrlhf_rm_4090_4096_z2"].readings[0],
                              REPORTS)
    assert fast_report["fits"]
    # 2.7x here against the figures' 11.6x (278 h / 24 h): both at their length caps (no mean pair length is
    # published), and PCIe without peer-to-peer at its datasheet rate (docs/planner.md says why each misses)
    assert 2.0 < slow / fast < 4.0, (slow, fast)
    assert slow > 278


def test_open_r1_hf_generate_waves_reach_the_25_minutes():
    """Open-R1's ~25-minute steps: with HF generate, TRL 0.14-0.16 generates per micro-batch (4 completions a rank a
    call, 16 calls a step), each wave running to the 4096-token cap at HF generate's per-layer host overhead a decode
    iteration: 38 minutes (1.52x; docs/planner.md: every wave priced at the cap). The vLLM reading stays at the
    roofline's 3 minutes (0.12x), an order of magnitude below: the figure's layout is the HF one."""
    case = CASES["open_r1_4xh100"]
    (vllm_min, vllm_st), (hf_min, hf_st) = (C.predict(case, r, C.report_of(case, r, REPORTS)) for r in case.readings)
    assert 1.2 <= hf_min / case.value <= 1.9, hf_min
    assert 1.5 <= vllm_min <= 5, vllm_min
    for st in (vllm_st, hf_st):
        assert max(st.phases, key=st.phases.get) == "generate"
    # the overhead floor binds HF generate's decode: 16 waves x 4096 iterations x 28 layers x 1.2 ms
    assert hf_st.phases["generate"] >= 16 * 4096 * 28 * 1.2e-3


def test_rlvr_8b_readings_bracket_the_claim():
    """65 h lies between the readings: 10M episodes is far longer, the paper's 100k episodes far shorter, so the
    maintainer's full run stopped in between (docs/planner.md)."""
    full, paper = _predict("open_instruct_rlvr_8b", 0), _predict("open_instruct_rlvr_8b", 1)
    assert paper < 65 < full


@pytest.mark.slow
def test_stored_report_is_the_probes():
    """The stored report of one case is what the probe gives now (the fixtures are not stale), in every key it
    stores (the probe may report more: the memory side's parts)."""
    case = CASES["open_instruct_rm_8b"]
    stored = json.loads((REPORTS / C.report_name(case, case.readings[0])).read_text())
    fresh = C.report_of(case, case.readings[0], None)
    fresh.pop("probe_seconds", None)
    fresh = json.loads(json.dumps(fresh, sort_keys=True))
    assert {k: fresh[k] for k in stored} == stored
