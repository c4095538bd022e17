"""Every registered name is counted and exercised by name somewhere in tests/core."""
from __future__ import annotations

import re
from pathlib import Path

from core.algorithms.advantage import ADVANTAGES, WHITENING
from core.algorithms.kl_control import KL_CONTROLLERS
from core.algorithms.loss import AGGREGATIONS, IS_CORRECTIONS, KL_ESTIMATORS, POLICY_LOSSES

REGISTRIES = {"advantage": ADVANTAGES, "whitening": WHITENING, "policy loss": POLICY_LOSSES,
              "is correction": IS_CORRECTIONS, "kl estimator": KL_ESTIMATORS, "aggregation": AGGREGATIONS,
              "kl controller": KL_CONTROLLERS}


def test_registered_name_count():
    counts = {k: len(r.names()) for k, r in REGISTRIES.items()}
    assert counts == {"advantage": 6, "whitening": 3, "policy loss": 2, "is correction": 6, "kl estimator": 3,
                      "aggregation": 5, "kl controller": 2}
    assert sum(counts.values()) == 27


def test_every_registered_name_is_used_by_a_test():
    here = Path(__file__).parent
    text = "\n".join(p.read_text() for p in here.glob("test_*.py") if p.name != Path(__file__).name)
    quoted = set(re.findall(r"[\"']([a-z0-9_]+)[\"']", text)) | set(re.findall(r"=([a-z0-9_]+)[\"' ]", text))
    missing = [f"{k}:{n}" for k, r in REGISTRIES.items() for n in r.names() if n not in quoted]
    assert not missing, f"registered but never named in a test: {missing}"
