"""Which weights generate which batch, and when: generation one step ahead (``rollout.generate_ahead``).

Open-Instruct PPO's ``async_mode`` (``open_instruct/ppo_vllm_thread_ray_gtrl.py`` @3dd7a07d, on by default):
at each training step after the first the learners broadcast their weights to vLLM, hand the next step's
prompts to the generation thread (``param_prompt_Q.put``), and train on the responses of the prompts handed
over one step earlier (``response_ids_Q.get``), which vLLM generated while the previous step trained. The
batch trained is one policy version stale (Cleanba), and the PPO ratio is taken against log-probs the
learners recompute, so the sampler's lag is not importance-corrected. Per RL step ``t`` (1-based), the loop
(``recipes/rl.py`` ``rl_step``) draws the prompts and hands them over:

1. batch ``t``: if nothing is pending (step 1, ``generate_ahead: 0``, a resume without a saved batch), prompts
   ``t`` are drawn and started now (:meth:`GenerationAhead.start`); the pending batch is taken (:meth:`take`);
2. with ``generate_ahead: 1``, unless ``t`` is the last step, prompts ``t + 1`` are drawn and started with the
   current weights: a start first pushes them to the sampler, unless it holds them already (:meth:`push`);
3. (the loop) scoring, shaping, forwards, advantages and updates on batch ``t``.

So with ahead 1 the batch trained at step ``t + 1`` was generated from the weights after step ``t - 1``:
lag 0 at step 1, 1 from step 2 on. Open-Instruct's first step differs: it queues the first prompts twice
and trains on them at steps 1 and 2; here step 2 trains on prompts 2. With ahead 0 step 2 never runs and
step 1 is the loop's old order, push then generate. Any generation starts from the current weights (a
start pushes first), and a push first settles whatever is in flight: a sampler never gets new
weights mid-generation (a server would generate with weights being overwritten).

The policy version is the number of RL steps taken (each changes the weights once); the loop passes it in.
The version the sampler holds is not saved: a resumed process pushes before its first generation.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, fields
from typing import Any, Protocol

import torch

from core.rollout import Done, RolloutBatch, Sampling, keeps_weights, start_generate


class RolloutEngine(Protocol):
    """The members of a rollout engine (``rollout.engine``) that the loop and :class:`GenerationAhead` call; each
    is described in core/rollout/__init__.py, with the optional ``start_generate`` and ``keeps_weights``."""

    gathers_policy: bool
    collective: bool

    def sync_weights(self, engine) -> None: ...

    def generate(self, prompts: list[list[int]], sampling: Sampling) -> RolloutBatch: ...


@dataclass
class Pending:
    """A generation started and not yet trained on."""

    handle: Any  # .result() -> RolloutBatch; a Done once settled
    key: list[int]  # what names its prompts, as the loop drew them (this rank's prompt indices)
    version: int  # the policy version whose weights generate it


class GenerationAhead:
    """The generation pending for one rollout engine, started and taken by the loop (steps 1 and 2 above)."""

    def __init__(self, rollout: RolloutEngine):
        self.rollout = rollout
        self.pending: Pending | None = None
        self.pushed: int | None = None  # the version the sampler holds; None: unknown (just built or resumed)

    def start(self, engine, version: int, key: list[int], prompts: list[list[int]], sampling: Sampling,
              timer) -> None:
        """Start generating ``prompts`` (named ``key``) with the weights of ``version``, pushed first; the batch is
        pending until :meth:`take`. Every rank calls it."""
        if self.pending is not None:
            raise RuntimeError(f"start() at version {version} while the generation of version "
                               f"{self.pending.version} is pending: take() it first")
        self.push(engine, version, timer)
        # ZeRO-3 hf: the policy gathered whole for a generation that runs now; no-op for engines with their own copy
        with timer.phase("generate"), engine.gathered(self.rollout.gathers_policy):
            self.pending = Pending(start_generate(self.rollout, prompts, sampling), key, version)

    def take(self, timer) -> tuple[list[int], RolloutBatch, int]:
        """The pending batch, waited for: ``(key, batch, version that generated it)``; nothing is pending after.
        Every rank calls it."""
        if self.pending is None:
            raise RuntimeError("take() with no generation pending: start() one first")
        with timer.phase("generate"):  # a generation in flight is waited for here
            self.settle()
        taken, self.pending = self.pending, None
        return taken.key, taken.handle.result(), taken.version

    def push(self, engine, version: int, timer=None) -> None:
        """The weights of ``version`` into the sampler, after settling any generation in flight; skipped when the
        sampler holds them already (engines with ``keeps_weights``). Collective under ZeRO-3: every rank calls
        it, and all skip or all push (the version is the same on every rank)."""
        self.settle()
        with timer.phase("sync") if timer is not None else nullcontext():
            if self.pushed == version and keeps_weights(self.rollout):
                return
            self.rollout.sync_weights(engine)
            self.pushed = version

    def settle(self) -> None:
        """Wait for the pending generation, if any, and keep its batch (``result()`` called once, every rank)."""
        if self.pending is not None and not isinstance(self.pending.handle, Done):
            self.pending.handle = Done(self.pending.handle.result())

    def state(self) -> dict | None:
        """The pending generation, settled, for this rank's checkpoint file: its batch (tensors on the CPU),
        key and version; None when nothing is pending."""
        self.settle()
        if self.pending is None:
            return None
        batch = self.pending.handle.result()
        return {"key": self.pending.key, "version": self.pending.version,
                "batch": {f.name: _to(getattr(batch, f.name), "cpu") for f in fields(batch)}}

    def restore(self, state: dict | None, device) -> None:
        """The pending generation of :meth:`state`, its tensors on ``device``: the resumed run trains on it."""
        if state is None:
            self.pending = None
            return
        batch = RolloutBatch(**{k: _to(v, device) for k, v in state["batch"].items()})
        self.pending = Pending(Done(batch), state["key"], int(state["version"]))


def _to(value, device):
    return value.to(device) if torch.is_tensor(value) else value
