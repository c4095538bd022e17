"""The version floors of pyproject.toml are the pins of constraints/min.txt, which ``make test-min`` installs and
tests: a floor cannot move without the tested pin moving with it (docs/dependencies.md)."""
from __future__ import annotations

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from core.paths import PROJECT_ROOT

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

# Installed from the wheel at hand before the pins (constraints/test.sh), so it has no pin: docs/dependencies.md.
UNPINNED = {"torch"}
# Extras test-min installs: dev and what it pulls in. The gpu extra has its own file (constraints/gpu.txt).
TESTED_EXTRAS = ("dev", "wandb", "slurm")


def floors() -> dict[str, Version]:
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    reqs = [*project["dependencies"], *(r for e in TESTED_EXTRAS for r in project["optional-dependencies"][e])]
    out = {}
    for req in map(Requirement, reqs):
        lower = [s.version for s in req.specifier if s.operator == ">="]
        if req.name != "rlrecipes" and req.name not in UNPINNED:
            assert len(lower) == 1, f"{req}: every dependency needs one >= floor"
            out[req.name] = Version(lower[0])
    return out


def pins(path) -> dict[str, Version]:
    out = {}
    for line in path.read_text().splitlines():
        if line.split("#")[0].strip():
            req = Requirement(line.split("#")[0])
            (spec,) = req.specifier
            assert spec.operator == "==", f"{path.name}: {line} is not a pin"
            out[req.name] = Version(spec.version)
    return out


def test_min_constraints_pin_exactly_the_floors():
    assert pins(PROJECT_ROOT / "constraints" / "min.txt") == floors()


def test_gpu_constraints_satisfy_the_project_ranges():
    """constraints/gpu.txt (what the gpu extra resolves to) stays inside pyproject.toml's ranges."""
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    ranges = {r.name: r.specifier for r in map(Requirement, [*project["dependencies"],
                                                            *project["optional-dependencies"]["gpu"]])}
    for name, v in pins(PROJECT_ROOT / "constraints" / "gpu.txt").items():
        assert name not in ranges or v in ranges[name], f"constraints/gpu.txt pins {name}=={v}, outside {ranges[name]}"


def test_the_deepspeed_floor_skips_a_nonfinite_step():
    """The floor is the first DeepSpeed that skips a non-finite step under every ZeRO stage (core/training/engine.py
    ``NONFINITE_SKIP_DEEPSPEED``, which the engine and the config check also hold the installed one to)."""
    from core.training.engine import NONFINITE_SKIP_DEEPSPEED

    assert floors()["deepspeed"] == Version(NONFINITE_SKIP_DEEPSPEED) == Version("0.19.8")
