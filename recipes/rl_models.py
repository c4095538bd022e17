"""The models of an RL run (``recipes/rl.py`` ``setup``): the policy's start (its checkpoint, or that checkpoint after
the supervised warm start when the plan runs one), then every model the plan names, loaded where the backend places
it, the trained ones in their optimiser engines. Each phase is announced in the log (console and ``run.log``).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from core.config.frozen import FrozenConfig
from core.config.plan import RLPlan
from core.models.critic import load_critic
from core.models.loading import for_training, load_causal_lm
from core.models.warm_start import warm_started_dir
from core.reporting.console import announced
from core.training.backend import Backend

if TYPE_CHECKING:
    import torch

    from verifiers import VerifierFn

log = logging.getLogger(__name__)


def policy_start(cfg, plan: RLPlan, path: str, data, verifier: VerifierFn, device: torch.device) -> str:
    """The policy's checkpoint: ``path``, or, when ``plan.warm_start`` (core/config/warm_start.py), ``path`` after
    up to ``train.warm_start.steps`` supervised steps on the training rows' answers (cached: built once)."""
    if not plan.warm_start:
        return path
    ws = cfg.train.warm_start
    answers = [r["answer"] for r in data.train_rows]
    with announced(log, f"warm start: up to {ws.steps} supervised steps on {len(answers) - ws.holdout} training "
                        f"answers, checked every {ws.eval_every} on {ws.holdout} held-out training prompts") as said:
        out = warm_started_dir(path, cfg.model, ws, data.train_ids, answers, device, verifier,
                               cfg.rollout.max_new_tokens)  # cached: built once
        last = json.loads((Path(out) / "warm_start.json").read_text())["rounds"][-1]
        said.append(f"stopped at step {last['step']}, held-out training accuracy {last['accuracy']:.3f} (target "
                    f"{ws.target_accuracy}), saved in {out}")
    return str(out)


def setup_models(cfg, plan: RLPlan, backend: Backend, path: str):
    """``(policy engine, critic engine or None, reference weights or None)``: every model loaded by the backend, the
    trained ones in their optimiser engines, the schedule over the run's optimiser steps."""
    with announced(log, f"building models: {', '.join(m.role for m in plan.models)} from {path}"):
        policy, ref, critic = load_models(cfg, plan, path, backend)
        updates, micro, per = plan.total_optimizer_steps, cfg.train.micro_batch_size, plan.optimizer_steps_per_step
        policy = backend.train_engine(policy, cfg.optim, updates, plan.grad_accum, micro, per)
        if critic is not None:
            critic = backend.train_engine(critic, critic_optim(cfg), updates, plan.grad_accum, micro, per)
    return policy, critic, ref


def load_models(cfg, plan: RLPlan, path: str, backend: Backend):
    """``(policy, reference or None, critic or None)`` from ``path``, the models ``plan.models`` names (the reference
    only when the KL needs one, the critic only for an estimator with values), as the loop trains them (``python -m
    recipes.probe`` builds them the same way, on a backend that keeps them whole), each built where ``backend``
    places it (ZeRO-3: partitioned as it loads, the reference under its own ``zero.offload_reference``). Train mode:
    transformers checkpoints gradients only there, and from_pretrained returns eval mode; the no-grad passes and
    generation switch to eval and back. The reference stays in eval (``backend.frozen``)."""
    with backend.placed():
        policy = for_training(load_causal_lm(path, cfg.model), cfg.train.disable_dropout)
    with backend.placed(reference=True):
        ref = load_causal_lm(path, cfg.model) if plan.model("reference") else None  # beta = 0: none at all
    with backend.placed():
        critic = (for_training(load_critic(path, cfg.advantage.critic, cfg.model, backend.writable),
                               cfg.train.disable_dropout) if plan.model("critic") else None)
    return policy, ref, critic


def critic_optim(cfg) -> FrozenConfig:
    """The policy's optimiser settings with the critic's own learning rate (``advantage.critic.lr``)."""
    lr = cfg.advantage.critic.lr
    return FrozenConfig({**cfg.optim, "optimizer": FrozenConfig({**cfg.optim.optimizer, "lr": lr})})
