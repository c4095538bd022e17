"""The reward-model loop's schemas (recipes/rm.py): preference pairs, the Bradley-Terry loss, LoRA and the loop's
batches. Part of core/config/schema.py's typed schema (it re-exports them and stores them under ``schema/``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from omegaconf import MISSING

from core.config.ranges import NONNEG, OPT_POS, POS, above, at_least, between, ck, one_of, registered

# Both loops' train.keep_checkpoints and train.on_nonfinite (core/training/checkpoint.py, core/training/numerics.py):
# two checkpoints, so a newest one unreadable on resume falls back to the one before it; stop at a non-finite
# loss, gradient norm, advantage or reward (skip: no optimiser step for it, counted as nonfinite/skipped).
KEEP_CHECKPOINTS, ON_NONFINITE = 2, "stop"


@dataclass
class PairDataConfig:
    source: str = ck(MISSING, registered("core.data.preferences", "PAIR_SOURCES"))
    path: Optional[str] = MISSING
    hub_name: Optional[str] = MISSING
    split: str = MISSING
    published_rows: Optional[int] = ck(None, OPT_POS)  # source=hub: the train split's pairs as published (the planner)
    eval: str = ck(MISSING, one_of("holdout", "train_head", "source"))
    eval_fraction: float = ck(MISSING, between(0, 1, hi_open=True))
    eval_source: str = ck(MISSING, registered("core.data.preferences", "PAIR_SOURCES"))
    eval_path: Optional[str] = MISSING
    eval_hub_name: Optional[str] = MISSING
    eval_split: str = MISSING
    max_pairs: Optional[int] = ck(MISSING, OPT_POS)
    eval_max_pairs: Optional[int] = ck(MISSING, OPT_POS)
    seed: int = ck(MISSING, NONNEG)
    chosen_key: str = MISSING
    rejected_key: str = MISSING
    margin_key: Optional[str] = MISSING
    apply_chat_template: bool = MISSING
    chat_template_override: Optional[str] = MISSING  # set on the tokenizer in place of its own (Open-Instruct tulu)
    append_eos: bool = MISSING
    eos_separator: str = MISSING
    add_bos: bool = MISSING
    force_eos: bool = MISSING
    too_long: str = ck(MISSING, one_of("drop", "truncate"))
    max_prompt_tokens: Optional[int] = ck(MISSING, OPT_POS)
    length_filter_bug: bool = MISSING  # Open-Instruct release: only the prompt's length is checked
    bad_rows: str = ck(MISSING, one_of("drop", "error", "keep"))
    generator: Optional[Dict[str, Any]] = None
    tiny: Optional[Dict[str, Any]] = None


@dataclass
class RMLossConfig:
    use_margin: bool = False  # data.margin_key subtracted inside the sigmoid (OpenRLHF --margin_loss, TRL margin)
    center_coef: Optional[float] = ck(None, at_least(0, optional=True))  # + coef x mean((r_c + r_r)^2) (TRL); null: off


@dataclass
class LoraConfig:
    rank: int = ck(MISSING, NONNEG)  # 0: full fine-tuning
    alpha: float = ck(MISSING, above(0))
    dropout: float = ck(MISSING, between(0, 1, hi_open=True))
    target_modules: Any = MISSING
    task_type: Optional[str] = ck(MISSING, one_of("SEQ_CLS", None))  # peft task type; null: OpenRLHF's, head adapted


@dataclass
class RMTrainConfig:
    batch_size: int = ck(MISSING, POS)
    micro_batch_size: int = ck(MISSING, POS)
    epochs: int = ck(MISSING, POS)
    max_steps: Optional[int] = ck(MISSING, OPT_POS)
    max_len: int = ck(MISSING, POS)
    # The mean tokens of a chosen or rejected sequence the planner assumes (core/planning/step_time.py); null: max_len
    expected_len: Optional[int] = ck(None, OPT_POS)
    padding_side: str = ck(MISSING, one_of("left", "right"))
    head_init: str = ck(MISSING, registered("core.models.reward_model", "HEAD_INITS"))
    disable_dropout: bool = MISSING
    packing: bool = MISSING
    loss: RMLossConfig = field(default_factory=RMLossConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    eval_batch_size: int = ck(MISSING, POS)
    eval_before: bool = MISSING
    eval_every: int = ck(MISSING, NONNEG)
    checkpoint_every: int = ck(MISSING, NONNEG)
    keep_checkpoints: int = ck(KEEP_CHECKPOINTS, POS)  # as the RL loop's (core/config/schema.py)
    on_nonfinite: str = ck(ON_NONFINITE, one_of("stop", "skip"))
    tiny: Optional[Dict[str, Any]] = MISSING
