"""The results table: one JSON row per finished run (and per evaluated set and metric, ``kind: eval``) in
``results/runs.jsonl``, appended atomically.

Rows are appended under an exclusive lock, each batch in a single write, so concurrent Hydra
multirun jobs never interleave or half-write a row; ``python -m recipes.compare`` renders them.
"""
from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from core.writes import failed, replace_text

TABLE = "runs.jsonl"


def append_row(results_dir: Path, row: dict) -> Path:
    """Append a training run's ``row`` unless the table already has one for its ``run_dir`` and ``steps`` (a run
    resumed after its row was written, before it said it had finished, must not count twice); a finished run
    extended to more steps appends its new row, which :func:`latest_rows` reads in place of the old."""
    return append_rows(results_dir, [row], key=("kind", "run_dir", "steps"))


def append_rows(results_dir: Path, rows: list[dict], key: tuple[str, ...]) -> Path:
    """Append ``rows`` in one write under the lock, each unless the table already holds a row equal to it on
    every field of ``key``. Training rows have no ``kind``, so an evaluation's rows (``kind: eval``, keyed by
    its output dir, set and metric: recipes/eval.py) never stand in for the row of the run they evaluate."""
    path = Path(results_dir) / TABLE
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        have = {tuple(json.dumps(r.get(k), default=str) for k in key) for r in read_rows(path.parent)}
        new = [r for r in rows if tuple(json.dumps(r.get(k), default=str) for k in key) not in have]
        if new:
            _write_all(fd, path, "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in new).encode())
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    return path


def _write_all(fd: int, path: Path, data: bytes) -> None:
    """``data`` appended through ``fd`` (held under the table's lock) and synced; a write that fails part-way (a full
    disk) is cut back off, so the table keeps whole rows only, and :class:`core.writes.WriteError` says so."""
    before = os.fstat(fd).st_size
    try:
        view = memoryview(data)
        while view:  # os.write may write less than asked
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except Exception as e:
        os.ftruncate(fd, before)
        raise failed(path, e, "the row is taken back and the rows before it are intact") from e


def write_summary(run_dir: Path, row: dict) -> None:
    """``summary.json``, the run's row, written atomically: a run dir holding one has finished."""
    replace_text(Path(run_dir) / "summary.json", json.dumps(row, indent=1))


def read_rows(results_dir: Path) -> list[dict]:
    path = Path(results_dir) / TABLE
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line from a crashed writer on a filesystem without atomic appends
    return rows


# An evaluation row's settings: two evaluations of one model that agree on all of them measure the same thing (the
# later one is the model's value); any difference (fewer problems, shorter completions, other sampling) is another
# measurement. ``eval_seed`` is not one: a re-evaluation with another sampling seed replaces the earlier value.
EVAL_SETTINGS = ("preset", "set", "metric", "problems", "samples", "greedy", "temperature", "top_p", "max_new_tokens",
                 "verifier")


def latest_rows(rows: list[dict]) -> list[dict]:
    """The latest row (the last in the table) of each run dir, in table order: a training row per ``run_dir`` (a run
    extended or rewritten keeps its last row), and an evaluation row (``kind: eval``) per evaluated model and
    :data:`EVAL_SETTINGS` (the model is the run dir, or for a model outside a run its path)."""
    def key(r):
        if r.get("kind") != "eval":
            return (r.get("kind"), r.get("run_dir"))
        model = r.get("model") if r.get("run_dir") == r.get("eval_dir") else r.get("run_dir")
        return ("eval", model, *(json.dumps(r.get(k), default=str) for k in EVAL_SETTINGS))

    last = {key(r): i for i, r in enumerate(rows)}
    return [r for i, r in enumerate(rows) if last[key(r)] == i]


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    def cell(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return "" if v is None else str(v)

    head = "| " + " | ".join(columns) + " |"
    sep = "| " + " | ".join("---" for _ in columns) + " |"
    body = ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join([head, sep, *body])


def command_line_overrides() -> list[str]:
    """The overrides this Hydra job was started with, as a results row records them (none outside a Hydra job)."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
