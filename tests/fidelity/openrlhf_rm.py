"""OpenRLHF's side of a reward-model fidelity check, run in the OpenRLHF 0.9.0 env (tests/fidelity/envs.sh openrlhf),
never in .venv.

    python tests/fidelity/openrlhf_rm.py SOURCE_COMMAND OURS_DIR [GIVEN_JSON]   ({"deviations": {...}}: sources.yaml's)
    torchrun --nproc_per_node 2 tests/fidelity/openrlhf_rm.py SOURCE_COMMAND OURS_DIR \
        '{"engine": {"dtype": "bfloat16"}}'

Runs OpenRLHF's own ``openrlhf.cli.train_rm`` as ``deepspeed --module openrlhf.cli.train_rm`` would, in one process:
its argument parser takes the recipe's command (tests/fidelity/openrlhf/RECIPE.sh, the flags the recipe cites) with
only what the CPU and the tiny scale need changed (:func:`cli_args`), and its ``train()`` builds everything:
``get_llm_for_sequence_regression`` (reward type, the LoRA it builds), ``get_tokenizer``, ``blending_datasets`` and
``RewardDataset`` (chat template, EOS, truncation, left padding in its collate), the ``DeepspeedStrategy`` (its
DeepSpeed config, ``FusedAdam`` with its parameter groups, ZeRO stage, gradient clipping, accumulation),
``get_scheduler``, and ``RewardModelTrainer.fit`` (``concatenated_forward``, the loss, ``backward`` and
``optimizer_step`` per micro-batch). DeepSpeed runs on the CPU (``DS_ACCELERATOR=cpu``: gloo, one rank; its CPU
accelerator JIT-builds ``FusedAdam``'s C++ kernel the first time, about 2 minutes, into the env).

Fed from our record, as a seeded run would draw them: the initial weights (loaded over the model after
``get_llm_for_sequence_regression``, whose ``init_value_head`` draws a fresh head; LoRA: the adapter's initial A and
B too) and the pairs each step takes (the ``DistributedSampler``'s seeded permutation replaced by our sampler's draw).
The pairs file is ours (tests/fidelity/openrlhf/pairs.jsonl), read by OpenRLHF's own loader. Writes
``OURS_DIR/openrlhf.pt``: the tokenized pairs, and per optimiser step its micro-batches' padded ids, attention mask,
rewards and loss, the gradient norm and lr, and the weights after it.

On the CPU: fp32 (no ``--bf16``), ``sdpa`` attention (no ``--attn_implementation flash_attention_2``) and padded
forwards (no ``--packing_samples``: OpenRLHF packs only under flash attention's varlen kernels; it runs the same
tokens padded); ``torch.cuda.set_device`` and ``synchronize`` do nothing, ``init_device_mesh`` builds the mesh on the
CPU and ``torch.cuda.current_device()`` is ``"cpu"`` (the trainer moves each batch there).

An engine check (GIVEN_JSON ``engine``, under ``torchrun``; docs/fidelity.md "Engines") keeps the command's ``--bf16``
(DeepSpeed bf16, fp32 master weights in its optimiser) at the command's ZeRO stage over the launched ranks: each rank
trains the pairs our rank of the same number took, and ``weights`` are the fp32 master weights, gathered; rank 0
writes every rank's micro-batches, in rank order.
"""
from __future__ import annotations

import json
import os
import runpy
import shlex
import socket
import sys
from importlib import metadata
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed is imported
# DeepSpeed's JIT kernels built for this env's DeepSpeed and torch, kept in the env (run by hand; the harness names
# the same folder: tests/fidelity/harness.py extensions_dir): the project's own DeepSpeed builds kernels of the same
# names into its own folder, and each would load the other's build
os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))
# LOCAL_SIZE: the ranks on this node, which DeepSpeed's CPU accelerator otherwise counts with numactl (torchrun sets
# the ranks' variables for an engine check; one rank otherwise)
for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                   "LOCAL_SIZE": os.environ.get("LOCAL_WORLD_SIZE", "1"), "MASTER_ADDR": "127.0.0.1"}.items():
    os.environ.setdefault(key, value)

import torch  # noqa: E402

import deepspeed  # noqa: E402
import openrlhf.models  # noqa: E402
from openrlhf.trainer.rm_trainer import RewardModelTrainer  # noqa: E402
from openrlhf.utils.deepspeed import deepspeed as ds_strategy  # noqa: E402
from openrlhf.utils.distributed_sampler import DistributedSampler  # noqa: E402

from tests.fidelity.their_init import v4_folder  # noqa: E402

# Flags whose values the CPU and the tiny scale set (the rest of the command is the source's): fp32 and sdpa (no
# bf16 or flash-attn on the CPU), padded forwards (packing needs flash attention), the tiny run's batch shape and
# length, our pairs and initial model, no checkpoint to resume from, outputs under OURS_DIR. The pairs are the eval
# set too: without --eval_dataset train_rm evaluates the first 1% of train, none of 24 pairs, and RewardDataset fails
# on an empty split; fit evaluates once, after the last step (no_grad: nothing compared changes).
DROPPED = {"--bf16", "--flash_attn", "--packing_samples", "--load_checkpoint", "--attn_implementation",
           "--pretrain", "--dataset", "--dataset_probs", "--train_batch_size", "--micro_train_batch_size",
           "--max_len", "--save_path", "--ckpt_path", "--use_wandb", "--max_samples", "--eval_dataset"}


# Known differences of OpenRLHF 0.9.0's run that the check leaves out so the rest of the step is compared
# (sources.yaml ``deviations``, docs/fidelity.md "Found"): the flags that leave each out.
DEVIATION_FLAGS = {
    # DeepSpeed 0.18.1's ZeRO-1/2 keeps only the last micro-batch's gradient of an accumulated step (its
    # independent_gradient_partition_epilogue starts the accumulator again while averaged_gradients is None, which it
    # is until the boundary); its ZeRO-3 accumulates: the step runs at ZeRO-3.
    "zero2_accumulation": {"--zero_stage": "3"},
    # Under ZeRO-3, non-reentrant gradient checkpointing of the LoRA model fails here (torch 2.13's recompute check
    # finds the frozen base weights partitioned, shape [0]); checkpointing changes memory, not the step: off.
    "zero3_lora_checkpointing": {"--gradient_checkpointing": None},
}


def source_flags(command_file: Path) -> list[str]:
    """The ``train_rm`` flags of the recipe's command: comments and the launcher (``deepspeed --module ...``) left
    out."""
    text = "\n".join(line.split("#", 1)[0] for line in command_file.read_text().splitlines())
    words = shlex.split(text.replace("\\\n", " "))
    return words[words.index("openrlhf.cli.train_rm") + 1:]


def cli_args(flags: list[str], meta: dict, init: Path, out: Path, deviations: dict, bf16: bool = False) -> list[str]:
    """The source's flags with :data:`DROPPED` replaced by the CPU's and the tiny run's values, and each named
    deviation's flags (:data:`DEVIATION_FLAGS`: a new value, or None to drop the flag); ``bf16`` (an engine check)
    keeps the command's ``--bf16``."""
    changed = {k: v for name in deviations for k, v in DEVIATION_FLAGS[name].items()}
    if bf16 and "--bf16" not in flags:
        raise AssertionError("an engine check in bf16 runs the command's --bf16, which this command does not set")
    dropped = DROPPED - {"--bf16"} if bf16 else DROPPED
    kept, skip = [], False
    for word in flags:
        if word.startswith("--"):
            skip = word in dropped or word in changed
            if word in changed and changed[word] is not None:
                kept += [word, changed[word]]
        if not skip:
            kept.append(word)
    return kept + ["--attn_implementation", "sdpa", "--pretrain", str(init), "--dataset", meta["pairs"],
                   "--eval_dataset", meta["pairs"],
                   "--train_batch_size", str(meta["batch_size"]), "--micro_train_batch_size",
                   str(meta["micro_batch_size"]), "--max_len", str(meta["max_len"]),
                   "--save_path", str(out / "save"), "--ckpt_path", str(out / "ckpt")]


def their_init(ours_dir: Path) -> Path:
    """``OURS_DIR/init`` readable by transformers 4.57 (tests/fidelity/their_init.py)."""
    return v4_folder(ours_dir / "init", ours_dir / "openrlhf_init")


def gathered_state(model) -> dict:
    """The full state dict of ``model`` (a DeepSpeed engine's module, or a bare model), ZeRO-3 partitions gathered."""
    params = [p for p in model.parameters() if hasattr(p, "ds_id")]
    with deepspeed.zero.GatheredParameters(params, enabled=bool(params)):
        return {k: v.detach().clone() for k, v in model.state_dict().items()}


def master_weights(engine) -> dict:
    """The fp32 master weights of a DeepSpeed engine in bf16, gathered (a collective: every rank calls it)."""
    from deepspeed.utils import safe_get_full_fp32_param

    return {n: safe_get_full_fp32_param(p).detach().float().clone() for n, p in engine.module.named_parameters()}


def load_ours(model, init: dict) -> None:
    """Our initial weights over the model OpenRLHF built (strict: every name, LoRA's included, must match)."""
    params = [p for p in model.parameters() if hasattr(p, "ds_id")]
    with deepspeed.zero.GatheredParameters(params, modifier_rank=0, enabled=bool(params)):
        missing, unexpected = model.load_state_dict(init, strict=False)
    if missing or unexpected:
        raise AssertionError(f"our weights do not fit OpenRLHF's model: missing {missing}, unexpected {unexpected}")


class RecordedOrder(DistributedSampler):
    """OpenRLHF's sampler with our draw in place of its seeded permutation: the training pairs in the order our steps
    took them, sliced by rank as its own permutation is (``indices[rank::num_replicas]``; our rank r trains
    ``order[r::world]`` of each step's draw: recipes/rm.py ``rm_step``); unshuffled loaders (the eval split)
    unchanged."""

    order: list[int] = []

    def __iter__(self):
        if not self.shuffle:
            return super().__iter__()
        return iter(self.order[self.rank::self.num_replicas][self.consumed_indicies:])


def instrument(ours: dict, record: dict) -> None:
    """Load our weights into the model OpenRLHF builds, feed our pair order, and record what its trainer computes."""
    build = openrlhf.models.get_llm_for_sequence_regression

    def built(*args, **kwargs):
        model = build(*args, **kwargs)
        load_ours(model, ours["init"])  # after init_value_head, which drew a fresh head
        return model

    openrlhf.models.get_llm_for_sequence_regression = built  # train_rm imports the name from here
    RecordedOrder.order = [i for s in ours["steps"] for i in s["order"]]
    ds_strategy.DistributedSampler = RecordedOrder
    init_fn = RewardModelTrainer.__init__

    def init(trainer, *args, **kwargs):
        init_fn(trainer, *args, **kwargs)
        _instrument_trainer(trainer, record)

    RewardModelTrainer.__init__ = init


def _instrument_trainer(trainer: RewardModelTrainer, record: dict) -> None:
    """Record the dataset's tokenized pairs, each micro-batch's padded batch, rewards and loss, and each optimiser
    step's gradient norm, lr and weights."""
    data = trainer.train_dataloader.dataset
    record["pairs"] = [{"chosen": c[m.bool()].tolist(), "rejected": r[rm.bool()].tolist()}
                       for c, m, r, rm, _ in (data[i] for i in range(len(data)))]
    inputs_fn, forward_fn, loss_fn = trainer.concatenated_inputs, trainer.concatenated_forward, trainer.loss_fn
    # the training flag is the module's: DeepSpeed's engine.eval() sets it there, not on the engine
    step_fn, model = trainer.strategy.optimizer_step, trainer.model.module

    def inputs(*args):
        ids, mask = inputs_fn(*args)
        if not model.training:  # fit's evaluation after the last step: not a training micro-batch
            return ids, mask
        if not record["steps"] or record["steps"][-1].get("weights") is not None:
            record["steps"].append({"micro": [], "grad_norm": [], "lr": [], "weights": None})
        record["steps"][-1]["micro"].append({"input_ids": ids.clone(), "attention_mask": mask.long().clone()})
        return ids, mask

    def forward(*args):
        chosen, rejected, aux = forward_fn(*args)
        if model.training:
            record["steps"][-1]["micro"][-1]["rewards"] = torch.cat([chosen, rejected]).detach().float().clone()
        return chosen, rejected, aux

    def loss(*args):
        out = loss_fn(*args)
        if model.training:
            record["steps"][-1]["micro"][-1]["loss"] = float(out.detach())
        return out

    def stepped(optimizer, model, scheduler, **kwargs):
        boundary, lr = model.is_gradient_accumulation_boundary(), scheduler.get_last_lr()[0]
        step_fn(optimizer, model, scheduler, **kwargs)
        if boundary:
            s = record["steps"][-1]
            s["grad_norm"].append(float(model.get_global_grad_norm()))
            s["lr"].append(float(lr))
            s["weights"] = master_weights(model) if model.bfloat16_enabled() else gathered_state(model.module)

    trainer.concatenated_inputs, trainer.concatenated_forward, trainer.loss_fn = inputs, forward, loss
    trainer.strategy.optimizer_step = stepped


def schedule_over_kept_groups() -> None:
    """DeepSpeed drops a client optimiser's empty parameter groups in ``initialize`` (engine.py
    ``_configure_optimizer``): under LoRA, OpenRLHF's no-decay group (the frozen norms) is empty. The schedule, built
    before, keeps an lr lambda and base lr per original group; this env's torch 2.13 pairs them with the optimiser's
    groups by ``zip(..., strict=True)`` and raises, where a plain zip paired the kept decay group with its own first
    entry. After ``initialize`` the schedule keeps the entries of the groups DeepSpeed kept: that pairing."""
    initialize = deepspeed.initialize

    def initialized(*args, optimizer=None, lr_scheduler=None, **kwargs):
        kept = [bool(g["params"]) for g in optimizer.param_groups] if optimizer is not None else []
        out = initialize(*args, optimizer=optimizer, lr_scheduler=lr_scheduler, **kwargs)
        if lr_scheduler is not None and not all(kept):
            for name in ("base_lrs", "lr_lambdas", "_last_lr"):
                setattr(lr_scheduler, name, [x for x, k in zip(getattr(lr_scheduler, name), kept) if k])
        return out

    deepspeed.initialize = initialized


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def cpu_only() -> None:
    """What OpenRLHF's CUDA calls become on the CPU: no device to select for the rank, its device mesh on the CPU,
    batches moved to ``"cpu"``."""
    mesh = ds_strategy.init_device_mesh
    ds_strategy.init_device_mesh = lambda device, *args, **kwargs: mesh("cpu", *args, **kwargs)
    torch.cuda.set_device = torch.cuda.synchronize = lambda device=None: None
    torch.cuda.current_device = lambda: "cpu"


def every_rank(record: dict) -> bool:
    """On rank 0, each step's micro-batches of every rank, in rank order (the layout of our gathered record:
    tests/fidelity/ours_rm.py ``gathered_steps``); False on the other ranks, which write nothing."""
    if not (torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1):
        return True
    every = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(every, [s["micro"] for s in record["steps"]])
    record["steps"] = [{**s, "micro": [m for r in every for m in r[i]]} for i, s in enumerate(record["steps"])]
    return torch.distributed.get_rank() == 0


def main(command_file: str, ours_dir: str, given: str = "{}") -> None:
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_PORT", free_port())
    out = Path(ours_dir)
    ours = torch.load(out / "ours.pt", weights_only=False)
    given = json.loads(given)
    bf16 = given.get("engine", {}).get("dtype") == "bfloat16"
    argv = cli_args(source_flags(Path(command_file)), ours["meta"], their_init(out), out / "openrlhf_run",
                    given.get("deviations", {}), bf16)
    record: dict = {"steps": [], "argv": argv, "given": given}
    cpu_only()
    schedule_over_kept_groups()
    instrument(ours, record)
    sys.argv = ["openrlhf.cli.train_rm", *argv]
    runpy.run_module("openrlhf.cli.train_rm", run_name="__main__", alter_sys=True)
    if not every_rank(record):
        return
    versions = {m: metadata.version(m) for m in ("openrlhf", "transformers", "torch", "deepspeed", "peft")}
    torch.save({"versions": versions, **record}, out / "openrlhf.pt")


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: python tests/fidelity/openrlhf_rm.py SOURCE_COMMAND OURS_DIR [GIVEN_JSON]")
    main(*sys.argv[1:])
