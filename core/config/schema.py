"""The typed schema of every config key: Hydra structured configs (dataclasses in the ConfigStore).

Each group YAML names its schema at the top of its defaults list (``- /schema/train/rl@_here_``). A field gives its
key one type (Hydra refuses ``seed=abc`` while it composes) and, as ``check`` metadata, its range (probabilities in
[0, 1], positive sizes, enums): ``check_schema`` (core/config/checking.py) applies them to the final config (after
``scale``) and refuses keys no schema declares (``+train.unknown_key=1``, which Hydra lets through), before any model.
A key's default has one home: the field's default here, which no group option restates, or, for a field that is
``MISSING`` (``???``: required), the YAML of every option of its group; tests/core/test_one_home.py checks both.

A group with variants has one schema per variant (``train``: RL or reward-model loop; ``data``: prompts or
preference pairs; ``advantage``: one per estimator). Free-form nodes (``kwargs``, ``options``, a tiny model's
dimensions) are ``Dict[str, Any]``, checked where they are used.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import MISSING, DictConfig, OmegaConf

from core.config.ranges import (BOOL_OR_AUTO, NONNEG, OPT_POS, POS, above, at_least, between, ck, one_of,
                                registered)
from core.config.schema_rm import (KEEP_CHECKPOINTS, ON_NONFINITE, LoraConfig, PairDataConfig,  # noqa: F401
                                   RMLossConfig, RMTrainConfig)  # (re-exported)

# --- top level --------------------------------------------------------------------------------------------


@dataclass
class PathsConfig:
    data_dir: str = MISSING
    results_dir: str = MISSING


@dataclass
class Config:
    """conf/config.yaml: the keys outside any group. The groups are typed by their own schemas below."""

    loop: str = ck(MISSING, one_of("rl", "rm"))
    seed: int = ck(MISSING, NONNEG)
    # torch's deterministic algorithms for the whole process (core/training/checkpoint.py seed_everything):
    # on CUDA deterministic kernels and every torch.empty NaN-filled; a CPU run repeats bit for bit without it.
    deterministic: bool = False
    device: str = MISSING
    cpu_threads: int = ck(MISSING, NONNEG)
    # Seconds a rank waits in one collective before it fails (core/training/distributed.py init): a hung peer ends
    # the job after this; a dead one sooner (torchrun stops the group: docs/reliability.md "A dead rank"). 1800:
    # transformers' TrainingArguments.ddp_timeout (TRL's runs) and torch's gloo default; it must exceed the longest
    # wait of one rank for another (rank 0 saving a model, a generation server answering).
    collective_timeout_s: float = ck(1800.0, above(0))
    recipe_name: str = MISSING
    resume: Any = ck(MISSING, BOOL_OR_AUTO)
    resume_allow_changes: bool = MISSING
    paths: PathsConfig = field(default_factory=PathsConfig)
    model: Any = None
    data: Any = None
    rollout: Any = None
    advantage: Any = None
    loss: Any = None
    kl: Any = None
    optim: Any = None
    zero: Any = None
    verifier: Any = None
    train: Any = None
    logger: Any = None
    scale: Any = None
    layout: Any = None
    hardware: Any = None
    source: "SourceConfig" = field(default_factory=lambda: SourceConfig())  # what a named recipe reproduces


@dataclass
class SourceConfig:
    """The published run a recipe reproduces: ``name`` picks how ``python -m recipes.explain`` states the batch
    arithmetic in that framework's own flags; ``flags`` holds the source's values that our keys derive from
    (Open-Instruct ``total_episodes``); ``notes`` are printed as given (figures an article quotes differently)."""

    name: str = ck("none", registered("core.reporting.source_views", "SOURCE_VIEWS"))
    ref: str = ""  # repository, file and commit
    run: str = ""  # the published run (or command) the recipe reproduces, and what was published of it
    release: str = ""  # the framework release whose defaults fill what the source's file leaves unset
    # pinned: ``release``'s defaults | written: those of ``written_release``, the release pinned when the file was
    # written, as ``written_overrides`` ("key=value", applied before the scale; core/config/release.py)
    defaults: str = ck("pinned", one_of("pinned", "written"))
    written_release: str = ""
    written_overrides: List[str] = field(default_factory=list)
    flags: Dict[str, Any] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)


# --- model, data ------------------------------------------------------------------------------------------


@dataclass
class ModelConfig:
    name_or_path: Optional[str] = None  # hub name or local dir; null: build ``tiny`` locally
    arch: str = ck("qwen2", registered("core.models.loading", "ARCHITECTURES"))
    init_seed: int = ck(0, NONNEG)  # seed of a locally built model's random initialisation
    tiny: Optional[Dict[str, Any]] = None  # the locally built model's config fields (its architecture class's)
    dtype: str = ck("float32", one_of("float32", "bfloat16", "float16"))  # precision of the trained weights
    attn_implementation: str = ck("sdpa", one_of("eager", "sdpa", "flash_attention_2", "flash_attention_3"))
    gradient_checkpointing: bool = False  # recompute activations in backward: less memory, about 30% slower


@dataclass
class PromptDataConfig:
    source: str = ck("arithmetic", registered("core.data.prompts", "SOURCES"))
    path: Optional[str] = None  # source=file: .jsonl, .jsonl.gz, .json or .parquet (relative: to the project root)
    hub_name: Optional[str] = None  # source=hub: datasets.load_dataset(hub_name, hub_config, split)
    hub_config: Optional[str] = None
    split: str = "train"
    eval_path: Optional[str] = None  # the held-out rows' file (a generated source holds out rows of its own)
    eval_holdout: Optional[float] = ck(None, above(0, optional=True))  # train rows held out: N (>= 1) or a fraction (< 1)
    eval_split: str = "test"  # the held-out split (source=hub)
    eval_hub_name: Optional[str] = None  # source=hub: the eval split's dataset (its default config); null: hub_name
    published_rows: Optional[int] = ck(None, OPT_POS)  # source=hub: the train split's rows on its dataset card
    prompt_key: str = "prompt"  # a column, or a path into nested ones: "prompt.0.content"
    answer_key: Optional[str] = "answer"  # null: the rows have no gold answer (the verifier reads other columns)
    eval_prompt_key: Optional[str] = None  # null: prompt_key
    eval_answer_key: Optional[str] = None  # null: answer_key
    template: str = ck("{prompt}", lambda v: None if "{prompt}" in v else "a format string holding {prompt}")
    chat_template: bool = False  # the tokenizer's chat template over [{"role": "user", "content": prompt}]
    chat_template_override: Optional[str] = None  # a Jinja chat template in place of the tokenizer's
    system_prompt: Optional[str] = None  # a system message before the user's (chat_template only)
    max_prompt_chars: Optional[int] = ck(None, OPT_POS)  # longer formatted prompts dropped (SimpleRL-Zoo); null: none
    max_prompt_tokens: Optional[int] = ck(None, OPT_POS)  # after templating (null: no limit)
    prompt_overflow: str = ck("drop", one_of("drop", "truncate_left"))  # a prompt over max_prompt_tokens
    generator: Optional[Dict[str, Any]] = None  # a generated source's settings (source=arithmetic)
    tiny: Optional[Dict[str, Any]] = None  # what scale=tiny merges over this node


# --- rollout ----------------------------------------------------------------------------------------------


@dataclass
class VllmConfig:
    dtype: str = ck("bfloat16", one_of("bfloat16", "float16", "float32", "auto"))  # TRL 1.16 colocate's (docs/vllm.md)
    gpu_memory_utilization: float = ck(0.3, lambda v: None if 0 < v <= 1 else "a fraction in (0, 1]")
    # What gpu_memory_utilization is a fraction of (core/rollout/vllm_memory.py, docs/vllm.md): ``card``, the whole
    # GPU (stock vLLM, TRL); ``free``, the memory free once vLLM's weights and profile run are in, its KV cache that
    # share of it (veRL 0.2's vLLM 0.6.3 worker, SimpleRL-Zoo). Colocated engines only (rollout.engine=vllm).
    gpu_memory_utilization_of: str = ck("card", one_of("card", "free"))
    tensor_parallel_size: int = ck(1, POS)
    max_model_len: Optional[int] = ck(None, OPT_POS)
    seed: int = ck(0, NONNEG)  # rank r's engine: seed + r // tensor_parallel_size (TRL); requests carry their own
    enable_prefix_caching: bool = True
    enable_sleep_mode: bool = False  # free vLLM's GPU memory while the trainer runs (TRL vllm_enable_sleep_mode)
    sleep_level: int = ck(2, one_of(1, 2))  # 1: weights kept in CPU memory; 2: discarded (TRL's)
    max_num_seqs: Optional[int] = ck(None, OPT_POS)  # null: vLLM's default
    max_num_batched_tokens: Optional[int] = ck(None, OPT_POS)  # null: vLLM's default


@dataclass
class ServerConfig:
    """The vLLM servers of ``rollout.engine=vllm_server`` (one ``vllm serve`` per engine of a dedicated layout),
    as the trainer reaches them: engine ``j`` at ``http://hosts[j]:port+j``, its weight-transfer group at rank 0's
    ``group_port+j`` (TRL GRPOConfig ``vllm_server_host`` / ``vllm_server_port`` / ``vllm_group_port`` /
    ``vllm_server_timeout`` defaults)."""

    hosts: List[str] = field(default_factory=lambda: ["0.0.0.0"])
    port: int = ck(8000, between(1, 65535))
    group_port: int = ck(51216, between(1, 65535))
    timeout_s: float = ck(240.0, above(0))  # seconds the start-up health check waits for each server (TRL's)
    # Seconds each request to a server may take once it is up (a generation, a weight push, a cache reset), before
    # the run fails naming the server (core/rollout/server.py bound_requests; TRL's client waits forever). Below
    # collective_timeout_s: the other ranks wait in a collective while rank 0 waits on the server.
    request_timeout_s: float = ck(900.0, above(0))
    client: str = "trl.generation.vllm_client.VLLMClient"  # the client class: TRL's (tests name a CPU double)


@dataclass
class RolloutConfig:
    engine: str = ck(MISSING, registered("core.rollout", "ROLLOUT_ENGINES"))
    max_new_tokens: int = ck(MISSING, POS)
    # The mean completion the planner assumes (core/planning/step_time.py; a recipe sets its source's published
    # figure, cited); null: every completion runs to max_new_tokens. Generation is not capped by it.
    expected_new_tokens: Optional[int] = ck(None, OPT_POS)
    temperature: float = ck(MISSING, above(0))  # greedy rollouts are asked for by name: ``greedy``
    greedy: bool = MISSING
    top_p: float = ck(MISSING, lambda v: None if 0 < v <= 1 else "a number in (0, 1]")
    top_k: int = ck(MISSING, at_least(-1))  # 0 or -1 (vLLM's spelling): off
    generation_batch_size: int = ck(0, NONNEG)  # prompts x completions per generate call; 0: all at once
    stop_token_ids: List[int] = field(default_factory=list)  # end a completion as an EOS does, besides the EOS ids
    # ZeRO-3, hf engine: the policy gathered whole for generate (TRL ds3_gather_for_generation); false: layer by layer
    gather_for_generation: bool = True
    generate_ahead: int = ck(MISSING, one_of(0, 1))  # core/rollout/ahead.py: 1 = Open-Instruct PPO's async_mode
    vllm: Optional[VllmConfig] = None
    server: Optional[ServerConfig] = None


# --- algorithms -------------------------------------------------------------------------------------------

_ADV = registered("core.algorithms.advantage", "ADVANTAGES")
_WHITEN = registered("core.algorithms.advantage", "WHITENING")


@dataclass
class AdvantageConfig:
    """Keys every estimator has; each estimator's schema adds its own."""

    name: str = ck(MISSING, _ADV)
    whiten: str = ck(MISSING, _WHITEN)
    whiten_std: bool = True  # divide by the std when whitening (false: OpenRLHF --no_advantage_std_norm)
    # The token that carries the score (and the critic's target): last | after_last (Open-Instruct PPO).
    score_position: str = ck("last", registered("core.algorithms.advantage", "SCORE_POSITIONS"))


@dataclass
class GrpoAdvantageConfig(AdvantageConfig):
    std: str = MISSING  # choices per estimator: ADVANTAGES meta, checked in validate.py
    unbiased_std: bool = MISSING
    eps: float = ck(MISSING, above(0))


@dataclass
class ReinforcePPAdvantageConfig(AdvantageConfig):
    gamma: float = ck(MISSING, between(0, 1))


@dataclass
class CriticConfig:
    init_from: Optional[str] = None  # a reward model (Open-Instruct, OpenRLHF); null: the policy weights + a new head
    head_seed: int = ck(0, NONNEG)  # seed of the new head's N(0, 1/(hidden+1)) init (unused with init_from)
    lr: float = ck(MISSING, above(0))
    coef: float = ck(MISSING, NONNEG)
    clip: Optional[float] = ck(MISSING, above(0, optional=True))


@dataclass
class GaeAdvantageConfig(AdvantageConfig):
    gamma: float = ck(MISSING, between(0, 1))
    lam: float = ck(MISSING, between(0, 1))
    critic: CriticConfig = field(default_factory=CriticConfig)


@dataclass
class ISCorrectionConfig:
    mode: str = ck("none", registered("core.algorithms.loss", "IS_CORRECTIONS"))
    low: Optional[float] = ck(None, at_least(0, optional=True))  # lower bound of w (null: 0; OpenRLHF 0.5)
    high: Optional[float] = ck(3.0, above(0, optional=True))  # upper bound (TRL 3.0, OpenRLHF 5.0)


@dataclass
class LossConfig:
    name: str = ck(MISSING, registered("core.algorithms.loss", "POLICY_LOSSES"))
    clip_low: float = ck(MISSING, between(0, 1, hi_open=True))
    clip_high: float = ck(MISSING, NONNEG)
    dual_clip: Optional[float] = ck(None, above(1, optional=True))  # c > 1 (OpenRLHF --dual_clip, veRL 3); null: off
    entropy_coef: float = ck(0.0, NONNEG)  # entropy bonus (0: off; the entropy is logged either way)
    aggregation: str = ck(MISSING, registered("core.algorithms.loss", "AGGREGATIONS"))
    is_correction: ISCorrectionConfig = field(default_factory=ISCorrectionConfig)  # w = exp(logp_old - logp_sampler)
    log_ratio_clamp: Optional[float] = ck(MISSING, above(0, optional=True))  # |log pi/pi_old| bound before exp


@dataclass
class KLConfig:
    estimator: str = ck(MISSING, registered("core.algorithms.loss", "KL_ESTIMATORS"))
    coef: float = ck(MISSING, NONNEG)
    placement: str = ck(MISSING, one_of("reward", "loss"))
    reference: Any = ck("auto", BOOL_OR_AUTO)  # build the reference model: auto (iff coef > 0) | true | false
    controller: str = ck("fixed", registered("core.algorithms.kl_control", "KL_CONTROLLERS"))
    target: Optional[float] = ck(None, above(0, optional=True))  # adaptive controller (Ziegler et al. 2019): target KL
    horizon: int = ck(10000, POS)  # ... and horizon in samples (OpenRLHF --kl_target, --kl_horizon 10000)
    clamp: Optional[float] = ck(MISSING, above(0, optional=True))
    log_ratio_clamp: Optional[float] = ck(None, above(0, optional=True))  # |log pi/pi_ref| cap (veRL k3 20; null: none)


# --- optimisation, sharding -------------------------------------------------------------------------------


@dataclass
class OptimizerConfig:
    """A ``hydra.utils.instantiate`` target (``_partial_``: built on the parameters at run time). A key left
    null is not passed, so the optimiser's own default applies (SGD has no ``betas``); a key the target's
    signature lacks is refused (core/config/validate.py)."""

    _target_: str = "torch.optim.AdamW"
    _partial_: bool = True
    lr: float = ck(1e-6, above(0))
    betas: Optional[List[float]] = ck(None, lambda v: None if v is None or (len(v) == 2 and all(0 <= b < 1 for b in v))
                                      else "two numbers in [0, 1)")
    eps: Optional[float] = ck(None, above(0, optional=True))
    weight_decay: Optional[float] = ck(None, at_least(0, optional=True))
    fused: Optional[bool] = None
    momentum: Optional[float] = ck(None, between(0, 1, hi_open=True, optional=True))


@dataclass
class SchedulerConfig:
    name: str = ck("constant", registered("core.training.optim", "scheduler_names"))
    warmup_ratio: float = ck(0.0, between(0, 1))  # of the optimiser steps; wins over warmup_steps when set
    warmup_steps: int = ck(0, NONNEG)
    warmup_override_bug: bool = False  # Open-Instruct release: warmup = int(ratio x steps), warmup_steps ignored
    kwargs: Dict[str, Any] = field(default_factory=dict)  # more arguments ({min_lr_rate: 0.1}: cosine_with_min_lr)


@dataclass
class OptimConfig:
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    max_grad_norm: float = ck(1.0, NONNEG)  # 0: no clipping
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)


_DS_DTYPE = one_of(None, "fp16", "bf16", "fp32")  # DeepSpeed's names (runtime/config.py DtypeEnum); None: null


@dataclass
class ZeroConfig:
    stage: int = ck(MISSING, one_of(0, 1, 2, 3))
    offload_optimizer: bool = False  # optimiser state in CPU memory
    offload_param: bool = False  # ZeRO-3 only (validate.py): parameters in CPU memory
    offload_reference: bool = False  # ZeRO-3 only: the reference shards in CPU memory (OpenRLHF --ref_reward_offload)
    options: Dict[str, Any] = field(default_factory=dict)  # more zero_optimization keys, passed through
    # DeepSpeed keys outside zero_optimization; null: not written, DeepSpeed's default (the model's dtype)
    grad_accum_dtype: Optional[str] = ck(None, _DS_DTYPE)  # written as data_types.grad_accum_dtype
    communication_data_type: Optional[str] = ck(None, _DS_DTYPE)


@dataclass
class VerifierConfig:
    name: str = MISSING  # a registered verifier or ``module:function`` (checked by get_verifier)
    kwargs: Dict[str, Any] = MISSING
    text: str = ck("completion", registered("core.rollout.texts", "REWARD_TEXTS"))  # what the verifier reads
    eval_name: Optional[str] = None  # the greedy evaluation's verifier and its kwargs (null: name with kwargs)
    eval_kwargs: Dict[str, Any] = field(default_factory=dict)
    # The weighted reward's term that accuracy counts (verifiers/correctness.py); null: its one correctness term.
    accuracy_term: Optional[str] = None
    tiny: Optional[Dict[str, Any]] = None  # what scale=tiny merges over this node (local stand-ins' options)


# --- loops ------------------------------------------------------------------------------------------------


@dataclass
class ShapingConfig:
    none_reward: str = ck(MISSING, registered("core.algorithms.shaping", "NONE_REWARDS"))
    non_stop_penalty: Optional[float] = MISSING
    mask_truncated: bool = MISSING
    overlong_buffer: int = ck(MISSING, NONNEG)
    overlong_factor: float = ck(MISSING, NONNEG)
    reward_clip: Optional[List[float]] = ck(MISSING, lambda v: None if v is None or (len(v) == 2 and v[0] < v[1])
                                            else "[low, high] with low < high, or null")


@dataclass
class WarmStartConfig:
    enabled: Any = ck(MISSING, BOOL_OR_AUTO)  # auto: only on the recipe's own model and data (config/warm_start.py)
    steps: int = ck(MISSING, NONNEG)  # 0: none
    eval_every: int = ck(MISSING, POS)
    target_accuracy: float = ck(MISSING, between(0, 1))
    holdout: int = ck(MISSING, NONNEG)
    batch_size: int = ck(MISSING, POS)
    lr: float = ck(MISSING, above(0))
    seed: int = ck(MISSING, NONNEG)
    target: str = ck(MISSING, lambda v: None if "{answer}" in v else "a format string holding {answer}")


@dataclass
class RLTrainConfig:
    total_steps: Optional[int] = ck(MISSING, OPT_POS)  # null: train.epochs derives it
    epochs: Optional[int] = ck(MISSING, OPT_POS)  # passes over the training rows (rows // prompts_per_step steps each)
    prompts_per_step: int = ck(MISSING, POS)
    group_size: int = ck(MISSING, POS)
    mini_batch_size: int = ck(MISSING, POS)
    micro_batch_size: int = ck(MISSING, POS)
    ppo_epochs: int = ck(MISSING, POS)
    shuffle_mini_batches: bool = MISSING
    packing: Any = ck(MISSING, BOOL_OR_AUTO)
    logprob_micro_batch_size: int = ck(MISSING, POS)
    # Dropout of the policy and critic set to 0 (core.models.loading.for_training); each recipe sets its source's:
    # Open-Instruct disables it, TRL's GRPOConfig.disable_dropout is False (0.18, 1.16), veRL keeps the checkpoint's.
    disable_dropout: bool = False
    shaping: ShapingConfig = field(default_factory=ShapingConfig)
    eval_every: int = ck(MISSING, NONNEG)
    eval_prompts: int = ck(MISSING, NONNEG)  # 0: the whole eval split
    keep_best: bool = MISSING  # save the policy of the best held-out accuracy to best/ (reported beside the last)
    checkpoint_every: int = ck(MISSING, NONNEG)
    keep_checkpoints: int = ck(KEEP_CHECKPOINTS, POS)  # the newest checkpoint-<step>/ kept (HF save_total_limit)
    on_nonfinite: str = ck(ON_NONFINITE, one_of("stop", "skip"))  # a NaN/inf loss, grad norm, advantage or reward
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)


@dataclass
class WandbConfig:
    enabled: bool = False  # Weights & Biases (the wandb extra): one W&B run per run dir, a resume continues it
    project: str = "rl-recipes"
    entity: Optional[str] = None
    group: Optional[str] = None
    name: Optional[str] = None  # null: <recipe>/<run dir name>
    tags: List[str] = field(default_factory=list)
    mode: str = ck("offline", one_of("online", "offline", "disabled"))


@dataclass
class LoggerConfig:
    tensorboard: bool = MISSING
    progress: bool = MISSING
    samples_every: int = ck(MISSING, NONNEG)  # 0: no sample completions logged
    samples: int = ck(MISSING, NONNEG)
    wandb: WandbConfig = field(default_factory=WandbConfig)


@dataclass
class ScaleConfig:
    name: str = ck(MISSING, one_of("full", "tiny"))
    prompts_per_step: Optional[int] = ck(None, OPT_POS)
    max_group_size: Optional[int] = ck(None, OPT_POS)
    total_steps: Optional[int] = ck(None, OPT_POS)
    max_new_tokens: Optional[int] = ck(None, OPT_POS)
    zero_bucket_size: Optional[int] = ck(None, OPT_POS)  # DeepSpeed's bucket sizes, in elements (ZERO_BUCKETS)
    model: Optional[Dict[str, Any]] = None


@dataclass
class LayoutConfig:
    """GPUs of a run and who uses them (core/config/layout.py checks the combinations)."""

    mode: str = ck(MISSING, registered("core.config.layout", "MODES"))
    nodes: int = ck(MISSING, POS)
    gpus_per_node: int = ck(MISSING, POS)
    learner_gpus: int = ck(MISSING, POS)
    rollout_gpus: int = ck(MISSING, NONNEG)


@dataclass
class HardwareConfig:
    """The GPUs a recipe's source ran on (conf/hardware/), which ``python -m recipes.probe`` checks against: RL learners
    are ``layout.learner_gpus`` of them, the reward-model loop all ``nodes x gpus_per_node``."""

    name: str = MISSING  # the GPU model, as the source names it
    memory_gib: float = ck(MISSING, above(0))  # the card's total, as nvidia-smi reports it
    nodes: int = ck(MISSING, POS)
    gpus_per_node: int = ck(MISSING, POS)
    # The vendor's datasheet figures, per GPU and per direction (core/planning/step_time.py reads them; each YAML
    # cites its datasheet): dense bf16 tensor FLOP/s, memory bandwidth, the GPU-to-GPU link inside a node (NVLink,
    # else PCIe), the network out of a node per GPU, and the host link (CPU offload).
    bf16_tflops: float = ck(MISSING, above(0))
    memory_gbps: float = ck(MISSING, above(0))
    intra_node_gbps: float = ck(MISSING, above(0))
    inter_node_gbps: float = ck(MISSING, above(0))
    host_gbps: float = ck(MISSING, above(0))


# group/name under ``schema/`` -> dataclass; a group YAML names one in its defaults list.
SCHEMAS: dict[str, type] = {
    "config": Config,
    "model/model": ModelConfig,
    "data/prompts": PromptDataConfig,
    "data/pairs": PairDataConfig,
    "rollout/rollout": RolloutConfig,
    "advantage/grpo": GrpoAdvantageConfig,
    "advantage/plain": AdvantageConfig,
    "advantage/reinforce_pp": ReinforcePPAdvantageConfig,
    "advantage/gae": GaeAdvantageConfig,
    "loss/loss": LossConfig,
    "kl/kl": KLConfig,
    "optim/optim": OptimConfig,
    "zero/zero": ZeroConfig,
    "verifier/verifier": VerifierConfig,
    "train/rl": RLTrainConfig,
    "train/rm": RMTrainConfig,
    "logger/logger": LoggerConfig,
    "scale/scale": ScaleConfig,
    "layout/layout": LayoutConfig,
    "hardware/hardware": HardwareConfig,
}


def node(schema: type, values: dict | None = None, **kw) -> DictConfig:
    """One group's config outside a composed run (tests, benches, workers): the schema's defaults with
    ``values`` and ``kw`` merged over them, typed and checked like a composed one (a required field stays ``???``)."""
    return OmegaConf.merge(OmegaConf.structured(schema), values or {}, kw)
