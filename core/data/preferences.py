"""Preference pairs for reward-model training: generated locally, a local file, or a hub dataset.

Every source yields rows with a ``chosen`` and a ``rejected`` column (strings, or chat message lists
that go through the tokenizer's chat template) and optionally a ``margin``. Rows are checked here,
on text only, before any model is built: a missing column, an empty text or the same text on both
sides drops the row with a count (``data.bad_rows: drop``, the default), stops the run with the
row index (``error``), or is counted and kept (``keep``: what Open-Instruct and OpenRLHF do).
Length limits need the tokenizer and live in :func:`tokenize_pairs`.
"""
from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field

from core import paths
from core.data.prompts import DataError, read_rows
from core.hub import reading
from core.registry import Registry

log = logging.getLogger(__name__)

PAIR_SOURCES: Registry = Registry("data.source (preference pairs)")


@PAIR_SOURCES.register("copy_digits")
def copy_digits(cfg) -> list[dict]:
    """A crisp generated task: ``"copy 4831:"`` -> chosen ``" 4831"`` (the correct answer), rejected
    the same digits with ``generator.corrupt`` of them replaced by digits the prompt does not hold (a
    wrong answer). Seeded, no files."""
    g = cfg.generator
    rng = random.Random(int(g.seed))
    rows = []
    for _ in range(int(g.num_pairs)):
        digits = "".join(rng.choice("0123456789") for _ in range(int(g.length)))
        wrong = list(digits)
        for pos in rng.sample(range(len(digits)), int(g.corrupt)):
            wrong[pos] = rng.choice([d for d in "0123456789" if d not in digits])
        prompt = f"copy {digits}:"
        rows.append({"chosen": f"{prompt} {digits}", "rejected": f"{prompt} {''.join(wrong)}"})
    return rows


@PAIR_SOURCES.register("file")
def local_file(cfg) -> list[dict]:
    """Rows of a local ``.jsonl``, ``.jsonl.gz``, ``.json`` or ``.parquet`` file (``data.path``)."""
    if not cfg.path:
        raise DataError("data.path is not set (data.source=file needs a local file)")
    return read_rows(paths.resolve(cfg.path), "data.path")


@PAIR_SOURCES.register("hub")
def hub(cfg) -> list[dict]:
    """``datasets.load_dataset(data.hub_name, split=data.split)``: how a cluster loads pairs by name."""
    import datasets

    if not cfg.hub_name:
        raise DataError("data.hub_name is not set (data.source=hub needs a dataset name)")
    with reading("dataset", cfg.get("hub_key", "data.hub_name"), cfg.hub_name):
        return [dict(r) for r in datasets.load_dataset(cfg.hub_name, split=cfg.split)]


def _eval_rows(cfg, train: list[dict]) -> tuple[list[dict], list[dict]]:
    """(train, eval) per ``data.eval``: a separate source, a seeded held-out slice, or the head of train."""
    mode, frac = cfg.eval, cfg.eval_fraction
    if mode == "source":
        node = dict(cfg)
        node.update({"source": cfg.eval_source, "path": cfg.eval_path, "hub_name": cfg.eval_hub_name,
                     "hub_key": "data.eval_hub_name", "split": cfg.eval_split})
        return train, PAIR_SOURCES.get(cfg.eval_source)(_Node(node))
    n = int(round(frac * len(train)))
    if mode == "train_head":  # OpenRLHF without --eval_dataset: the first rows of train (they overlap)
        return train, train[:n]
    if mode == "holdout":  # a seeded held-out slice, removed from training
        order = list(range(len(train)))
        random.Random(cfg.seed).shuffle(order)
        held = set(order[:n])
        return [r for i, r in enumerate(train) if i not in held], [train[i] for i in sorted(held)]
    raise DataError(f"data.eval={mode!r}; expected source | holdout | train_head")


class _Node(dict):
    """A dict with attribute access, so sources take a derived config like a DictConfig."""

    __getattr__ = dict.get


@dataclass
class PairStats:
    """Why rows were dropped or cut, per split; written to metrics and the results row."""

    kept: int = 0
    missing_column: int = 0
    empty: int = 0
    identical: int = 0
    too_long_dropped: int = 0
    truncated: int = 0
    identical_after_cut: int = 0
    first_bad: list = field(default_factory=list)

    def as_metrics(self, split: str) -> dict:
        return {f"data/{split}/{k}": v for k, v in self.__dict__.items() if k != "first_bad"}


def load_pairs(cfg) -> tuple[list[dict], list[dict], dict[str, PairStats]]:
    """Train and eval pairs after the text-level checks (no tokenizer, no model yet)."""
    train = PAIR_SOURCES.get(cfg.source)(cfg)
    train, evals = _eval_rows(cfg, train)
    if cfg.max_pairs:
        train = train[: cfg.max_pairs]
    if cfg.eval_max_pairs:
        evals = evals[: cfg.eval_max_pairs]
    stats = {}
    train, stats["train"] = check_rows(train, cfg, "train")
    evals, stats["eval"] = check_rows(evals, cfg, "eval")
    return train, evals, stats


def check_rows(rows: list[dict], cfg, split: str) -> tuple[list[dict], PairStats]:
    """Keep well-formed pairs, renamed to ``chosen``/``rejected``/``margin``; count and report the rest."""
    ck, rk, mk = cfg.chosen_key, cfg.rejected_key, cfg.margin_key
    if rows and all(ck not in r or rk not in r for r in rows):
        raise DataError(f"data: no {split} row has both columns {ck!r} and {rk!r} (data.chosen_key / "
                        f"data.rejected_key); columns of row 0: {sorted(rows[0])}")
    st, out = PairStats(), []
    for i, r in enumerate(rows):
        why = _bad_reason(r, ck, rk, mk)
        if why is not None:
            setattr(st, why, getattr(st, why) + 1)
            if len(st.first_bad) < 5:
                st.first_bad.append(i)
            if cfg.bad_rows == "error" or (cfg.bad_rows == "keep" and why == "missing_column"):
                raise DataError(f"data: {split} row {i} is not a usable pair ({why.replace('_', ' ')}); "
                                f"data.bad_rows={cfg.bad_rows}; set data.bad_rows=drop to skip such rows")
        if why is None or cfg.bad_rows == "keep":  # keep: the sources train every row that has both columns
            out.append({"chosen": r[ck], "rejected": r[rk], "margin": float(r[mk]) if mk else 0.0})
    st.kept = len(out)
    bad = st.empty + st.identical + st.missing_column
    if bad:
        log.warning("data: %s %d of %d %s rows (missing column %d, empty %d, chosen == rejected %d); "
                    "first row indices %s", "kept" if cfg.bad_rows == "keep" else "dropped", bad, len(rows), split,
                    st.missing_column, st.empty, st.identical, st.first_bad)
    if rows and not out:
        raise DataError(f"data: none of the {len(rows)} {split} rows is a usable pair (see the counts above)")
    return out, st


def _bad_reason(row: dict, ck: str, rk: str, mk: str | None) -> str | None:
    if ck not in row or rk not in row or (mk and mk not in row):
        return "missing_column"
    c, r = row[ck], row[rk]
    if not _text_of(c).strip() or not _text_of(r).strip():
        return "empty"
    if c == r:
        return "identical"
    return None


def _text_of(x) -> str:
    if isinstance(x, str):
        return x
    if isinstance(x, list):  # chat messages: the content of every turn
        return "".join(str(m.get("content", "")) if isinstance(m, dict) else "" for m in x)
    return ""


def force_chat_template(tokenizer, cfg) -> None:
    """``data.chat_template_override`` set on the tokenizer over the checkpoint's own, as Open-Instruct's
    ``reward_modeling.py:244`` does with ``--chat_template`` (@3dd7a07d); the saved model's tokenizer keeps it."""
    if cfg.chat_template_override:
        tokenizer.chat_template = cfg.chat_template_override


def tokenize_text(x, tokenizer, cfg) -> list[int]:
    """Token ids of one side: chat messages rendered by the tokenizer's chat template, then (when
    ``data.append_eos``) trailing newlines stripped and EOS appended if missing, as OpenRLHF does."""
    if isinstance(x, list):
        if not cfg.apply_chat_template:
            raise DataError("data: a pair holds chat messages but data.apply_chat_template is false")
        x = tokenizer.apply_chat_template(x, tokenize=False)
    if cfg.append_eos:
        x = x.rstrip("\n")
        if not x.endswith(tokenizer.eos_token):
            x = x + cfg.eos_separator + tokenizer.eos_token
    ids = tokenizer(x, add_special_tokens=False)["input_ids"]
    if cfg.add_bos and tokenizer.bos_token_id is not None:
        ids = [tokenizer.bos_token_id] + ids
    return ids


def tokenize_pairs(pairs: list[dict], tokenizer, cfg, max_len: int, stats: PairStats) -> list[dict]:
    """Token ids of each pair, long pairs dropped (Open-Instruct) or truncated with EOS forced at the
    last position (OpenRLHF), per ``data.too_long`` and :func:`too_long`; counts go into ``stats``."""
    out = []
    for i, p in enumerate(pairs):
        c, r = tokenize_text(p["chosen"], tokenizer, cfg), tokenize_text(p["rejected"], tokenizer, cfg)
        if not c or not r:  # an empty string kept by data.bad_rows=keep: no token to read a reward at
            raise DataError(f"data: pair {i} has a side with no token (data.bad_rows={cfg.bad_rows}); set "
                            "data.append_eos=true or data.bad_rows=drop")
        if too_long(p, c, r, tokenizer, cfg, max_len):
            if cfg.too_long == "drop":
                stats.too_long_dropped += 1
                continue
            stats.truncated += 1
            c, r = c[:max_len], r[:max_len]
        if cfg.force_eos:
            c, r = c[:-1] + [tokenizer.eos_token_id], r[:-1] + [tokenizer.eos_token_id]
        stats.identical_after_cut += int(c == r)  # kept, as the sources do; no signal in such a pair
        out.append({"chosen": c, "rejected": r, "margin": p["margin"]})
    stats.kept = len(out)
    return out


def too_long(pair: dict, chosen: list[int], rejected: list[int], tokenizer, cfg, max_len: int) -> bool:
    """Whether a pair is over its limits: a side over ``max_len`` or its prompt over ``data.max_prompt_tokens``.
    With ``data.length_filter_bug``, Open-Instruct's release filter (dataset_processor.py:322-336 @3dd7a07d)::

        prompt <= max_prompt if max_prompt is not None else (chosen <= max_len if max_len is not None else ...)

    the first limit that is set decides alone: the prompt's when there is one, else the chosen side's."""
    limit = cfg.max_prompt_tokens
    long_prompt = limit is not None and prompt_length(pair, chosen, rejected, tokenizer) > limit
    if cfg.length_filter_bug:
        return long_prompt if limit is not None else len(chosen) > max_len
    return long_prompt or max(len(chosen), len(rejected)) > max_len


def prompt_length(pair: dict, chosen: list[int], rejected: list[int], tokenizer) -> int:
    """Prompt tokens of a pair: chat messages as Open-Instruct's ``tokenize_fn`` counts them (every chosen turn but
    the last, through the chat template with the generation prefix); strings, which hold no separate prompt, the
    token prefix both sides share."""
    if isinstance(pair["chosen"], list):
        text = tokenizer.apply_chat_template(pair["chosen"][:-1], tokenize=False, add_generation_prompt=True)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])
    return next((k for k, (a, b) in enumerate(zip(chosen, rejected)) if a != b), min(len(chosen), len(rejected)))
