"""Rollout engines: sample completions for a batch of prompts, keyed by config name (``rollout.engine``).

``hf`` (Hugging Face ``generate`` on the training model, any device), ``vllm`` (:mod:`core.rollout.vllm`,
colocated, GPU only) and ``vllm_server`` (:mod:`core.rollout.server`, vLLM servers on GPUs of their own) are
declared in :data:`ROLLOUT_ENGINES`, each imported when asked for, each with its config checks. Every engine is
built from ``(model, tokenizer, rollout_cfg)``, and the loop calls the same members on each:

- ``sync_weights(engine)``: the optimiser engine's current weights into the sampler (``hf``: nothing to
  copy; ``vllm``: pushed one parameter at a time, each gathered alone under ZeRO-3). Every rank calls it;
- ``gathers_policy``: the loop holds the policy gathered whole around ``generate`` under ZeRO-3
  (``engine.gathered``); true only for ``hf`` with ``rollout.gather_for_generation``;
- ``collective``: ``generate`` takes part in collectives, so every rank calls it with as many prompts as the
  others, stand-ins filling a short share (``hf`` on partitioned ZeRO-3 weights: one synced generate per
  chunk; ``vllm`` with tensor parallelism; ``vllm_server``);
- ``generate(prompts, sampling)``: a :class:`core.rollout.batch.RolloutBatch`. ``sampling`` also names the batch's
  seed and this rank's first row (``vllm`` seeds each request from them, so a tensor-parallel group's ranks draw
  alike and a resume replays: core/rollout/batch.py ``row_seeds``) and whether the caller reads the log-probs (the
  batch's are None when not);
- ``start_generate(prompts, sampling)`` (optional): begin generating and return a handle whose ``result()`` is
  that batch (a server engine sends its request from a thread and returns at once). ``result()`` is called
  once, on every rank (it may take part in collectives), and no push happens between the start and it.
  Engines without one generate at once (:func:`start_generate`, the base behaviour);
- ``keeps_weights`` (optional, false when absent): the sampler holds the weights it was last pushed until the
  next push, so an unchanged policy needs none (``hf``: it samples from the training model itself). vLLM
  at sleep level 2 discards them after every ``generate``, so an engine that may drop them leaves it unset.

The loop drives these through :class:`core.rollout.ahead.GenerationAhead` (``rollout.generate_ahead``).
"""
from __future__ import annotations

from omegaconf import OmegaConf

from core.registry import Registry, installed
from core.rollout.batch import RolloutBatch, Sampling, sampling_seed  # noqa: F401  (the package's public types)


def vllm_problems(name: str, cfg, packages: bool = True) -> list[str]:
    """``vllm``: the ``rollout.vllm`` node, and vLLM installed (``packages=False``: not asked, recipes.explain)."""
    errors = []
    if cfg.rollout.vllm is None:
        errors.append("rollout.engine=vllm needs the rollout.vllm node: use the config option rollout=vllm")
    if packages and not installed("vllm"):
        errors.append("rollout.engine=vllm but vLLM is not installed here: install the gpu extra on a CUDA "
                      "machine (pip install -e '.[gpu]'), or generate with rollout=hf")
    return errors


def server_problems(name: str, cfg, packages: bool = True) -> list[str]:
    """``vllm_server``: TRL's client (``rollout.server.client=trl.*``) needs vLLM on the learners; a server's GPU is its
    own, so its memory share is of the card (``gpu_memory_utilization_of=free`` is a colocated engine's)."""
    client, errors = OmegaConf.select(cfg, "rollout.server.client"), []
    if str(client).startswith("trl.") and packages and not installed("vllm"):
        errors.append(f"rollout.engine=vllm_server with rollout.server.client={client}: TRL's client pushes weights "
                      f"through vLLM's NCCL weight transfer, so the learners need vLLM installed (the gpu extra)")
    if OmegaConf.select(cfg, "rollout.vllm.gpu_memory_utilization_of") == "free":
        errors.append("rollout.vllm.gpu_memory_utilization_of=free with rollout.engine=vllm_server: a server has its "
                      "GPU to itself and `vllm serve` takes a fraction of the card; use card (the default)")
    return errors


# Each engine's module is imported when the engine is first built: vllm's imports GPU-only packages, and no run pays
# for an engine it does not use. The checks sit here, so checking a config never imports an engine.
ROLLOUT_ENGINES: Registry = Registry("rollout.engine")
ROLLOUT_ENGINES.declare("hf", "core.rollout.hf:HFGenerateRollout")
ROLLOUT_ENGINES.declare("vllm", "core.rollout.vllm:VLLMRollout", check=vllm_problems)
ROLLOUT_ENGINES.declare("vllm_server", "core.rollout.server:ServerRollout", check=server_problems)


class Done:
    """The handle of a generation that has already run: what :func:`start_generate` gives for an engine that
    generates synchronously (``hf``, colocated ``vllm``), and what a settled handle becomes."""

    def __init__(self, batch: RolloutBatch):
        self.batch = batch

    def result(self) -> RolloutBatch:
        return self.batch


def start_generate(rollout, prompts: list[list[int]], sampling: Sampling):
    """Begin generating ``prompts``: the engine's own ``start_generate`` handle when it defines one, else the
    batch generated now, in a :class:`Done` handle. Either way ``.result()`` is the :class:`RolloutBatch`."""
    start = getattr(rollout, "start_generate", None)
    return start(prompts, sampling) if start is not None else Done(rollout.generate(prompts, sampling))


def keeps_weights(rollout) -> bool:
    """The engine's ``keeps_weights``: false unless it says so, so an engine that may drop its weights is pushed
    before every generation, as it always was."""
    return bool(getattr(rollout, "keeps_weights", False))


def build_rollout(name: str, model, tokenizer, cfg):
    """The engine ``name`` (``rollout.engine``; its module imported first) built from the policy and ``cfg``."""
    return ROLLOUT_ENGINES.get(name)(model, tokenizer, cfg)
