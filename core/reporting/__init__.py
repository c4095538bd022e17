"""Reporting: per-step metrics (``metrics.jsonl``, TensorBoard) and the results table (``logger`` group)."""
