"""TRL's side of an Open-R1 fidelity check, run in the TRL 0.18.0 env (tests/fidelity/envs.sh trl), never in .venv.

    python tests/fidelity/trl_grpo.py SOURCE_YAML OURS_DIR [GIVEN_JSON]   ({"defaults": {...}}: sources.yaml's)
    torchrun --nproc_per_node 2 tests/fidelity/trl_grpo.py SOURCE_YAML OURS_DIR \
        '{"engine": {"dtype": "bfloat16", "launcher": "tests/fidelity/open_r1/accelerate_zero2.yaml"}}'

Parses the Open-R1 recipe YAML (a verbatim copy, tests/fidelity/open_r1/) into TRL's own ``GRPOConfig`` as Open-R1's
``TrlParser`` does (keys that are not GRPOConfig fields dropped), changes only what a CPU and the tiny scale need
(:data:`CPU_TINY` and the batch shape our run recorded), and runs ``GRPOTrainer.train()`` for the recorded number of
optimiser steps on the initial policy our run saved (``OURS_DIR/init``). The step is TRL's own: its prompt
templating, tokenisation and left truncation, completion mask, advantages, ``_compute_loss``, the HF Trainer's
accumulation, clipping, AdamW and schedule. Fed from our record, as a seeded run would draw them: the prompts of each
step (the sampler's draw), the completions (``model.generate`` returns them), the rewards (one reward function
returns the recorded score of each completion) and the mini-batch shuffle's permutation. Writes ``OURS_DIR/trl.pt``
with the same fields as ours.pt (tests/fidelity/ours_rl.py) where TRL has them.

An engine check (GIVEN_JSON ``engine``, under ``torchrun``; docs/fidelity.md "Engines") runs as ``accelerate launch
--config_file LAUNCHER`` runs Open-R1's script: accelerate's own launcher code turns the recipe's launcher config
(tests/fidelity/open_r1/accelerate_zero2.yaml: DeepSpeed ZeRO-2, bf16) into the environment its ``Accelerator``
and the HF Trainer read, and the YAML's own ``bf16: true`` and ``torch_dtype: bfloat16`` stay (DeepSpeed bf16 with
fp32 master weights). Each process takes its contiguous slice of each step's prompts (accelerate's batch sharding of
TRL's sampler) and is fed our rank's completions and permutation; TRL gathers the rewards for the group advantages.
Recorded at each DeepSpeed accumulation boundary: the gradient norm, the lr and the fp32 master weights, gathered.
``trl.pt`` then holds ``ranks`` (every rank's steps, in rank order) and ``steps`` (rank 0's, with the weights). One
stand-in: TrainingArguments refuses ``bf16`` on a machine without a GPU's bf16 unless ``use_cpu``, which turns
accelerate's DeepSpeed off; its GPU check answers yes (this CPU computes in bf16).
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed is imported (an engine check runs it)
os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))  # harness.extensions_dir
# LOCAL_SIZE: the ranks on this node, which DeepSpeed's CPU accelerator otherwise counts with numactl
os.environ.setdefault("LOCAL_SIZE", os.environ.get("LOCAL_WORLD_SIZE", "1"))

import torch  # noqa: E402
import yaml  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl.trainer import grpo_trainer  # noqa: E402

# What the CPU needs, against the YAML: fp32 (the YAML's bf16 is a GPU dtype; both sides run fp32), transformers'
# generate in place of vLLM (and it only returns the recorded completions), no Liger kernels (Triton, CUDA only;
# the distill recipe's use_liger_kernel patches the model's RMSNorm/SwiGLU/RoPE with numerically equal kernels), no
# hub, logging or saving.
CPU_TINY = {"bf16": False, "use_cpu": True, "use_vllm": False, "use_liger_kernel": False, "use_liger_loss": False,
            "report_to": [], "push_to_hub": False, "save_strategy": "no", "do_eval": False, "eval_strategy": "no",
            "log_completions": False, "logging_steps": 1, "dataloader_num_workers": 0}


def source_args(source_yaml: Path, meta: dict, out_dir: str, defaults: dict,
                engine: bool = False) -> tuple[GRPOConfig, dict]:
    """The recipe YAML as GRPOConfig over ``defaults`` (the cited TRL commit's, where they differ from the installed
    release: tests/fidelity/sources.yaml), with the CPU changes and the tiny scale's batch shape; also the YAML. An
    engine check keeps the YAML's ``bf16`` (and leaves the device to accelerate's DeepSpeed)."""
    raw = yaml.safe_load(source_yaml.read_text())
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    # reward_weights: one reward function returns the recorded weighted total (the verifiers are checked on their own)
    kept = {k: v for k, v in raw.items() if k in fields and k != "reward_weights"}
    shape = {"per_device_train_batch_size": meta["micro_batch_size"],
             "gradient_accumulation_steps": meta["grad_accum"], "num_generations": meta["group_size"],
             "max_completion_length": meta["max_new_tokens"], "max_steps": meta["total_steps"]}
    cpu = {k: v for k, v in CPU_TINY.items() if not (engine and k in ("bf16", "use_cpu"))}
    return GRPOConfig(**{**defaults, **kept, **cpu, **shape, "output_dir": out_dir}), raw


class StepSampler(torch.utils.data.Sampler):
    """The dataset indices of each recorded step, each step's repeated ``repeat`` times: the layout TRL's
    ``RepeatSampler`` yields (a generation batch, reused for ``num_iterations x steps_per_generation`` micro-steps),
    with our sampler's prompts in place of its seeded draw."""

    def __init__(self, steps: list[list[int]], repeat: int):
        self.steps, self.repeat = steps, repeat

    def __iter__(self):
        for idx in self.steps:
            for _ in range(self.repeat):
                yield from idx

    def __len__(self) -> int:
        return sum(len(s) for s in self.steps) * self.repeat


def dataset(steps: list[dict], raw: dict, G: int) -> tuple[Dataset, list[list[int]]]:
    """One row per prompt of the record, in Open-R1's conversational form (``make_conversation``: the YAML's
    system prompt, then the user turn), and the dataset indices of each step (each prompt G times, group-major)."""
    rows, order = [], []
    for s in steps:
        first = len(rows)
        for text in s["prompts"]:
            turns = [{"role": "system", "content": raw["system_prompt"]}] if raw.get("system_prompt") else []
            rows.append(turns + [{"role": "user", "content": text}] if isinstance(text, str) else text)
        order.append([first + i for i in range(len(s["prompts"])) for _ in range(G)])
    return Dataset.from_dict({"prompt": rows}), order


class Recorder(TrainerCallback):
    """The policy's weights after each optimiser step."""

    def __init__(self, model, record: list[dict]):
        self.model, self.record = model, record

    def on_step_end(self, args, state, control, **kwargs):
        self.record[state.global_step - 1]["weights"] = {k: v.detach().clone()
                                                         for k, v in self.model.state_dict().items()}


def instrument(trainer: GRPOTrainer, model, ours: list[dict], record: list[dict], engine: bool = False) -> None:
    """Feed the recorded completions, rewards and permutation in; record what TRL computes from them (an engine
    check's gradient norms, lr and weights: :func:`record_boundaries`)."""
    P = [s["prompt_length"] for s in ours]

    def generate(prompt_ids, attention_mask=None, generation_config=None):  # the recorded step's completions
        s = ours[len(record)]
        record.append({"prompt_ids": prompt_ids.clone(), "micro": [], "grad_norm": [], "lr": []})
        return torch.cat([prompt_ids, s["input_ids"][:, P[len(record) - 1]:]], dim=1)

    score_fn = trainer._generate_and_score_completions

    def scored(inputs):
        out = score_fn(inputs)
        record[-1].update(advantages=out["advantages"].clone(), completion_mask=out["completion_mask"].clone())
        return out

    def shuffle(batch):  # TRL's randperm replaced by the permutation our step drew
        perm = ours[len(record) - 1]["order"]
        return {k: (v[perm] if v is not None else None) for k, v in batch.items()}

    logps_fn, loss_fn, clip_fn = trainer._get_per_token_logps, trainer.compute_loss, trainer.accelerator.clip_grad_norm_

    def logps(m, *args, **kwargs):
        out = logps_fn(m, *args, **kwargs)
        if torch.is_grad_enabled():  # the policy's, in _compute_loss (the reference runs under no_grad)
            record[-1]["micro"].append({"logprobs": out.detach().clone()})
        return out

    def loss(*args, **kwargs):
        out = loss_fn(*args, **kwargs)
        record[-1]["micro"][-1]["loss"] = float(out)
        return out

    def clip(params, max_norm):
        norm = clip_fn(params, max_norm)
        record[-1]["grad_norm"].append(float(norm))
        record[-1]["lr"].append(float(trainer.lr_scheduler.get_last_lr()[0]))
        return norm

    model.generate = generate
    trainer._generate_and_score_completions, trainer._get_per_token_logps = scored, logps
    trainer.compute_loss = loss
    if not engine:  # under DeepSpeed, accelerate's clip_grad_norm_ returns None: DeepSpeed clips in its step
        trainer.accelerator.clip_grad_norm_ = clip
    grpo_trainer.shuffle_tensor_dict = shuffle


def launch(engine: dict) -> None:
    """An engine check's launch: the environment ``accelerate launch --config_file LAUNCHER`` gives (accelerate's own
    code, tests/fidelity/their_launch.py), and TrainingArguments' bf16 check answered for this CPU (the module
    docstring)."""
    import transformers.training_args

    from tests.fidelity.their_launch import accelerate_env

    root = Path(__file__).resolve().parents[2]  # the launcher's path is the project's (sources.yaml)
    accelerate_env(["--config_file", str(root / engine["launcher"])])
    transformers.training_args.is_torch_bf16_gpu_available = lambda: True


def record_boundaries(record: list[dict]) -> None:
    """At each DeepSpeed accumulation boundary: the lr the step takes, then the gradient norm DeepSpeed clipped by and
    the fp32 master weights after the step, gathered (a collective: every rank steps)."""
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param

    step = deepspeed.DeepSpeedEngine.step

    def stepped(engine, *args, **kwargs):
        boundary, lr = engine.is_gradient_accumulation_boundary(), engine.get_lr()[0]
        out = step(engine, *args, **kwargs)
        if boundary and engine.optimizer is not None:  # the reference's engine has no optimiser
            record[-1]["grad_norm"].append(float(engine.get_global_grad_norm()))
            record[-1]["lr"].append(float(lr))
            record[-1]["weights"] = {n: safe_get_full_fp32_param(p).detach().float().clone()
                                     for n, p in engine.module.named_parameters()}
        return out

    deepspeed.DeepSpeedEngine.step = stepped


def step_prompts(rec: dict) -> list[dict]:
    """Each step's prompts over every rank, in rank order (an engine check: rank r's rows are its contiguous slice of
    the step's group-major rows, each rank's whole groups)."""
    G, steps = rec["meta"]["group_size"], []
    for i in range(len(rec["steps"])):
        per_rank = [r[i] for r in rec["ranks"]]
        if any(s["input_ids"].shape[0] != G * len(s["prompts"]) for s in per_rank):
            raise AssertionError(f"step {i + 1}: a group spans ranks; TRL's sampler hands each process whole groups "
                                 "here only when each rank's rows are")
        steps.append({"prompts": [p for s in per_rank for p in s["prompts"]]})
    return steps


def every_rank(record: list[dict]) -> list[list[dict]] | None:
    """Every rank's record (weights left out), in rank order, on rank 0; None on the others."""
    dist = torch.distributed
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, [{k: v for k, v in s.items() if k != "weights"} for s in record])
    return ranks if dist.get_rank() == 0 else None


def recorded_reward(ours: list[dict], record: list[dict]):
    """A reward function (TRL's signature) returning the recorded score of each row of the step being scored, after
    checking that TRL's completion (up to its first EOS) is the recorded one."""

    def recorded_scores(prompts, completions, completion_ids, **_):
        s = ours[len(record) - 1]
        resp = s["input_ids"][:, s["prompt_length"]:]  # [N, R]
        for i, ids in enumerate(completion_ids):
            if resp[i, :len(ids)].tolist() != ids:
                raise AssertionError(f"row {i}: TRL's completion ids are not the recorded ones")
        return [float(x) for x in s["scores"]]

    return recorded_scores


def load_tokenizer(path: Path):
    """The tokenizer our run saved (transformers 5's format) in transformers 4.52: the same ``tokenizer.json`` and chat
    template, the specials from ``tokenizer_config.json`` (v5 writes ``extra_special_tokens`` as a list, which 4.52
    reads as a dict: it becomes 4.52's ``additional_special_tokens``)."""
    conf = json.loads((path / "tokenizer_config.json").read_text())
    specials = {k: conf.get(k) for k in ("pad_token", "eos_token", "bos_token", "unk_token")}
    tok = PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"), padding_side=conf["padding_side"],
                                  additional_special_tokens=conf.get("extra_special_tokens") or [],
                                  clean_up_tokenization_spaces=conf["clean_up_tokenization_spaces"], **specials)
    tok.chat_template = (path / "chat_template.jinja").read_text()
    return tok


def main(source_yaml: str, ours_dir: str, given: str = "{}") -> None:
    torch.set_num_threads(1)
    ours_dir, given = Path(ours_dir), json.loads(given)
    rec, engine = torch.load(ours_dir / "ours.pt", weights_only=False), given.get("engine")
    if engine:
        launch(engine)
    meta = rec["meta"]
    ours = rec["ranks"][int(os.environ["RANK"])] if engine else rec["steps"]  # this process's rows
    args, raw = source_args(Path(source_yaml), meta, tempfile.mkdtemp(dir=ours_dir, prefix="trl_"),
                            given.get("defaults", {}), engine=bool(engine))
    tok = load_tokenizer(ours_dir / "init")
    if raw.get("chat_template"):  # Open-R1's get_tokenizer: the YAML's template replaces the checkpoint's
        tok.chat_template = raw["chat_template"]
    dtype = getattr(torch, raw["torch_dtype"]) if engine else torch.float32  # Open-R1 loads at the YAML's dtype
    model = AutoModelForCausalLM.from_pretrained(ours_dir / "init", torch_dtype=dtype, attn_implementation="sdpa")
    data, order = dataset(step_prompts(rec) if engine else ours, raw, meta["group_size"])
    record: list[dict] = []
    trainer = GRPOTrainer(model=model, reward_funcs=[recorded_reward(ours, record)], args=args, train_dataset=data,
                          processing_class=tok, callbacks=[] if engine else [Recorder(model, record)])
    trainer._get_train_sampler = lambda *a: StepSampler(order, trainer.num_iterations * args.steps_per_generation)
    instrument(trainer, model, ours, record, bool(engine))
    if engine:
        record_boundaries(record)
    trainer.train()
    ranks = every_rank(record) if engine else None
    if engine and ranks is None:
        return
    versions = {m: sys.modules[m].__version__
                for m in ("trl", "transformers", "torch", "accelerate", *(["deepspeed"] if engine else []))}
    extra = {"ranks": ranks} if engine else {}
    torch.save({"args": args.to_dict(), "versions": versions, "steps": record, **extra}, ours_dir / "trl.pt")


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: python tests/fidelity/trl_grpo.py SOURCE_YAML OURS_DIR [GIVEN_JSON]")
    main(*sys.argv[1:])
