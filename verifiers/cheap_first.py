"""Cheap-first scoring of code rewards: run a few candidates per prompt, spend the full budget only where one passes.

Open-R1 (reference README "Open-R1 code rewards", Open-R1 update articles): executing every candidate's unit tests
is the expensive part of code RL, so score the first ``k`` candidates (2-3) of each prompt first and expand to the
rest of the group only when one of them passes at least one test.

This is a **budget trade-off, not an exact reward**: in a group whose first ``k`` candidates all score 0, the other
candidates get 0.0 *without being run*, even if some of them would have passed. With GRPO's group-normalised
advantages such a group (all 0) contributes no gradient either way, so the loss is only a missed rare success.
Candidates scored ``None`` (no tests) count as "not known to fail": their group is always expanded.

Usage: ``CheapFirst("code", k=2)(completions, verification_info=..., group_size=8)``; ``last_metrics`` reports
``cheap_first/executed`` and ``cheap_first/skipped`` (candidate evaluations run / saved), ``cheap_first/groups_pruned``
and ``cheap_first/skipped_frac``.
"""
from __future__ import annotations

import json
from typing import Sequence

from verifiers import get_verifier

# Columns that identify a prompt's tests, tried in order when no group_size is given.
KEY_COLUMNS = ("verification_info", "test_cases", "test_list", "test", "prompt")


def _groups(n: int, columns: dict, group_size: int | None) -> list[list[int]]:
    """Indices of each prompt group: consecutive blocks of ``group_size``, else rows with identical test columns."""
    if group_size:
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        return [list(range(i, min(i + group_size, n))) for i in range(0, n, group_size)]
    name = next((c for c in KEY_COLUMNS if c in columns and columns[c] is not None), None)
    if name is None:
        raise ValueError(f"cheap_first needs group_size or one of the columns {', '.join(KEY_COLUMNS)}")
    groups: dict[str, list[int]] = {}
    for i, v in enumerate(columns[name]):
        groups.setdefault(json.dumps(v, sort_keys=True, default=str), []).append(i)
    return list(groups.values())


def _subset(columns: dict, idx: Sequence[int], n: int) -> dict:
    """Row-aligned columns restricted to ``idx``; scalar options (timeout, workers, ...) pass through unchanged."""
    out = {}
    for k, v in columns.items():
        aligned = isinstance(v, (list, tuple)) and len(v) == n
        out[k] = [v[i] for i in idx] if aligned else v
    return out


class CheapFirst:
    """Wrap a registered verifier (default ``code``): first ``k`` candidates per group, the rest only if one passes."""

    def __init__(self, verifier: str = "code", k: int = 2):
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.fn, self.k, self.name = get_verifier(verifier), k, verifier
        self.last_metrics: dict[str, float] = {}

    def _run(self, completions, columns: dict, idx: list[int], out: list) -> None:
        if idx:
            vals = self.fn([completions[i] for i in idx], **_subset(columns, idx, len(completions)))
            for i, v in zip(idx, vals):
                out[i] = v

    def __call__(self, completions, group_size: int | None = None, **columns) -> list[float | None]:
        n = len(completions)
        groups = _groups(n, columns, group_size)
        out: list[float | None] = [None] * n
        self._run(completions, columns, [i for g in groups for i in g[: self.k]], out)  # stage 1, one batch
        expand, pruned = [], 0
        for g in groups:
            if any(out[i] is None or out[i] > 0 for i in g[: self.k]):
                expand.extend(g[self.k:])
            else:
                pruned += 1
                for i in g[self.k:]:
                    out[i] = 0.0
        self._run(completions, columns, expand, out)  # stage 2, one batch
        executed = sum(min(len(g), self.k) for g in groups) + len(expand)
        self.last_metrics = {"cheap_first/executed": float(executed), "cheap_first/skipped": float(n - executed),
                             "cheap_first/groups_pruned": float(pruned),
                             "cheap_first/skipped_frac": (n - executed) / n if n else 0.0}
        return out


def cheap_first(verifier: str = "code", k: int = 2) -> CheapFirst:
    """``cheap_first("code", k=2)``: a reward function with the cheap-first schedule (see module docstring)."""
    return CheapFirst(verifier, k)
