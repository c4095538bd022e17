"""The typed schema of ``python -m recipes.eval`` (conf/eval.yaml, the presets in conf/eval/, the sets in
conf/eval/catalog/), in Hydra's ConfigStore beside the training schema (core/config/schema.py).

The model, prompt format and rollout nodes reuse the training schemas, so a key means the same in both
(``data.template``, ``data.chat_template``, ``rollout.temperature``). ``sets`` is a free-form mapping (a set
can be added on the command line, ``+sets.mine={...}``, which a typed mapping refuses); each entry is checked
against :class:`EvalSetConfig` by core/evaluation/checks.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import MISSING

from core.config.ranges import NONNEG, OPT_POS, POS, ck, one_of, registered
from core.config.schema import ModelConfig, PathsConfig, PromptDataConfig


@dataclass
class EvalSetConfig:
    """One evaluation set: where its rows are, the columns holding question and gold answer, and how a
    completion is scored."""

    source: str = ck("file", one_of("file", "hub"))  # core/data/prompts.py SOURCES
    path: Optional[str] = None  # source=file: .jsonl, .jsonl.gz, .json or .parquet
    hub_name: Optional[str] = None  # source=hub: datasets.load_dataset name
    hub_config: Optional[str] = None
    split: str = "test"  # source=hub: the split read
    rows: Optional[List[int]] = None  # [start, stop) of the file's rows (null: all): a split inside one file
    prompt_key: str = "problem"  # a column, or a dotted path into nested ones
    question: str = ck("as_is", registered("core.evaluation.sets", "QUESTIONS"))  # the prompt from its row
    answer_key: Optional[str] = "answer"  # null: no gold column (the verifier reads others, e.g. unit tests)
    gold: str = ck("as_is", registered("core.evaluation.sets", "GOLDS"))  # the gold answer from its column
    verifier: str = "math"  # a registered verifier or module:function (verifiers.get_verifier)
    verifier_kwargs: Dict[str, Any] = field(default_factory=dict)
    accuracy_term: Optional[str] = None  # a weighted verifier's term that counts correct (null: its correctness term)
    columns: Optional[List[str]] = None  # row columns handed to the verifier besides `answer` (null: all)


@dataclass
class EvalConfig:
    """What a preset decides besides sampling (rollout.*) and prompt format (data.*)."""

    sets: List[str] = field(default_factory=list)  # names in `sets`
    samples: int = ck(1, POS)  # completions per problem (n), drawn as repeated prompts
    pass_k: List[int] = field(default_factory=list)  # k of each pass@k reported (sampling only)
    # null: a completion is correct when its verifier's correctness term says so (verifiers/correctness.py); a
    # number: when that term's reward is at least this
    pass_reward: Optional[float] = None
    stop: List[str] = field(default_factory=list)  # a completion ends before the first of these strings
    stop_token_ids: List[int] = field(default_factory=list)  # ... or at the first of these tokens
    verifiers: Dict[str, str] = field(default_factory=dict)  # a set's verifier -> the one this preset uses
    limit: Optional[int] = ck(None, OPT_POS)  # the first N problems of each set (null: all)


@dataclass
class EvalRunConfig:
    """conf/eval.yaml: the keys outside the groups."""

    seed: int = ck(MISSING, NONNEG)
    deterministic: bool = False  # torch's deterministic algorithms: as the training config's `deterministic`
    device: str = MISSING
    cpu_threads: int = ck(MISSING, NONNEG)
    preset: str = MISSING
    run_dir: Optional[str] = MISSING
    run_model: str = ck(MISSING, one_of("model", "best"))  # a run dir's final model/, or best/ (train.keep_best)
    paths: PathsConfig = field(default_factory=PathsConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: PromptDataConfig = field(default_factory=PromptDataConfig)
    rollout: Any = None
    eval: EvalConfig = field(default_factory=EvalConfig)
    sets: Dict[str, Any] = field(default_factory=dict)


def store() -> None:
    """Put the eval schema in Hydra's ConfigStore (idempotent) as ``schema/eval``."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(group="schema", name="eval", node=EvalRunConfig)
