"""Open-Instruct's side of the reward-model fidelity check (``open_instruct_rm_8b``), run in the open-instruct-3dd7a07d
env (tests/fidelity/envs.sh open_instruct), never in .venv.

    python tests/fidelity/open_instruct_rm.py COMMAND OURS_DIR [GIVEN_JSON]

Runs ``open_instruct.reward_modeling.main`` @3dd7a07d whole, in one process, as ``accelerate launch --config_file
configs/ds_configs/deepspeed_zero3.yaml open_instruct/reward_modeling.py ...`` runs it: accelerate's own launcher code
(``_validate_launch_command``, ``prepare_deepspeed_cmd_env``) turns the commit's launcher config into the environment
its ``Accelerator`` reads (DeepSpeed ZeRO-3, its plugin's ``gradient_clipping: auto``), with one process and, for the
fp32 check, ``--mixed_precision no``. The script's own parser reads the command's flags (COMMAND:
tests/fidelity/open_instruct/open_instruct_rm_8b.sh, the doc's), over which only the tiny run's batch shape, our
pairs (tests/fidelity/openrlhf/pairs.jsonl, train and eval), our initial model and no logging or pushing are set. So
its code builds and runs the step: the tokenizer (right padding, the ``[PAD]`` it adds, the tulu template),
``PreferenceDatasetProcessor`` (tokenize, its filter), ``AutoModelForSequenceClassification`` with the resized
embeddings, ``AdamW(eps=1e-5)``, the linear schedule stepped at each accumulation boundary, and per micro-batch
``get_reward`` on chosen and rejected concatenated, ``-logsigmoid`` and ``accelerator.backward`` (DeepSpeed's
accumulation, clipping and step).

Also recorded, ``head_kept``: whether the script's ``layer_init(model.score, std=1/sqrt(hidden + 1))`` left the head
as the checkpoint had it (under the launcher's ``zero3_init_flag`` it draws into an empty ZeRO-3 partition;
docs/fidelity.md "Found"). Fed from our record, as a seeded run would draw them: the initial weights (loaded over
the model after its own ``layer_init``) and the pairs each micro-batch takes (the ``DataLoader``'s seeded shuffle
replaced by our sampler's draw). Writes ``OURS_DIR/open_instruct.pt`` in openrlhf.pt's layout
(tests/fidelity/openrlhf_rm.py); the source pads with its ``[PAD]`` id (outside our vocabulary; ``get_reward`` masks
it), which the record writes as our pad id so the padded batches compare token for token.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed is imported
os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))
# LOCAL_SIZE: the ranks on this node, which DeepSpeed's CPU accelerator otherwise counts with numactl
# (torchrun sets the ranks' variables for an engine check on several ranks; one rank otherwise)
for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                   "LOCAL_SIZE": os.environ.get("LOCAL_WORLD_SIZE", "1"), "MASTER_ADDR": "127.0.0.1"}.items():
    os.environ.setdefault(key, value)

import torch  # noqa: E402

from tests.fidelity.open_instruct_rl import free_port, run  # noqa: E402
from tests.fidelity.their_launch import accelerate_env  # noqa: E402
from tests.fidelity.their_init import v4_folder  # noqa: E402


def command(command_file: Path) -> tuple[list[str], list[str]]:
    """The launcher's flags and the script's, from the recipe's command (comments left out)."""
    text = "\n".join(line.split("#", 1)[0] for line in command_file.read_text().splitlines())
    words = shlex.split(text.replace("\\\n", " "))
    i = words.index("open_instruct/reward_modeling.py")
    return words[words.index("launch") + 1:i], words[i + 1:]


def launch_env(launcher: list[str], src: Path, mixed_precision: str) -> None:
    """The environment ``accelerate launch`` gives the script, from the commit's launcher config by accelerate's own
    code (tests/fidelity/their_launch.py), on the launched ranks and with ``mixed_precision`` (fp32 check: ``no``;
    the config's is bf16)."""
    accelerate_env([w if not w.startswith("configs/") else str(src / w) for w in launcher], mixed_precision)


def tiny_args(rm, flags: list[str], meta: dict, init: Path, out: Path):
    """The command's dataclasses (the script's own parser), then the tiny run's batch shape and lengths, our pairs as
    train and eval set, our initial model, nothing logged or pushed."""
    pairs = meta["pairs"]
    parser = rm.ArgumentParserPlus((rm.Args, rm.DatasetConfig, rm.ModelConfig))
    over = {"--dataset_mixer": json.dumps({pairs: 1.0}), "--dataset_train_splits": "train",
            "--dataset_eval_mixer": json.dumps({pairs: 1.0}), "--dataset_eval_splits": "train",
            "--model_name_or_path": str(init), "--per_device_train_batch_size": str(meta["micro_batch_size"]),
            "--gradient_accumulation_steps": str(meta["grad_accum"]), "--max_token_length": str(meta["max_len"]),
            "--max_prompt_token_length": str(meta["max_len"]), "--output_dir": str(out / "model")}
    kept, skip = [], False
    for w in flags:
        if w.startswith("--"):
            skip = w in over or w in ("--push_to_hub", "--with_tracking")
        if not skip:
            kept.append(w)
    argv = kept + [x for k, v in over.items() for x in (k, v)] + ["--push_to_hub", "False", "--with_tracking", "False"]
    return parser.parse_args_into_dataclasses(argv)


def feed(rm, ours: dict, record: dict) -> None:
    """Our initial weights over the model after the script's ``layer_init`` drew its head, our pair order in its
    training ``DataLoader`` (shuffle=True: a seeded draw); the tokenized pairs recorded as its dataset holds them."""
    import types

    built, layer_init, loader = [], rm.layer_init, rm.DataLoader
    load = rm.AutoModelForSequenceClassification.from_pretrained
    order = [i for s in ours["steps"] for i in _sharded(s, ours["meta"])]

    def from_pretrained(*args, **kwargs):
        built.append(load(*args, **kwargs))
        return built[-1]

    def initialised(layer, std):
        import deepspeed

        out = layer_init(layer, std)
        params = [p for p in built[-1].parameters() if hasattr(p, "ds_id")]  # ZeRO-3 (zero3_init_flag): partitioned
        with deepspeed.zero.GatheredParameters([layer.weight], enabled=bool(params)):  # what its layer_init left
            record["head_kept"] = bool(torch.equal(layer.weight.detach().float(), ours["init"]["score.weight"]))
        with deepspeed.zero.GatheredParameters(params, modifier_rank=0, enabled=bool(params)):
            state = dict(ours["init"])
            key = "model.embed_tokens.weight"  # resize_token_embeddings added rows for its [PAD]: ours fill the first
            theirs = built[-1].state_dict()[key]
            state[key] = torch.cat([state[key], theirs[state[key].shape[0]:].to(state[key].dtype)])
            missing, unexpected = built[-1].load_state_dict(state, strict=False)
        if missing or unexpected:
            raise AssertionError(f"our weights do not fit the source's model: missing {missing}, "
                                 f"unexpected {unexpected}")
        return out

    def data_loader(dataset, batch_size, shuffle=False, collate_fn=None):
        if not shuffle:  # the eval set, in order
            return loader(dataset, batch_size=batch_size, shuffle=False, collate_fn=collate_fn)
        record["pairs"] = [{"chosen": r["input_ids_chosen"], "rejected": r["input_ids_rejected"]} for r in dataset]
        return loader(dataset, batch_size=batch_size, sampler=order, collate_fn=collate_fn)

    rm.AutoModelForSequenceClassification = types.SimpleNamespace(from_pretrained=from_pretrained)
    rm.layer_init, rm.DataLoader = initialised, data_loader


def _sharded(step: dict, meta: dict) -> list[int]:
    """A step's pairs in the order the source's sharded ``DataLoader`` hands them out so that each rank trains our
    rank's micro-batches: accelerate gives process r batches r, r + world, ... (``BatchSamplerShard``)."""
    ranks, m = step.get("rank_orders", [step["order"]]), meta["micro_batch_size"]
    return [i for k in range(meta["grad_accum"]) for r in ranks for i in r[k * m:(k + 1) * m]]


def master_weights(engine) -> dict:
    """The fp32 master weights of a DeepSpeed engine, gathered (a collective: every rank calls it)."""
    from deepspeed.utils import safe_get_full_fp32_param

    return {n: safe_get_full_fp32_param(p).detach().float().clone() for n, p in engine.module.named_parameters()}


def ours_shapes(weights: dict, init: dict) -> dict:
    """The source's weights cut to our shapes: its embedding's extra rows (its ``[PAD]``, never read) left out."""
    return {k: v[tuple(slice(0, n) for n in init[k].shape)] for k, v in weights.items()}


def instrument(rm, record: dict, our_pad: int) -> None:
    """Record each training micro-batch's padded ids (the source's ``[PAD]`` written as ``our_pad``), attention mask,
    rewards ``[2B]`` and loss, and at each optimiser step (DeepSpeed's accumulation boundary) the gradient norm, the lr
    it steps with and the weights after it."""
    import deepspeed
    from accelerate import Accelerator

    get_reward, backward, step = rm.get_reward, Accelerator.backward, deepspeed.DeepSpeedEngine.step

    def rewards(model, query_responses, pad_token_id, context_length):
        out = get_reward(model, query_responses, pad_token_id, context_length)
        if model.training:
            mask = query_responses != pad_token_id
            record["steps"][-1]["micro"].append({"input_ids": query_responses.masked_fill(~mask, our_pad).clone(),
                                                 "attention_mask": mask.long(),
                                                 "rewards": out[1].detach().float().clone()})
        return out

    def backwarded(accelerator, loss, **kwargs):
        record["steps"][-1]["micro"][-1]["loss"] = float(loss.detach())
        return backward(accelerator, loss, **kwargs)

    def stepped(engine, *args, **kwargs):
        boundary, lr = engine.is_gradient_accumulation_boundary(), engine.get_lr()[0]
        out = step(engine, *args, **kwargs)
        if boundary:
            s = record["steps"][-1]
            s.update(grad_norm=[float(engine.get_global_grad_norm())], lr=[float(lr)], weights=master_weights(engine))
            record["steps"].append({"micro": []})
        return out

    rm.get_reward, Accelerator.backward, deepspeed.DeepSpeedEngine.step = rewards, backwarded, stepped


def main(command_file: str, ours_dir: str, given: str = "{}") -> None:
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_PORT", free_port())
    out, given = Path(ours_dir), json.loads(given)
    ours = torch.load(out / "ours.pt", weights_only=False)
    dtype = given.get("engine", {}).get("dtype", "float32")
    launcher, flags = command(Path(command_file))
    import open_instruct

    src = Path(open_instruct.__path__[0]).parent
    launch_env(launcher, src, "bf16" if dtype == "bfloat16" else "no")
    from open_instruct import reward_modeling as rm

    init = v4_folder(out / "init", out / "oi_init")
    args, data_cfg, model_cfg = tiny_args(rm, flags, ours["meta"], init, out / "oi_run")
    record: dict = {"steps": [{"micro": []}]}
    feed(rm, ours, record)
    instrument(rm, record, json.loads((out / "init" / "config.json").read_text()).get("pad_token_id") or 0)
    rm.main(args, data_cfg, model_cfg)
    steps = [s for s in record["steps"] if "weights" in s]
    every = [[s["micro"] for s in steps]]
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:  # every rank's, in rank order
        every = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(every, [s["micro"] for s in steps])
        if torch.distributed.get_rank():
            return
    record["steps"] = [{**s, "micro": [m for r in every for m in r[i]],
                        "weights": ours_shapes(s["weights"], ours["init"])} for i, s in enumerate(steps)]
    versions = {"open_instruct": (src / "COMMIT").read_text().strip()[:8],
                "transformers": sys.modules["transformers"].__version__,
                "deepspeed": sys.modules["deepspeed"].__version__, "torch": torch.__version__,
                "accelerate": sys.modules["accelerate"].__version__}
    torch.save({"versions": versions, "argv": flags, **record}, out / "open_instruct.pt")


if __name__ == "__main__":
    run(main, "usage: python tests/fidelity/open_instruct_rm.py COMMAND OURS_DIR [GIVEN_JSON]")
