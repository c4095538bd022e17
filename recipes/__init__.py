"""Recipes: one readable loop per algorithm family (``rl``, ``rm``), run by ``python -m recipes.run``.

:data:`LOOPS` maps the config's ``loop`` to the loop's ``main(cfg)``, each module imported when its loop runs. A
loop's scale shrinker and batch split live in core (core/config/scale.py ``SHRINKERS``, core/config/validate.py
``BATCH_SPLITS``), keyed by the same names, so a config is scaled and checked without importing a loop.
"""
from __future__ import annotations

from core.registry import Registry

LOOPS: Registry = Registry("loop")
LOOPS.declare("rl", "recipes.rl:main")
LOOPS.declare("rm", "recipes.rm:main")
