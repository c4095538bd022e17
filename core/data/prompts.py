"""Prompt datasets: generated locally, read from a local file, or loaded from the hub by name.

Every source yields rows (dicts) with a ``prompt`` column (a string or chat messages) and an
``answer`` column; other columns travel along and reach the verifier as keyword arguments.
"""
from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Callable

from core import paths
from core.errors import InputError
from core.registry import Registry

SourceFn = Callable[[object, str], "list[dict]"]
SOURCES: Registry[SourceFn] = Registry("data.source")


class DataError(InputError):
    """Bad data configuration or a missing file; raised before any model is built."""


@SOURCES.register("arithmetic")
def arithmetic(cfg, split: str) -> list[dict]:
    """Integer arithmetic ``"a+b="`` -> ``"68"``; train and eval rows are disjoint by construction."""
    g = cfg.generator
    rng = random.Random(int(g.seed))
    want = int(g.num_train) + int(g.num_eval)
    space = (int(g.max_operand) + 1) ** 2 * len(g.ops)
    if want > space:
        raise DataError(f"data.generator: num_train + num_eval = {want} exceeds the {space} distinct problems")
    seen, rows = set(), []
    while len(rows) < want:
        a, b, op = rng.randint(0, g.max_operand), rng.randint(0, g.max_operand), rng.choice(list(g.ops))
        if (a, op, b) in seen:
            continue
        seen.add((a, op, b))
        rows.append({"prompt": f"{a}{op}{b}=", "answer": str(_apply(a, op, b))})
    return rows[: g.num_train] if split == "train" else rows[g.num_train:]


def _apply(a: int, op: str, b: int) -> int:
    ops = {"+": a + b, "-": a - b, "*": a * b}
    if op not in ops:
        raise DataError(f"data.generator.ops: unknown operator {op!r}; expected some of {sorted(ops)}")
    return ops[op]


@SOURCES.register("file")
def local_file(cfg, split: str) -> list[dict]:
    """Rows of a local ``.jsonl``, ``.jsonl.gz``, ``.json`` or ``.parquet`` file."""
    key = "path" if split == "train" else "eval_path"
    if not cfg[key]:
        raise DataError(f"data.{key} is not set (data.source=file needs a local file)")
    return read_rows(paths.resolve(cfg[key]), f"data.{key}")


@SOURCES.register("hub")
def hub(cfg, split: str) -> list[dict]:
    """``datasets.load_dataset(data.hub_name, split=...)``: how clusters load the same data by name."""
    import datasets

    if not cfg.hub_name:
        raise DataError("data.hub_name is not set (data.source=hub needs a dataset name)")
    name = cfg.split if split == "train" else cfg.eval_split
    return [dict(r) for r in datasets.load_dataset(cfg.hub_name, cfg.hub_config, split=name)]


def _json_line(line: str, path: Path, n: int, key: str) -> dict:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"{key}: {path} line {n} is not valid JSON ({e.msg} at column {e.colno}): "
                        f"{line.strip()[:80]!r}") from None
    if not isinstance(row, dict):
        raise DataError(f"{key}: {path} line {n} is a JSON {type(row).__name__}, expected an object (one row)")
    return row


def read_rows(path: Path, key: str = "data.path") -> list[dict]:
    if not path.exists():
        raise DataError(f"{key}: data file not found: {path}")
    name = path.name
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if name.endswith((".jsonl", ".jsonl.gz")):
        opener = gzip.open if name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as fh:
            return [_json_line(line, path, n, key) for n, line in enumerate(fh, 1) if line.strip()]
    if name.endswith(".json"):
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise DataError(f"{key}: {path} line {e.lineno} column {e.colno} is not valid JSON: {e.msg}") from None
    raise DataError(f"{key}: unsupported file type {path} (expected .jsonl, .jsonl.gz, .json or .parquet)")


def load_split(cfg, split: str) -> list[dict]:
    """Rows of ``split`` (``train`` or ``eval``) with ``prompt``/``answer`` columns, filtered."""
    rows = SOURCES.get(cfg.source)(cfg, split)
    out = []
    for i, row in enumerate(rows):
        for k in (cfg.prompt_key, cfg.answer_key):
            if k not in row:
                raise DataError(f"data: row {i} of the {split} split has no column {k!r} "
                                f"(data.prompt_key / data.answer_key); columns: {sorted(row)}")
        row = dict(row)
        row["prompt"], row["answer"] = row.pop(cfg.prompt_key), row.pop(cfg.answer_key)
        out.append(row)
    if cfg.max_prompt_chars:
        out = [r for r in out if len(format_prompt(r["prompt"], cfg)) <= int(cfg.max_prompt_chars)]
    return out


def format_prompt(prompt, cfg) -> str | list:
    """Apply ``data.template`` to a string prompt; chat messages pass through unchanged."""
    return cfg.template.format(prompt=prompt) if isinstance(prompt, str) else prompt


def tokenize_prompt(prompt, cfg, tokenizer) -> list[int]:
    """Token ids of one prompt, through the chat template when ``data.chat_template`` is set."""
    text = format_prompt(prompt, cfg)
    if cfg.chat_template:
        messages = text if isinstance(text, list) else [{"role": "user", "content": text}]
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                  return_dict=False))
    if not isinstance(text, str):
        raise DataError("data.chat_template is false but the prompt column holds chat messages")
    return tokenizer(text, add_special_tokens=False)["input_ids"]


class PromptSampler:
    """Epoch-wise shuffled prompt batches, seeded; ``state``/``restore`` make resumption exact."""

    def __init__(self, n: int, batch: int, seed: int):
        self.n, self.batch, self.seed = n, batch, seed
        self.epoch, self.pos = 0, 0
        self._order = self._perm()

    def _perm(self) -> list[int]:
        order = list(range(self.n))
        random.Random(self.seed * 100003 + self.epoch).shuffle(order)
        return order

    def next(self) -> list[int]:
        if self.pos + self.batch > self.n:  # drop_last: start a new epoch
            self.epoch, self.pos = self.epoch + 1, 0
            self._order = self._perm()
        idx = self._order[self.pos:self.pos + self.batch]
        self.pos += self.batch
        return idx

    def state(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def restore(self, state: dict) -> None:
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])
        self._order = self._perm()
