"""Prompt datasets: generated locally, read from a local file, or loaded from the hub by name.

Every source yields rows (dicts); :func:`load_split` renames the ``data.prompt_key`` column to ``prompt`` (a
string or chat messages) and ``data.answer_key`` to ``answer`` (none when null), each key a column or a dotted
path into nested ones (SimpleRL-Zoo's ``prompt.0.content``, ``reward_model.ground_truth``), per split where the
splits differ (``data.eval_prompt_key``); other columns travel along and reach the verifier as keyword arguments.
:func:`tokenize_rows` renders each prompt (``template``, optional system message and chat template) and applies
the token-length limit (dropped, or left-truncated as TRL 0.18 did for Open-R1).
"""
from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Callable

from core import paths
from core.data.files import DataError, Rows, read_rows  # noqa: F401  (the readers' names, here since before files.py)
from core.hub import reading
from core.registry import Registry

log = logging.getLogger(__name__)

SourceFn = Callable[[object, str], "list[dict]"]
SOURCES: Registry[SourceFn] = Registry("data.source")


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
        raise DataError(f"data.{key} is not set (data.source=file needs a local file"
                        + ("; or hold rows of data.path out with data.eval_holdout=N or a fraction)" if key == "eval_path"
                           else ")"))
    return read_rows(paths.resolve(cfg[key]), f"data.{key}")


@SOURCES.register("hub")
def hub(cfg, split: str) -> list[dict]:
    """``datasets.load_dataset(data.hub_name, data.hub_config, split=...)``: how clusters load the same data by name.
    The eval split comes from ``data.eval_hub_name`` (its default config) when that is set, as Open-R1's math recipes
    are evaluated on MATH-500 while their training set has no test split."""
    import datasets

    if not cfg.hub_name:
        raise DataError("data.hub_name is not set (data.source=hub needs a dataset name)")
    if split == "train":
        key, name, config, part = "data.hub_name", cfg.hub_name, cfg.hub_config, cfg.split
    else:
        other = cfg.eval_hub_name
        key, name, config = ("data.eval_hub_name", other, None) if other else ("data.hub_name", cfg.hub_name,
                                                                               cfg.hub_config)
        part = cfg.eval_split
    with reading("dataset", key, name):  # unreachable or not there: the id and the local alternatives
        return [dict(r) for r in datasets.load_dataset(name, config, split=part)]


@SOURCES.register("code_stdio")
def code_stdio(cfg, split: str) -> list[dict]:
    """MBPP or HumanEval rows from ``data.path`` (``data.eval_path`` for eval) converted to stdin/stdout problems in
    Open-R1's code-dataset shape (core/data/code_stdio.py): the Open-R1 code recipe's stand-in at scale=tiny."""
    from core.data.code_stdio import convert

    rows = convert(local_file(cfg, split))
    if not rows:
        raise DataError(f"data.source=code_stdio: no MBPP or HumanEval problem in the {split} file converts to "
                        f"stdin/stdout cases (expected rows with test_list, or with test and entry_point)")
    return rows


@SOURCES.register("codeforces_tiny")
def codeforces_tiny(cfg, split: str) -> list[dict]:
    """Six Codeforces-style problems in the open-r1/codeforces ``verifiable-prompts`` columns, written on first use
    into the local cache (core/data/codeforces_tiny.py); the same rows for both splits. Their generated tests are in
    ``${codeforces_tiny:}/generated_tests`` (cf_code's ``tests_folder``)."""
    from core.data import codeforces_tiny as tiny

    return read_rows(tiny.folder() / "train.jsonl", "data.source=codeforces_tiny")


@SOURCES.register("rlvr_mixture_tiny")
def rlvr_mixture_tiny(cfg, split: str) -> list[dict]:
    """Open-Instruct RLVR's GSM8K / MATH / IFEval rows, local and small (core/data/rlvr_tiny.py)."""
    from core.data.rlvr_tiny import rows

    return rows(cfg, split)


def split_keys(cfg, split: str) -> dict[str, str | None]:
    """``{"prompt": key, "answer": key}`` of ``split``: the eval split's own keys where set."""
    own = {"prompt": cfg.eval_prompt_key, "answer": cfg.eval_answer_key} if split == "eval" else {}
    return {"prompt": own.get("prompt") or cfg.prompt_key,
            "answer": own.get("answer") or cfg.answer_key}


def _take(row: dict, path: str):
    """The value at dotted ``path`` (``a.0.b``: key ``a``, item 0, key ``b``); moved out of ``row`` when ``path``
    is a column itself. Raises KeyError naming the first step that is missing."""
    if path in row:
        return row.pop(path)
    value = row
    for step in path.split("."):
        if isinstance(value, dict) and step in value:
            value = value[step]
        elif isinstance(value, (list, tuple)) and step.lstrip("-").isdigit() and -len(value) <= int(step) < len(value):
            value = value[int(step)]
        else:
            raise KeyError(step)
    return value


def load_split(cfg, split: str) -> list[dict]:
    """Rows of ``split`` (``train`` or ``eval``) with ``prompt`` (and, unless ``data.answer_key`` is null,
    ``answer``) columns, filtered by ``data.max_prompt_chars`` (SimpleRL-Zoo's character filter). With
    ``data.eval_holdout``, both splits come from the source's train rows (:func:`split_off`). Each value is checked
    as a value (:func:`value_problem`): every bad one is refused at once, naming its file, line and column."""
    holdout = cfg.get("eval_holdout")
    rows = SOURCES.get(cfg.source)(cfg, split if holdout is None else "train")
    keys = {name: key for name, key in split_keys(cfg, split).items() if key}
    out, bad, empty = [], [], []
    for i, row in enumerate(rows):
        row = dict(row)
        for name, key in keys.items():
            which = f"data.{'eval_' if split == 'eval' and cfg[f'eval_{name}_key'] else ''}{name}_key"
            try:
                row[name] = _take(row, key)
            except KeyError as e:
                raise DataError(f"data: row {i} of the {split} split has no {key!r} ({which}; missing step "
                                f"{e.args[0]!r}); columns: {sorted(row)}") from None
            problem = value_problem(name, row[name])
            place = f"{_where(rows, i, split, cfg)}, column {key!r} ({which})"
            if problem:
                bad.append(f"{place}: {problem}")
            elif name == "answer" and _is_empty(row[name]):
                empty.append(place)
        out.append(row)
    if bad:
        raise DataError(f"data: {len(bad)} {'row holds' if len(bad) == 1 else 'rows hold'} no usable value:\n  - "
                        + "\n  - ".join(bad[:8]) + ("\n  - ..." if len(bad) > 8 else "") + "\n  mend or drop them")
    if empty:  # published sets hold a few (SimpleRL-Zoo's level 3-5 train set: 2), and their sources train on them
        log.warning("data: %d %s rows hold an empty answer, kept as the sources keep them (no completion matches "
                    "it): %s%s", len(empty), split, "; ".join(empty[:3]), "; ..." if len(empty) > 3 else "")
    if holdout is not None:
        out = split_off(out, holdout)[split == "eval"]
    if cfg.max_prompt_chars:
        out = [r for r in out if len(format_prompt(r["prompt"], cfg)) <= cfg.max_prompt_chars]
    return out


def value_problem(name: str, value) -> str | None:
    """What makes a row's ``prompt`` or ``answer`` value unusable, or None. A prompt is text or a list of chat
    messages (``{"role": ..., "content": ...}``), not null, a number or empty; an answer is not null (a number is one:
    SimpleRL-Zoo's AMC23 set holds its answers as numbers, and the verifiers read them; an empty one is logged)."""
    if value is None:
        return f"null; expected {_EXPECTED[name]}"
    if name != "prompt":
        return None
    if isinstance(value, list) and value and not all(isinstance(m, dict) and "content" in m for m in value):
        return f"a list that is not chat messages ({json.dumps(value, default=str)[:60]}); expected {_EXPECTED[name]}"
    if not isinstance(value, (str, list)):
        kind = {bool: "a boolean", int: "a number", float: "a number", dict: "an object"}.get(type(value),
                                                                                              type(value).__name__)
        return f"{kind} ({json.dumps(value, default=str)[:60]}); expected {_EXPECTED[name]}"
    return f"empty ({json.dumps(value)}); expected {_EXPECTED[name]}" if _is_empty(value) else None


def _is_empty(value) -> bool:
    return isinstance(value, (str, list)) and not (value.strip() if isinstance(value, str) else value)


_EXPECTED = {"prompt": 'the prompt\'s text, or a list of chat messages [{"role": ..., "content": ...}]',
             "answer": "the answer (text, or a number)"}


def _where(rows: list[dict], i: int, split: str, cfg) -> str:
    """Where row ``i`` of a source's rows is: its file and line (or item, or row) when read from a file."""
    return rows.where(i) if isinstance(rows, Rows) else f"row {i} of the {split} rows of data.source={cfg.source}"


HOLDOUT_SEED = 0  # one held-out set for every training seed, so seeds are compared on the same rows


def split_off(rows: list[dict], holdout: float) -> tuple[list[dict], list[dict]]:
    """``(train, held out)``: ``holdout`` rows (a count >= 1, or a fraction < 1 of the rows, rounded, at least one)
    drawn at random with a fixed seed (:data:`HOLDOUT_SEED`) and kept out of training; both keep the file's order.
    The held-out set is the same for every ``seed``, as TRL's ``train_test_split(seed=...)`` of a fixed seed."""
    if holdout >= 1 and holdout != int(holdout):
        raise DataError(f"data.eval_holdout={holdout:g}: expected a whole number of rows (>= 1) or a fraction (< 1)")
    n = max(round(holdout * len(rows)), 1) if holdout < 1 else int(holdout)
    if n >= len(rows):
        raise DataError(f"data.eval_holdout={holdout:g}: holds out {n} of the {len(rows)} training rows; expected at "
                        f"least one row held out and one left to train on")
    held = set(random.Random(HOLDOUT_SEED).sample(range(len(rows)), n))
    return [r for i, r in enumerate(rows) if i not in held], [r for i, r in enumerate(rows) if i in held]


def format_prompt(prompt, cfg) -> str | list:
    """Apply ``data.template`` to a string prompt; chat messages pass through unchanged."""
    return cfg.template.format(prompt=prompt) if isinstance(prompt, str) else prompt


def tokenize_prompt(prompt, cfg, tokenizer) -> list[int]:
    """Token ids of one prompt, through the chat template when ``data.chat_template`` is set: the tokenizer's,
    or ``data.chat_template_override``, after a ``data.system_prompt`` message when one is set (Open-R1's
    ``make_conversation``: system, then user)."""
    text = format_prompt(prompt, cfg)
    if cfg.chat_template:
        messages = list(text) if isinstance(text, list) else [{"role": "user", "content": text}]
        if cfg.system_prompt is not None:
            messages = [{"role": "system", "content": cfg.system_prompt}, *messages]
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                  return_dict=False, chat_template=cfg.chat_template_override))
    if not isinstance(text, str):
        raise DataError("data.chat_template is false but the prompt column holds chat messages")
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def tokenize_rows(rows: list[dict], cfg, tokenizer) -> tuple[list[dict], list[list[int]]]:
    """Each row's prompt token ids, with ``data.max_prompt_tokens`` applied: ``prompt_overflow=drop`` leaves the
    longer rows out (Open-Instruct's ``max_prompt_token_length`` filter), ``truncate_left`` keeps their last
    tokens (TRL <= 0.18 ``max_prompt_length``, which Open-R1's recipes ran with). Returns the rows kept and
    their ids."""
    ids = [tokenize_prompt(r["prompt"], cfg, tokenizer) for r in rows]
    limit = cfg.max_prompt_tokens
    if not limit:
        return rows, ids
    if cfg.prompt_overflow == "truncate_left":
        return rows, [p[-limit:] for p in ids]
    kept = [i for i, p in enumerate(ids) if len(p) <= limit]
    return [rows[i] for i in kept], [ids[i] for i in kept]


class PromptSampler:
    """Epoch-wise shuffled prompt batches, seeded; ``state``/``restore`` make resumption exact."""

    def __init__(self, n: int, batch: int, seed: int):
        if batch > n:  # the token-length filter runs after the config checks (it needs the tokenizer)
            raise DataError(f"train.prompts_per_step={batch} is larger than the training set ({n} rows after "
                            f"filtering: data.max_prompt_chars, data.max_prompt_tokens)")
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
