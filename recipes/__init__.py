"""Recipes: one readable loop per algorithm family (``rl``, ``rm``), run by ``python -m recipes.run``."""
