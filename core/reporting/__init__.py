"""Reporting: per-step metrics (``metrics.jsonl``, TensorBoard), the results table (``logger`` group), and the
comparison of finished runs: tables (``comparison``) and report figures (``figures``) for ``recipes.compare``."""
