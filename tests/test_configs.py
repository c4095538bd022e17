"""Config hygiene: every recipe composes, every group key is documented, the recipe list is derived."""
from __future__ import annotations

import re

import pytest
from hydra import compose, initialize_config_dir

from core.config.composition import register_resolvers
from core.paths import CONF_DIR

register_resolvers()

RECIPES = sorted(p.stem for p in (CONF_DIR / "recipe").rglob("*.yaml"))
GROUP_FILES = sorted(p for p in CONF_DIR.rglob("*.yaml")
                     if p.parent.name not in ("recipe", "debug") and p.parent != CONF_DIR
                     and p.relative_to(CONF_DIR).parts[0] != "local")  # per-machine files, untracked


def test_discovery_found_the_configs():
    assert "tiny_math_grpo" in RECIPES and len(RECIPES) >= 1
    assert len(GROUP_FILES) >= 44  # 6 layouts and 2 hydra launchers since issue 18


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_composes_and_cites_its_source(recipe):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"recipe={recipe}"], return_hydra_config=True)
    assert cfg.loop and cfg.hydra.runtime.choices.recipe == recipe
    text = (CONF_DIR / "recipe" / f"{recipe}.yaml").read_text()
    assert text.startswith("# @package _global_"), "a recipe is a global diff"
    assert text.splitlines()[1].startswith("# "), "the first comment says how to run it / its source"


def _documented(lines: list[str], i: int) -> bool:
    """A key is documented by an inline comment, or by a comment heading its block of lines (a
    comment above, possibly shared by the keys that follow it with no blank line between)."""
    if " #" in lines[i]:
        return True
    for j in range(i - 1, -1, -1):
        if not lines[j].strip():
            return False
        if lines[j].lstrip().startswith("#"):
            return True
    return False


def _keys(path) -> list[int]:
    lines = path.read_text().splitlines()
    return [i for i, line in enumerate(lines) if re.match(r"^[A-Za-z_]\w*:", line) and not line.startswith("defaults:")]


def _bases(path) -> list:
    """Options of the same group this file extends through its defaults list (``- name`` lines)."""
    text = path.read_text()
    if "defaults:" not in text:
        return []
    names = re.findall(r"^\s+-\s+([\w/]+)\s*$", text.split("defaults:", 1)[1], re.M)
    return [path.parent / f"{n}.yaml" for n in names if n != "_self_" and (path.parent / f"{n}.yaml").exists()]


def _documented_keys(path) -> set[str]:
    lines = path.read_text().splitlines()
    own = {lines[i].split(":")[0] for i in _keys(path) if _documented(lines, i)}
    return own.union(*(_documented_keys(b) for b in _bases(path)))


@pytest.mark.parametrize("path", GROUP_FILES, ids=lambda p: str(p.relative_to(CONF_DIR)))
def test_every_top_level_key_is_documented(path):
    """Each key has a comment where it lives: here, or in the option this file extends."""
    lines = path.read_text().splitlines()
    keys = [lines[i].split(":")[0] for i in _keys(path)]
    undocumented = sorted(set(keys) - _documented_keys(path))
    assert keys and not undocumented, f"{path}: keys without a comment: {undocumented}"
