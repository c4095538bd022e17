"""Our side of an RL fidelity check: run a recipe's real RL steps at ``scale=tiny`` and record what the source's step
is then fed and compared on (docs/fidelity.md).

    python -m tests.fidelity.ours_rl RECIPE OUT_DIR [--engine] [override ...]

Runs ``recipes.rl.setup`` and ``recipes.rl.rl_step`` unchanged; thin wrappers around the functions ``rl_step`` looks up
by name record their inputs and outputs. ``OUT_DIR/init/`` gets the policy before the first step (``save_pretrained``,
with the tokenizer: both sides load it) and ``OUT_DIR/ours.pt`` a record per RL step:

- ``prompts``: each prompt of the step as the data gave it (``data.template`` applied), before the chat template;
- ``input_ids [N, P+R]``, ``attention_mask``, ``response_mask [N, R]``, ``prompt_length``: the rollout;
- ``raw [N]``: the verifier's rewards; ``scores [N]``: the shaped rewards the advantages were computed from;
  ``advantages [N, R]``;
- ``order [N]``: the rows in the order the micro-batches take them (the mini-batch shuffle's draw), ``orders``:
  that of every PPO epoch;
- ``micro``: per micro-batch its rows, the per-token log-probs ``[n, R]`` (with grad, detached), the loss, and with
  a critic its value loss (``value_loss``, the coefficient in);
- ``grad_norm``, ``lr`` of each optimiser step, and ``weights``: the policy's state dict after the RL step; with a
  critic ``value_grad_norm`` of each step and ``value_weights`` (``init_critic/``: the critic before the first).

``--engine`` (an engine check, docs/fidelity.md "Engines"; under ``torchrun``): the recipe's own ZeRO node and the
dtype the overrides give (``model.dtype=bfloat16``: bf16 with fp32 master weights) in place of :data:`RUN`'s
single fp32 process without ZeRO. Each rank records its own rows as above; ``ours.pt`` then also holds ``ranks``
(every rank's steps, in rank order; rank r's rows are its contiguous slice of the step's group-major rows) and
``init``, and ``weights`` are DeepSpeed's fp32 master weights, gathered.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

from core.config import pipeline
from core.config.composition import compose
from core.data.prompts import format_prompt
from core.training import distributed
from recipes import rl, rl_update

# What every fidelity run sets: a single process on the CPU in fp32, no warm start (the checked step starts from the
# saved initial policy either way), nothing logged but the record. ZeRO is left out of the comparison: one process
# shards nothing, and TRL's and veRL's step code run here without DeepSpeed too (OpenRLHF's reward-model check runs
# DeepSpeed on the CPU, ZeRO-3 in one rank: tests/fidelity/openrlhf_rm.py).
RUN = ["scale=tiny", "device=cpu", "model.dtype=float32", "zero=none", "zero.offload_reference=false",
       "zero.offload_optimizer=false", "zero.offload_param=false", "zero.communication_data_type=null",
       "zero.grad_accum_dtype=null",
       "train.warm_start.enabled=false",
       "logger.progress=false", "logger.tensorboard=false", "train.eval_prompts=1", "train.eval_every=0",
       "train.total_steps=2"]


def engine_run(run: list[str]) -> list[str]:
    """``run`` less its ZeRO and dtype keys: an engine check runs the recipe's own ZeRO node (stage, offloading,
    DeepSpeed's dtypes, conf/recipe/RECIPE.yaml) at the dtype its overrides give."""
    return [o for o in run if not o.startswith(("zero=", "zero.", "model.dtype="))]


def master_weights(engine) -> dict | None:
    """Under DeepSpeed (an engine check: bf16 with fp32 master weights, ZeRO over ranks) the fp32 master weights of a
    :class:`~core.training.backend.TrainEngine`, gathered (``safe_get_full_fp32_param``, a collective: every rank
    calls it); None for the plain engine."""
    ds = getattr(engine, "engine", None)
    if ds is None:
        return None
    from deepspeed.utils import safe_get_full_fp32_param

    return {n.removeprefix("inner."): safe_get_full_fp32_param(p).detach().float().clone()
            for n, p in ds.module.named_parameters()}


def weights(engine) -> dict:
    """The weights a check compares: DeepSpeed's fp32 master weights, else the module's state dict."""
    return master_weights(engine) or {k: v.detach().clone() for k, v in engine.module.state_dict().items()}


def parse(argv: list[str], module: str) -> tuple[str, str, bool, list[str]]:
    """``RECIPE OUT_DIR [--engine] [override ...]`` (``python -m module``'s arguments): the recipe, the output folder,
    whether this is an engine check, its overrides."""
    if len(argv) < 2:
        sys.exit(f"usage: python -m {module} RECIPE OUT_DIR [--engine] [override ...]")
    engine = len(argv) > 2 and argv[2] == "--engine"
    return argv[0], argv[1], engine, list(argv[3:] if engine else argv[2:])


def keep_given(overrides: list[str]) -> None:
    """The overrides given are this run's command line: scale=tiny keeps their values (an engine check's
    ``model.dtype=bfloat16``), as it keeps a Hydra job's (core/config/scale.py ``command_line_keys``)."""
    pipeline.command_line_keys = lambda: tuple(o.split("=", 1)[0].lstrip("+") for o in overrides)


def _record(run: rl.Run, steps: list[dict]):
    """Wrap the names ``rl_step`` and ``update`` call so each RL step's inputs and outputs land in ``steps[-1]``."""
    take, adv_fn, score_fn = run.gen.take, rl.compute_advantages, rl.score
    order_fn, micro_fn, loss_fn, step_fn = (rl_update.epoch_order, rl_update.micro_step,
                                            rl_update.compute_policy_loss, rl_update.engines_step)

    def took(timer):
        idx, roll, made_by = take(timer)
        G = run.cfg.train.group_size  # the rows are group-major: G per prompt
        prompts = [format_prompt(run.data.train_rows[i]["prompt"], run.cfg.data) for i in idx[::G]]
        steps.append({"prompts": prompts, "input_ids": roll.input_ids.clone(),
                      "attention_mask": roll.attention_mask.clone(), "response_mask": roll.response_mask.clone(),
                      "prompt_length": roll.prompt_length, "micro": [], "grad_norm": [], "lr": []})
        return idx, roll, made_by

    def scored(run_, roll, rows, *args, **kwargs):
        out = score_fn(run_, roll, rows, *args, **kwargs)
        steps[-1]["raw"] = out.raw.detach().clone()
        return out

    def advantages(inp, cfg):
        adv, ret = adv_fn(inp, cfg)
        steps[-1].update(scores=inp.scores.detach().clone(), mask=inp.response_mask.clone(),
                         advantages=adv.clone())
        return adv, ret

    def order(run_, n, epoch):
        out = order_fn(run_, n, epoch)
        steps[-1]["order"] = out.clone()
        steps[-1].setdefault("orders", []).append(out.clone())
        return out

    def micro(run_, roll, sl, *args):
        steps[-1]["micro"].append({"rows": sl.clone()})
        m = micro_fn(run_, roll, sl, *args)
        steps[-1]["micro"][-1]["loss"] = float(m["loss"])
        if "value/loss" in m:
            steps[-1]["micro"][-1]["value_loss"] = float(m["value/loss"])
        return m

    def loss(inp, *args, **kwargs):
        steps[-1]["micro"][-1]["logprobs"] = inp.logprobs.detach().clone()
        return loss_fn(inp, *args, **kwargs)

    def stepped(run_):
        out = step_fn(run_)
        steps[-1]["grad_norm"].append(float(out["grad_norm"]))
        steps[-1]["lr"].append(float(out["lr"]))
        if "value/grad_norm" in out:
            steps[-1].setdefault("value_grad_norm", []).append(float(out["value/grad_norm"]))
        return out

    run.gen.take = took
    rl.compute_advantages, rl.score, rl_update.epoch_order, rl_update.micro_step = advantages, scored, order, micro
    rl_update.compute_policy_loss, rl_update.engines_step = loss, stepped


def main(argv: list[str]) -> None:
    recipe, out_dir, engine, overrides = parse(argv, "tests.fidelity.ours_rl")
    torch.set_num_threads(1)
    out = Path(out_dir)
    if engine:
        keep_given(overrides)
    cfg = compose([f"recipe={recipe}", f"recipe_name={recipe}", f"paths.results_dir={out}/results",
                   *(engine_run(RUN) if engine else RUN), *overrides])
    run = rl.setup(cfg, tempfile.mkdtemp(dir=out, prefix="run_"))  # rank 0's, broadcast
    run.engine.save_pretrained(out / "init", run.tokenizer)  # collective under ZeRO-3; rank 0 writes
    if run.critic is not None:
        run.critic.save_pretrained(out / "init_critic", run.tokenizer)
    init = weights(run.engine)
    steps: list[dict] = []
    _record(run, steps)
    for _ in range(run.plan.total_steps):
        rl.rl_step(run)
        run.step += 1
        steps[-1]["weights"] = weights(run.engine)
        if run.critic is not None:
            steps[-1]["value_weights"] = weights(run.critic)
    ranks = distributed.gather_objects([{k: v for k, v in s.items() if k != "weights"} for s in steps])
    if not distributed.is_main():
        return
    t = run.cfg.train  # the tiny scale's batch shape: the source runs the same one
    meta = {"recipe": recipe, "group_size": t.group_size, "micro_batch_size": t.micro_batch_size,
            "mini_batch_size": run.plan.mini_batch_per_rank, "grad_accum": run.plan.grad_accum,
            "logprob_micro_batch_size": t.logprob_micro_batch_size, "max_new_tokens": run.cfg.rollout.max_new_tokens,
            "temperature": run.cfg.rollout.temperature, "total_steps": run.plan.total_steps,
            "optimizer_steps": run.plan.total_steps * run.plan.optimizer_steps_per_rl_step,
            "pad_token_id": run.tokenizer.pad_token_id, "max_prompt_tokens": run.cfg.data.max_prompt_tokens,
            "zero_stage": int(run.cfg.zero.stage), "dtype": run.cfg.model.dtype, "world": distributed.world(),
            "rows": run.plan.samples_per_step}
    extra = {"ranks": ranks, "init": init} if engine else {}
    torch.save({"meta": meta, "steps": steps, **extra}, out / "ours.pt")


if __name__ == "__main__":
    main(sys.argv[1:])
