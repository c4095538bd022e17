"""Our side of a reward-model fidelity check: run a recipe's real RM steps at ``scale=tiny`` on fixed pairs and record
what the source's step is then fed and compared on (docs/fidelity.md).

    python -m tests.fidelity.ours_rm RECIPE OUT_DIR [--engine] [override ...]

Runs ``recipes.rm.setup`` and ``recipes.rm.rm_step`` unchanged on the pairs of tests/fidelity/openrlhf/pairs.jsonl
(chat message lists, as the recipes' hub data; two run past the tiny ``max_len`` and one is the same on both sides);
thin wrappers around the names ``rm_step`` looks up record their inputs and outputs. ``OUT_DIR/init/`` gets the model
before the first step (``save_pretrained`` of the sequence-classification model with its score head, and the
tokenizer; a LoRA recipe's base weights, its adapter in ``init/adapter/``), and ``OUT_DIR/ours.pt``:

- ``init``: the full state dict before the first step (LoRA: peft's names, the adapter's initial A and B included);
- ``pairs``: the tokenized pairs (``chosen``/``rejected`` ids) in the order of the pairs file;
- per optimiser step, ``order``: the pairs it took (the sampler's draw); ``micro``: per micro-batch its pairs as a
  padded batch ``input_ids``/``attention_mask [2B, L]`` (chosen rows, then rejected, whether ``train.packing`` packed
  them or not), the rewards ``[2B]`` and the loss; ``grad_norm``, ``lr`` (one each), and ``weights``: the state dict
  after the step.

``--engine`` (an engine check under ``torchrun``, docs/fidelity.md "Engines"): the recipe's own ZeRO node at the
dtype the overrides give (tests/fidelity/ours_rl.py ``engine_run``); ``init`` and ``weights`` are then DeepSpeed's
fp32 master weights, and each step's ``micro`` every rank's micro-batches in rank order (``rank_orders``: the pairs
each rank took).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from core.config.composition import compose
from core.paths import PROJECT_ROOT
from recipes import rm
from tests.fidelity.ours_rl import RUN, engine_run, keep_given, parse, weights

PAIRS = PROJECT_ROOT / "tests" / "fidelity" / "openrlhf" / "pairs.jsonl"
# What every RM check sets on top of the RL checks' single fp32 CPU process (RUN, less its RL-only keys), through the
# ``tiny`` nodes that scale=tiny puts over data and train: the fixed pairs, all of them trained (OpenRLHF's eval split
# without --eval_dataset is the first 1% of train: none of 24 pairs), and the step count the pairs make (24 pairs // 8
# per step = 3: the schedule's horizon on both sides, OpenRLHF's ``len(dataset) // train_batch_size``).
RM_RUN = [o for o in RUN if not o.startswith(("train.", "zero.offload_reference"))] + [
    "data.tiny.source=file", f"data.tiny.path={PAIRS}", "data.tiny.eval=train_head", "data.tiny.eval_fraction=0.01",
    "data.tiny.eval_max_pairs=null", "train.tiny.max_steps=null", "train.eval_before=false"]


class _Hydra:
    """The run dir a Hydra job would have: ``rm.setup`` reads it from Hydra (a composed config has no job)."""

    dir = ""

    @classmethod
    def get(cls):
        return type("H", (), {"runtime": type("R", (), {"output_dir": cls.dir})})


def _record(run: rm.Run, steps: list[dict]) -> None:
    """Wrap the names ``rm_step`` calls so each optimiser step's inputs and outputs land in ``steps[-1]``."""
    draw, make, loss_fn, step_fn = run.data.sampler.next, rm.make_batch, rm.RM.bt_loss, run.engine.step
    rewards_fn = rm.RM.sequence_rewards

    def drawn():
        idx = draw()
        steps.append({"order": list(idx), "micro": [], "grad_norm": [], "lr": []})
        return idx

    def made(run_, pairs):
        # the micro-batch as a padded batch (what runs unless train.packing; packed, the same tokens in one row)
        padded = rm.RM.pair_batch(pairs, run_.tokenizer.pad_token_id, run_.cfg.train.padding_side)
        steps[-1]["micro"].append({k: padded[k] for k in ("input_ids", "attention_mask")})
        return make(run_, pairs)

    def rewards(model, batch):
        r = rewards_fn(model, batch)  # [2B]
        if model.training:
            steps[-1]["micro"][-1]["rewards"] = r.detach().clone()
        return r

    def loss(r, margin, cfg):
        out = loss_fn(r, margin, cfg)
        steps[-1]["micro"][-1]["loss"] = float(out[0].detach())
        return out

    def stepped():
        out = step_fn()
        steps[-1]["grad_norm"].append(float(out["grad_norm"]))
        steps[-1]["lr"].append(float(out["lr"]))
        return out

    run.data.sampler.next, run.engine.step = drawn, stepped
    rm.make_batch, rm.RM.bt_loss, rm.RM.sequence_rewards = made, loss, rewards


def save_init(run: rm.Run, out: Path) -> dict:
    """The model before the first step: ``init/`` (the sequence-classification model with its score head, and the
    tokenizer; under LoRA its base weights, with the adapter in ``init/adapter/``); returns the full state dict."""
    module = run.engine.module
    state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    if hasattr(module, "peft_config"):  # peft: base weights under their own names, then the adapter
        base = module.get_base_model()
        weights = {k.replace(".base_layer.", "."): v for k, v in base.state_dict().items() if "lora_" not in k}
        base.save_pretrained(out / "init", state_dict=weights)
        module.save_pretrained(out / "init" / "adapter")
        run.tokenizer.save_pretrained(out / "init")
    else:
        run.engine.save_pretrained(out / "init", run.tokenizer)
    return state


def gathered_steps(steps: list[dict]) -> list[dict]:
    """Every rank's micro-batches of each step, in rank order, and the pairs each rank took (``rank_orders``)."""
    from core.training import distributed

    every, w = distributed.gather_objects([s["micro"] for s in steps]), distributed.world()
    # rank r trains the pairs order[r::w] of the step's draw (recipes/rm.py rm_step)
    return [{**s, "micro": [m for r in every for m in r[i]], "rank_orders": [s["order"][r::w] for r in range(w)]}
            for i, s in enumerate(steps)]


def main(argv: list[str]) -> None:
    recipe, out_dir, engine, overrides = parse(argv, "tests.fidelity.ours_rm")
    torch.set_num_threads(1)
    out = Path(out_dir)
    _Hydra.dir = str(out / "run")
    rm.HydraConfig = _Hydra
    keep_given(overrides)
    cfg = compose([f"recipe={recipe}", f"recipe_name={recipe}", f"paths.results_dir={out}/results",
                   *(engine_run(RM_RUN) if engine else RM_RUN), *overrides])
    run = rm.setup(cfg)
    init = save_init(run, out)
    init = weights(run.engine) if engine else init  # the fp32 master weights (LoRA: save_init's peft names)
    steps: list[dict] = []
    _record(run, steps)
    while run.step < run.plan.total_steps:
        rm.rm_step(run)
        run.step += 1
        steps[-1]["weights"] = weights(run.engine)
    steps = gathered_steps(steps)
    from core.training import distributed
    if not distributed.is_main():
        return
    t, d = run.cfg.train, run.cfg.data
    meta = {"recipe": recipe, "batch_size": t.batch_size, "micro_batch_size": t.micro_batch_size,
            "grad_accum": run.plan.grad_accum, "max_len": t.max_len, "total_steps": run.plan.total_steps,
            "padding_side": t.padding_side, "packing": t.packing, "use_margin": t.loss.use_margin,
            "lora": dict(t.lora), "head_init": t.head_init, "seed": run.cfg.seed, "pairs": str(d.path),
            "chosen_key": d.chosen_key, "rejected_key": d.rejected_key, "apply_chat_template": d.apply_chat_template,
            "optimizer": {k: run.cfg.optim.optimizer[k] for k in ("lr", "betas", "eps", "weight_decay")},
            "scheduler": dict(run.cfg.optim.scheduler), "max_grad_norm": run.cfg.optim.max_grad_norm,
            "zero_stage": run.cfg.zero.stage, "dtype": run.cfg.model.dtype, "world": distributed.world()}
    pairs = [{"chosen": p["chosen"], "rejected": p["rejected"]} for p in run.data.train_pairs]
    meta = json.loads(json.dumps(meta))  # plain containers: the source's env cannot unpickle our FrozenConfig
    torch.save({"meta": meta, "init": init, "pairs": pairs, "steps": steps}, out / "ours.pt")


if __name__ == "__main__":
    main(sys.argv[1:])
