"""The reward-model lines of ``python -m recipes.explain`` (recipes/explain.py ``EXPLANATIONS``): the plan of a
``loop: rm`` recipe (core/config/plan.py ``RMPlan``) as recipes/rm.py runs it. One optimiser step takes
``train.batch_size`` pairs, each learner its share as micro-batches of ``train.micro_batch_size`` pairs accumulated;
each pair is two sequences (chosen and rejected in one forward). The pairs are counted after the text checks and the
length filter where the data and tokenizer are here (a local file, generated pairs, ``scale=tiny``); a hub dataset only
with ``--count-rows``, which downloads it."""
from __future__ import annotations

from dataclasses import dataclass

from recipes.explain import COUNT_ROWS


@dataclass(frozen=True)
class Pairs:
    """Training pairs after the filters (None: not counted, ``why`` says why) and their mean tokens per pair
    (chosen + rejected; None where they were not tokenized)."""

    rows: int | None
    why: str = ""
    mean_tokens: float | None = None


def rm_explanation(prepared, count: bool) -> list[str]:
    """The lines of a prepared RM config; raises the data's own error when the pairs make no optimiser step."""
    cfg, pairs = prepared.config, counted_pairs(prepared.config, count)
    plan = prepared.plan if pairs.rows is None else prepared.plan.for_rows(pairs.rows)
    lay = plan.layout
    out = [f"recipe {cfg.recipe_name}" + (f"  (source: {cfg.source.ref})" if cfg.source.ref else ""),
           f"GPUs: {plan.world_size} learner GPU(s) on {lay.nodes} node(s) x {lay.gpus_per_node}; a reward model: "
           f"no rollout",
           f"one optimiser step: train.batch_size {plan.batch_size} pairs = {2 * plan.batch_size} sequences "
           f"(chosen and rejected of a pair in one forward)",
           f"  per learner: {plan.pairs_per_rank} pairs = train.micro_batch_size {plan.micro_batch_size} x "
           f"{plan.grad_accum} accumulated ({plan.batch_size} / ({plan.micro_batch_size} x {plan.world_size} "
           f"learners))"]
    out += token_lines(cfg, plan, pairs)
    out += run_lines(cfg, plan, pairs)
    return out


def token_lines(cfg, plan, pairs: Pairs) -> list[str]:
    """Tokens one optimiser step holds: the bound ``train.max_len`` sets, or why there is none; measured when the
    pairs were tokenized here."""
    t, d, seqs = cfg.train, cfg.data, 2 * plan.batch_size
    if d.length_filter_bug and d.too_long == "drop":
        limit = f"its prompt is within data.max_prompt_tokens {d.max_prompt_tokens}" if d.max_prompt_tokens else \
            f"its chosen side is within train.max_len {t.max_len}"
        out = [f"tokens per step: not bounded by train.max_len: data.length_filter_bug keeps a pair whole when {limit}"]
    else:
        cut = "cut" if d.too_long == "truncate" else "dropped"
        out = [f"tokens per step: at most {seqs} sequences x train.max_len {t.max_len} = {seqs * t.max_len} (longer "
               f"pairs are {cut}: data.too_long={d.too_long})"]
    layout = "packed: the real tokens only" if t.packing else "padded: each micro-batch to its longest sequence"
    out.append(f"  train.packing={str(t.packing).lower()} ({layout})")
    if pairs.mean_tokens is not None:
        out.append(f"  measured: {pairs.mean_tokens:.1f} tokens per pair (chosen + rejected) -> about "
                   f"{pairs.mean_tokens * plan.batch_size:.0f} real tokens per step")
    return out


def run_lines(cfg, plan, pairs: Pairs) -> list[str]:
    """The pairs, steps per epoch (both sources floor ``pairs // batch_size``) and the run's optimiser steps."""
    if pairs.rows is None:
        return [f"data: training pairs not counted here -> {plan.epochs} epoch(s) x (pairs // {plan.batch_size}) "
                f"optimiser steps" + (f", at most train.max_steps {plan.max_steps}" if plan.max_steps else ""),
                f"  (pairs: {pairs.why})"]
    per_epoch = pairs.rows // plan.batch_size
    out = [f"data: {pairs.rows} training pairs after the filters -> {per_epoch} optimiser steps per epoch "
           f"(batch_size {plan.batch_size}, last partial batch dropped)"]
    if pairs.why:
        out.append(f"  (pairs: {pairs.why})")
    capped = f", capped by train.max_steps {plan.max_steps}" if plan.epochs * per_epoch > plan.total_steps else ""
    out.append(f"run: {plan.total_steps} optimiser steps = train.epochs {plan.epochs} x {per_epoch}{capped}; schedule "
               f"{cfg.optim.scheduler.name} over {plan.total_steps}, warmup {plan.warmup}")
    return out


def counted_pairs(cfg, count: bool) -> Pairs:
    """Training pairs after the text checks and, where the tokenizer loads here, the length filter (recipes/rm.py
    ``setup`` reads them the same way). A hub dataset is read only when ``count``."""
    from core.data import preferences as PD

    d = cfg.data
    if d.source == "hub" and not count:
        return Pairs(None, f"{d.hub_name} is not downloaded to count them ({COUNT_ROWS} does)")
    try:
        rows, _, stats = PD.load_pairs(d)
    except Exception as e:  # noqa: BLE001 (a hub dataset offline, a missing file: explained, not fatal)
        return Pairs(None, f"{type(e).__name__}: {e}")
    try:
        from core.models.loading import load_tokenizer, model_dir

        tokenizer = load_tokenizer(model_dir(cfg.model))
        PD.force_chat_template(tokenizer, d)
        pairs = PD.tokenize_pairs(rows, tokenizer, d, cfg.train.max_len, stats["train"])
    except Exception as e:  # noqa: BLE001
        return Pairs(len(rows), f"before the length filter (tokenizer not loadable here: {type(e).__name__})")
    mean = sum(len(p["chosen"]) + len(p["rejected"]) for p in pairs) / len(pairs) if pairs else None
    return Pairs(len(pairs), "", mean)
