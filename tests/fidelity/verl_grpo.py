"""veRL's side of a SimpleRL-Zoo fidelity check, run in the veRL 0.2.0.post2 env (tests/fidelity/envs.sh verl).

    python tests/fidelity/verl_grpo.py SOURCE_YAML OURS_DIR [GIVEN_JSON]   (the harness's; veRL's checks take none)
    torchrun --nproc_per_node 2 tests/fidelity/verl_grpo.py SOURCE_YAML OURS_DIR '{"engine": {"dtype": "bfloat16"}}'

veRL's trainer needs Ray, FSDP and vLLM on GPUs; its step code does not. This drives that code as
``RayPPOTrainer.fit`` and ``ActorRolloutRefWorker`` call it, on the initial policy our run saved (``OURS_DIR/init``)
and our recorded completions and scores: ``DataParallelPPOActor.compute_log_prob`` for the old and reference
log-probs, the reward manager's layout (the score on the last response token, naive.py), ``core_algos
.compute_grpo_outcome_advantage`` with a group id per prompt, then ``DataParallelPPOActor.update_policy`` (its own
mini-batch split, micro-batches, policy loss, entropy bonus, low_var_kl loss, accumulation and clipping) and the
worker's scheduler step. The optimiser and scheduler are built as fsdp_workers.py ``_build_model_optimizer`` builds
them (three lines; the worker itself needs FSDP on CUDA). Writes ``OURS_DIR/verl.pt`` (fields as in ours.pt).

On the CPU: fp32 (the source computes in bf16 under FSDP mixed precision), ``TensorDict.cuda`` is the identity
(``update_policy`` moves each micro-batch to CUDA), and the padded forward (``use_remove_padding`` False; the script's
True packs the same tokens for flash-attn's varlen kernels).

An engine check (GIVEN_JSON ``engine``, under ``torchrun``; docs/fidelity.md "Engines") runs veRL's FSDP engine
instead, built by its own worker code (tests/fidelity/verl_fsdp.py): bf16 compute over fp32 master weights, FULL_SHARD
over the ranks, each rank on our rank's rows (its contiguous chunk of the step, as veRL dispatches the batch), the
advantages computed over every rank's rows (as ``RayPPOTrainer.fit`` does on the driver). ``verl.pt`` then holds
``ranks``: every rank's steps, in rank order, and ``steps`` rank 0's with the gathered fp32 weights.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from omegaconf import OmegaConf
from tensordict import TensorDict
from transformers import AutoModelForCausalLM

import verl
from verl import DataProto
from verl.trainer.ppo import core_algos
from verl.utils.model import compute_position_id_with_mask
from verl.utils.torch_functional import get_constant_schedule_with_warmup
from verl.workers.actor.dp_actor import DataParallelPPOActor

TensorDict.cuda = lambda self, *a, **k: self  # no CUDA here: the batch stays on the CPU


def actor_config(src: dict, meta: dict) -> tuple:
    """The actor's and the reference's configs as fsdp_workers.py normalises them (mini-batch in responses per GPU,
    micro-batch per GPU), with the tiny scale's batch shape."""
    actor = OmegaConf.create({**src["actor"], "ppo_mini_batch_size": meta["mini_batch_size"],
                              "ppo_micro_batch_size_per_gpu": meta["micro_batch_size"], "use_remove_padding": False})
    ref = OmegaConf.create({"ulysses_sequence_parallel_size": 1, "use_remove_padding": False})
    return actor, ref


def load(path: Path, train: bool):
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="sdpa")
    if train:  # fsdp_workers.py: enable_gradient_checkpointing
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.requires_grad_(False)
    return model


def batch(s: dict, meta: dict) -> DataProto:
    """The rollout as veRL's batch: prompt and response ids, the attention mask over both, position ids from it."""
    P = s["prompt_length"]
    ids, am = s["input_ids"], s["attention_mask"]
    return DataProto.from_dict(
        tensors={"input_ids": ids, "attention_mask": am, "position_ids": compute_position_id_with_mask(am),
                 "responses": ids[:, P:], "prompts": ids[:, :P]},
        meta_info={"temperature": meta["temperature"], "micro_batch_size": meta["logprob_micro_batch_size"],
                   "use_dynamic_bsz": False})


def rank_advantages(per_rank: list[dict], meta: dict, rank: int) -> torch.Tensor:
    """Rank ``rank``'s rows of veRL's advantages over a whole step: ``RayPPOTrainer.fit`` computes them on the driver
    over every row (a group may span ranks), then dispatches each worker its contiguous chunk. ``per_rank``: the
    step's record of each rank (rows in rank order, each rank's responses padded to its own length)."""
    R = max(s["attention_mask"].shape[1] - s["prompt_length"] for s in per_rank)
    masks = [s["attention_mask"][:, s["prompt_length"]:] for s in per_rank]  # [n_r, R_r] each
    whole = {"prompt_length": 0, "scores": torch.cat([s["scores"] for s in per_rank]),
             "attention_mask": torch.cat([F.pad(m, (0, R - m.shape[1])) for m in masks])}  # [N, R]
    first = sum(m.shape[0] for m in masks[:rank])
    mine = masks[rank]
    return advantages(whole, meta)[first:first + mine.shape[0], :mine.shape[1]]  # [n_r, R_r]


def advantages(s: dict, meta: dict) -> torch.Tensor:
    """The recorded scores through veRL's reward layout and its GRPO estimator (a uid per prompt, as fit draws)."""
    mask = s["attention_mask"][:, s["prompt_length"]:]  # [N, R] veRL's response mask
    rewards = torch.zeros(mask.shape, dtype=torch.float32)  # [N, R]
    rows = torch.arange(mask.shape[0])
    rewards[rows, mask.sum(-1) - 1] = s["scores"].float()  # naive.py: reward_tensor[i, valid_response_length - 1]
    uid = np.array([f"p{i // meta['group_size']}" for i in range(mask.shape[0])], dtype=object)
    adv, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, uid)  # [N, R]
    return adv


def instrument(actor: DataParallelPPOActor, scheduler, record: list[dict]) -> None:
    """Record each micro-batch's log-probs (with grad) and loss, and the lr of each optimiser step."""
    forward, step, backward = actor._forward_micro_batch, actor._optimizer_step, torch.Tensor.backward

    def fwd(micro_batch, temperature):
        entropy, logp = forward(micro_batch, temperature)
        if torch.is_grad_enabled():
            record[-1]["micro"].append({"logprobs": logp.detach().clone()})
        return entropy, logp

    def bwd(self, *args, **kwargs):  # update_policy's loss.backward(): loss = policy_loss / gradient_accumulation
        record[-1]["micro"][-1]["loss"] = float(self) * actor.gradient_accumulation
        return backward(self, *args, **kwargs)

    def opt_step():
        record[-1]["lr"].append(float(scheduler.get_last_lr()[0]))
        return step()

    actor._forward_micro_batch, actor._optimizer_step, torch.Tensor.backward = fwd, opt_step, bwd


def schedule(optimizer, src: dict, meta: dict):
    """The worker's schedule as fsdp_workers.py ``_build_model_optimizer`` builds it: veRL's constant-with-warmup over
    ``int(lr_warmup_steps_ratio x total_training_steps)`` warmup steps, where ``total_training_steps`` counts RL steps
    (ray_trainer.py); the loop below steps it once per RL step, as ``update_actor`` does. Its lr lambda at step 0 is
    min(1, 0 / max(1, warmup)) = 0, so with warmup 0 the first RL step trains at lr 0 (SimpleRL-Zoo's fork has the same
    torch_functional.py and worker); our recipes reproduce it (``optim.scheduler.name: verl_constant``)."""
    warmup = int(src["actor"]["optim"]["lr_warmup_steps_ratio"] * meta["total_steps"])
    return get_constant_schedule_with_warmup(optimizer=optimizer, num_warmup_steps=warmup)


def run_steps(actor, ref, scheduler, steps: list[dict], meta: dict, step_advantages, weights) -> list[dict]:
    """The RL steps as ``RayPPOTrainer.fit`` and the worker run them on our recorded rollouts: old and reference
    log-probs, the advantages (``step_advantages(i, s)``), ``update_policy``, the scheduler step; what each computed,
    and ``weights()`` after each step."""
    record: list[dict] = []
    instrument(actor, scheduler, record)
    for i, s in enumerate(steps):
        data = batch(s, meta)
        data.batch["old_log_probs"] = actor.compute_log_prob(data)
        data.batch["ref_log_prob"] = ref.compute_log_prob(data)
        data.batch["advantages"] = step_advantages(i, s)
        record.append({"advantages": data.batch["advantages"].clone(), "micro": [], "lr": []})
        metrics = actor.update_policy(data)
        scheduler.step()  # fsdp_workers.py update_actor: once per update_policy
        record[-1]["grad_norm"] = [float(g) for g in metrics["actor/grad_norm"]]
        record[-1]["weights"] = weights()
    return record


def run_plain(src: dict, ours_dir: Path, rec: dict) -> dict:
    """fp32 in one process, the models unwrapped; the optimiser and schedule built as fsdp_workers.py builds them."""
    meta = rec["meta"]
    policy, reference = load(ours_dir / "init", True), load(ours_dir / "init", False)
    o = src["actor"]["optim"]
    optimizer = torch.optim.AdamW(policy.parameters(), lr=o["lr"], betas=o.get("betas", (0.9, 0.999)),
                                  weight_decay=o.get("weight_decay", 1e-2))
    scheduler = schedule(optimizer, src, meta)
    actor_cfg, ref_cfg = actor_config(src, meta)
    actor, ref = DataParallelPPOActor(actor_cfg, policy, optimizer), DataParallelPPOActor(ref_cfg, reference)
    steps = run_steps(actor, ref, scheduler, rec["steps"], meta, lambda i, s: advantages(s, meta),
                      lambda: {k: v.detach().clone() for k, v in policy.state_dict().items()})
    return {"steps": steps}


def run_engine(src: dict, ours_dir: Path, rec: dict) -> dict | None:
    """veRL's FSDP engine over the launched ranks (tests/fidelity/verl_fsdp.py), each on our rank's rows; on rank 0
    every rank's record (``ranks``) and rank 0's with the fp32 weights (``steps``), None on the others."""
    from tests.fidelity import verl_fsdp
    from tests.fidelity.their_init import v4_folder

    dist = torch.distributed
    dist.init_process_group("gloo")
    rank, world, meta = dist.get_rank(), dist.get_world_size(), rec["meta"]
    if world != meta["world"]:
        raise SystemExit(f"our record is of {meta['world']} ranks, this launch has {world}")
    if rank == 0:  # the tokenizer veRL's worker reads (hf_tokenizer) must be transformers 4's
        v4_folder(ours_dir / "init", ours_dir / "verl_init")
    dist.barrier()
    verl_fsdp.cpu_stand_ins()
    policy, optimizer, scheduler, reference = verl_fsdp.build(src, ours_dir / "verl_init", meta, rank, world)
    actor_cfg, ref_cfg = actor_config(src, meta)
    actor, ref = DataParallelPPOActor(actor_cfg, policy, optimizer), DataParallelPPOActor(ref_cfg, reference)
    every = rec["ranks"]
    steps = run_steps(actor, ref, scheduler, every[rank], meta,
                      lambda i, s: rank_advantages([r[i] for r in every], meta, rank),
                      lambda: verl_fsdp.full_weights(policy))
    shards = verl_fsdp.sharding(policy)  # a collective
    ranks = [None] * world
    dist.all_gather_object(ranks, [{k: v for k, v in s.items() if k != "weights"} for s in steps])
    return {"steps": steps, "ranks": ranks, "fsdp": shards} if rank == 0 else None


def main(source_yaml: str, ours_dir: str, given: str = "{}") -> None:
    given = json.loads(given)
    engine = given.pop("engine", None)
    unapplied = {k: v for k, v in given.items() if v}
    if unapplied:  # the harness passes sources.yaml's defaults to every driver: veRL's checks have none to apply
        sys.exit(f"verl_grpo.py applies no {unapplied} (tests/fidelity/sources.yaml)")
    if engine is not None and engine.get("dtype") != "bfloat16":
        sys.exit(f"verl_grpo.py runs veRL's engine as fsdp_workers.py does (bf16 compute): not {engine}")
    torch.set_num_threads(1)
    ours_dir = Path(ours_dir)
    rec = torch.load(ours_dir / "ours.pt", weights_only=False)
    src = yaml.safe_load(Path(source_yaml).read_text())
    out = run_engine(src, ours_dir, rec) if engine else run_plain(src, ours_dir, rec)
    if out is None:
        return
    versions = {"verl": verl.__version__, "torch": torch.__version__,
                "transformers": sys.modules["transformers"].__version__,
                **({"fsdp": out.pop("fsdp")} if engine else {})}
    torch.save({"versions": versions, **out}, ours_dir / "verl.pt")


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: python tests/fidelity/verl_grpo.py SOURCE_YAML OURS_DIR")
    main(*sys.argv[1:])
