"""``python -m recipes.run --cfg job`` for every recipe, at full and tiny scale, is what it was when the goldens in
tests/golden/cfg_job/ were written (issue 26: refactoring the config pipeline changes no resolved value).

A deliberate change of a recipe's values rewrites its golden: ``python -m tests.test_cfg_job_golden`` (review the
diff: every changed line is a changed value of a run).
"""
from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

import pytest

from core.paths import CONF_DIR

GOLDEN = Path(__file__).parent / "golden" / "cfg_job"
RECIPES = sorted(p.stem for p in (CONF_DIR / "recipe").glob("*.yaml"))
CASES = [(r, s) for r in [None, *RECIPES] for s in ("full", "tiny")]


def golden_path(recipe: str | None, scale: str) -> Path:
    return GOLDEN / f"{recipe or 'default'}__{scale}.yaml"


def job_config(recipe: str | None, scale: str) -> str:
    """What ``python -m recipes.run --cfg job [recipe=R] scale=S`` prints, in this process."""
    from recipes import run

    argv = ["--cfg", "job", *([f"recipe={recipe}"] if recipe else []), f"scale={scale}"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert run.print_job_config(argv)
    return out.getvalue()


def test_every_recipe_has_a_golden():
    assert len(RECIPES) >= 16
    assert sorted(p.name for p in GOLDEN.glob("*.yaml")) == sorted(golden_path(r, s).name for r, s in CASES)


@pytest.mark.parametrize("recipe,scale", CASES, ids=[f"{r or 'default'}-{s}" for r, s in CASES])
def test_cfg_job_unchanged(recipe, scale, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert job_config(recipe, scale) == golden_path(recipe, scale).read_text()


def write_goldens() -> None:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for recipe, scale in CASES:
        golden_path(recipe, scale).write_text(job_config(recipe, scale))
    print(f"wrote {len(CASES)} goldens to {GOLDEN}", file=sys.stderr)


if __name__ == "__main__":
    write_goldens()
