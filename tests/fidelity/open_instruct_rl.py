"""Open-Instruct's side of an RLVR (PPO) or GRPO fidelity check, run in the env of the commit the recipe cites
(tests/fidelity/envs.sh open_instruct), never in .venv.

    python tests/fidelity/open_instruct_rl.py COMMAND OURS_DIR [GIVEN_JSON]   ({"deviations": ...}: sources.yaml's)

COMMAND is the recipe's command (tests/fidelity/open_instruct/RECIPE.sh): its script names the module
(``open_instruct.ppo_vllm_thread_ray_gtrl`` @3dd7a07d, ``open_instruct.grpo_vllm_thread_ray_gtrl`` @c8b66a0e), and
the script's own parser (``ArgumentParserPlus((Args, DatasetConfig, ModelConfig))``) reads its flags, over which
:func:`tiny_args` sets only what the CPU and the tiny scale need. Then the script's own learner runs:
``calculate_runtime_args``, ``PolicyTrainerRayProcess.from_pretrained`` (its DeepSpeed configs and engines, AdamW,
``get_scheduler`` with the release's warmup rule; the value model and reward model from ``--reward_model_path``) and
``PolicyTrainerRayProcess.train`` whole: the rollout-phase forwards, ``truncate_response``, the non-stop penalty, the
KL in the reward and GAE with ``masked_whiten`` (PPO) or the group advantages and the KL in the loss (GRPO), the PPO
epochs over ``np.random.permutation`` mini-batches, DeepSpeed's accumulation, clipping and steps.

What a CPU cannot run is replaced by a stand-in (:func:`install_stand_ins`), each for a reason given there: vLLM
(generation: the recorded completions come back), Ray (the actor's class runs in this process), flash-attn
(``sdpa``), CUDA device calls. Fed from our record, as a seeded run would draw them: the prompts of each step (the
``ShufflingIterator``'s seeded draw replaced by ours), the completions, the verifier's rewards
(``apply_verifiable_reward`` returns our raw reward per row; the source applies its own non-stop penalty) and each
PPO epoch's permutation. Writes ``OURS_DIR/open_instruct.pt`` with the fields of ours.pt (tests/fidelity/ours_rl.py)
where the source has them, and the critic's value loss, gradient norm and weights (PPO).

fp32 in one process at the command's ZeRO stage (DeepSpeed on its CPU accelerator, gloo), unless GIVEN_JSON's
``engine`` says ``{"dtype": "bfloat16"}``: the source's own bf16 (its ``bf16: True`` DeepSpeed config and bf16
weights).
"""
from __future__ import annotations

import importlib
import json
import os
import queue
import shlex
import socket
import sys
import traceback
import types
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed is imported
os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))
# LOCAL_SIZE: the ranks on this node, which DeepSpeed's CPU accelerator otherwise counts with numactl
for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_SIZE": "1",
                   "MASTER_ADDR": "127.0.0.1"}.items():
    os.environ.setdefault(key, value)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from tests.fidelity.their_init import v4_folder  # noqa: E402

NO_GROUP = object()  # the weight-broadcast group to vLLM, which does not exist here
TAG = "fidelity-step:"  # the ground truth of a row: the RL step it belongs to


class _Remote:
    """``actor.method.remote(...)`` as a local call (the Ray stand-in)."""

    def __init__(self, fn):
        self.remote = fn


def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


def install_stand_ins() -> None:
    """Before the script is imported: what a CPU cannot import or run, each replaced by the least that lets the
    learner's own code run.

    - ``vllm`` (CUDA only): the scripts import ``SamplingParams`` and ``__version__``, and ``open_instruct.vllm_utils2``
      (the vLLM Ray engines, ``init_process_group`` of the weight-broadcast group). Generation is replaced by the
      recorded completions (:class:`RecordedEngine`), so ``SamplingParams`` only holds its arguments, the broadcast
      group is :data:`NO_GROUP` and a broadcast to it does nothing (the learner's weights are compared directly).
    - ``ray`` (actors on GPUs): ``@ray.remote`` returns the class itself, which runs in this process; ``ray.get``
      returns the value (a local call's), the node address is the loopback.
    - CUDA device calls: ``torch.cuda.set_device`` and ``empty_cache`` do nothing (the rank's device is the CPU).
    """
    class SamplingParams(dict):
        def __init__(self, **kwargs):
            super().__init__(kwargs)

    _module("vllm", __version__="0.0.0+stand-in", SamplingParams=SamplingParams)
    _module("open_instruct.vllm_utils2", init_process_group=lambda *a, **k: NO_GROUP,
            create_vllm_engines=lambda *a, **k: [])

    def remote(*args, **kwargs):
        return args[0] if args and callable(args[0]) else (lambda cls: cls)

    ray = _module("ray", remote=remote, get=lambda x, *a, **k: x, init=lambda *a, **k: None)
    ray.actor = _module("ray.actor", ActorHandle=object)
    ray.util = _module("ray.util")
    _module("ray.util.placement_group", PlacementGroup=object, placement_group=None)
    _module("ray.util.queue", Queue=queue.Queue)
    _module("ray.util.scheduling_strategies", PlacementGroupSchedulingStrategy=object)
    ray._private = _module("ray._private")
    ray._private.services = _module("ray._private.services", get_node_ip_address=lambda: "127.0.0.1")
    torch.cuda.set_device = torch.cuda.empty_cache = lambda *a, **k: None
    broadcast = torch.distributed.broadcast
    torch.distributed.broadcast = lambda *a, group=None, **k: None if group is NO_GROUP else broadcast(*a, group=group,
                                                                                                       **k)


def source_flags(command_file: Path) -> tuple[str, list[str]]:
    """The script's module and its flags from the recipe's command (comments and the launcher left out)."""
    text = "\n".join(line.split("#", 1)[0] for line in command_file.read_text().splitlines())
    words = shlex.split(text.replace("\\\n", " "))
    i = next(i for i, w in enumerate(words) if w.startswith("open_instruct/") and w.endswith(".py"))
    return words[i].removesuffix(".py").replace("/", "."), words[i + 1:]


def tiny_args(mod, flags: list[str], meta: dict, init: Path, critic: Path | None, out: Path, deviations: dict):
    """The command's dataclasses (the script's own parser), then what the CPU and the tiny scale set: the batch shape
    of our run, one learner, our initial models, nothing logged, pushed or saved on the way; ``async_mode`` off
    under the deviation ``async_first_batch`` (docs/fidelity.md "Found")."""
    parser = mod.ArgumentParserPlus((mod.Args, mod.DatasetConfig, mod.ModelConfig))
    args, data_cfg, model_cfg = parser.parse_args_into_dataclasses(flags)
    N, G = meta["rows"], meta["group_size"]
    shape = {"per_device_train_batch_size": meta["micro_batch_size"], "local_mini_batch_size": meta["mini_batch_size"],
             "local_rollout_batch_size": N // G, "number_samples_per_prompt": G,
             "local_rollout_forward_batch_size": meta["logprob_micro_batch_size"],
             "response_length": meta["max_new_tokens"], "total_episodes": meta["total_steps"] * N,
             "actor_num_gpus_per_node": [1], "vllm_num_engines": 1, "vllm_tensor_parallel_size": 1,
             "output_dir": str(out), "with_tracking": False, "push_to_hub": False, "save_freq": -1,
             "try_launch_beaker_eval_jobs": False, "try_launch_beaker_eval_jobs_on_weka": False}
    if critic is not None:
        shape["reward_model_path"] = str(critic)
    if deviations.get("async_first_batch") == "sync":
        shape["async_mode"] = False
    for k, v in shape.items():
        if not hasattr(args, k):
            raise AssertionError(f"{mod.__name__}.Args has no {k}")
        setattr(args, k, v)
    model_cfg.model_name_or_path = str(init)
    mod.calculate_runtime_args(args, model_cfg)
    return args, data_cfg, model_cfg


def engine_dtype(mod, dtype: torch.dtype) -> None:
    """Every model the learner loads in ``dtype`` with ``sdpa`` attention (flash-attn's kernels are CUDA only; sdpa
    computes the same attention on the same padded batches), and its DeepSpeed configs' bf16 on exactly when
    ``dtype`` is bf16 (the source hard-codes ``bf16=True``; the fp32 check turns it off)."""
    for name in ("AutoModelForCausalLM", "AutoModelForSequenceClassification"):
        cls = getattr(mod, name)

        def loaded(*args, _cls=cls, **kwargs):
            return _cls.from_pretrained(*args, **{**kwargs, "torch_dtype": dtype, "attn_implementation": "sdpa"})

        setattr(mod, name, types.SimpleNamespace(from_pretrained=loaded))
    for name in ("get_train_ds_config", "get_eval_ds_config"):
        fn = getattr(mod, name)
        setattr(mod, name, lambda *a, _fn=fn, **k: _fn(*a, **{**k, "bf16": dtype == torch.bfloat16}))


class RecordedEngine:
    """The vLLM engine's place: ``generate.remote`` returns, for each prompt of the step, its G recorded completions
    (up to and with the EOS, as vLLM's ``token_ids``), after checking the prompt ids are ours."""

    def __init__(self, ours: list[dict], G: int):
        self.ours, self.G, self.calls = ours, G, 0
        self.generate = _Remote(self._generate)
        self.init_process_group = _Remote(lambda *a, **k: None)
        self.update_weight = _Remote(lambda *a, **k: None)

    def _generate(self, sampling_params=None, prompt_token_ids=None, use_tqdm=False):
        s, self.calls = self.ours[self.calls], self.calls + 1
        P, out = s["prompt_length"], []
        for j, ids in enumerate(prompt_token_ids):
            row = j * self.G
            if ids != s["input_ids"][row, :P][s["attention_mask"][row, :P].bool()].tolist():
                raise AssertionError(f"prompt {j}: the source's prompt ids are not the recorded ones")
            done = [types.SimpleNamespace(token_ids=s["input_ids"][r, P:][s["response_mask"][r].bool()].tolist())
                    for r in range(row, row + self.G)]
            out.append(types.SimpleNamespace(outputs=done))
        return out


def prompts_dataset(mod, ours: list[dict], tokenizer, data_cfg):
    """Our prompts, step after step, tokenized by the commit's own transform (release:
    ``SFTGroundTruthDatasetProcessor.tokenize``; GRPO: ``dataset_transformation.rlvr_tokenize_v1``); a row's ground
    truth names its step (the recorded reward is fed per row) and a source tag no verifier has."""
    from datasets import Dataset

    rows = [{"messages": p, "ground_truth": f"{TAG}{k}", "dataset": "fidelity"}
            for k, s in enumerate(ours) for p in s["prompts"]]
    data = Dataset.from_list(rows)
    if hasattr(mod, "SFTGroundTruthDatasetProcessor"):
        return mod.SFTGroundTruthDatasetProcessor(tokenizer=tokenizer, config=data_cfg).tokenize(data)
    from open_instruct.dataset_transformation import rlvr_tokenize_v1
    return data.map(rlvr_tokenize_v1, fn_kwargs={"tokenizer": tokenizer})


def their_tokenizer(mod, path: Path, data_cfg, model_cfg):
    """The tokenizer as the script's ``main`` makes it. Release (ppo_vllm_thread_ray_gtrl.py ``main``): right padding,
    a ``[PAD]`` token added (its Llama branch compares a list to a string and never fires) and the ``--chat_template``;
    GRPO: ``TokenizerConfig(...).tokenizer`` with ``--chat_template_name``. Either way the pad is a token the policy
    never samples (get_reward and forward treat every pad id as padding)."""
    if hasattr(mod, "TokenizerConfig"):
        # Our tiny tokenizer names an in-vocabulary pad, which the random tiny policy samples; a Llama 3.1 checkpoint
        # has none, and get_tokenizer_tulu_v1 adds "<pad>" past the vocabulary the policy samples. So the source gets
        # the tiny tokenizer without its pad and adds its own, as it does for the checkpoint.
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(path))
        tok.pad_token = None
        tok.save_pretrained(path / "without_pad")
        return mod.TokenizerConfig(model_name_or_path=str(path / "without_pad"), revision=None, use_fast=True,
                                   chat_template_name=model_cfg.chat_template_name, add_bos=model_cfg.add_bos).tokenizer
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path), padding_side="right")
    tok.add_special_tokens({"pad_token": "[PAD]"})
    tok.chat_template = mod.CHAT_TEMPLATES[data_cfg.chat_template]
    return tok


def feed(mod, ours: list[dict]) -> None:
    """Our draws in place of the source's seeded ones: the prompts of each step (``ShufflingIterator`` yields the
    dataset's rows step by step: :func:`prompts_dataset` lays them out so), each PPO epoch's permutation
    (``np.random.permutation``), and the verifier's reward of each row (``apply_verifiable_reward``: the rows of a step
    come in order, ``local_rollout_forward_batch_size`` at a time)."""
    per_step = [len(s["prompts"]) for s in ours]

    class StepIterator:
        def __init__(self, data, batch_size, seed=None):
            self.next_step = 0

        def __iter__(self):
            return self

        def __next__(self):
            k, self.next_step = self.next_step, self.next_step + 1
            return list(range(sum(per_step[:k]), sum(per_step[:k + 1])))

    orders = iter([o.numpy() for s in ours for o in s["orders"]])
    np.random.permutation = lambda n: next(orders)
    seen: dict[int, int] = {}

    def recorded_reward(*args, **kwargs):
        gts = next(a for a in args if isinstance(a, list) and a and str(a[0]).startswith(TAG))
        k = int(gts[0].removeprefix(TAG))
        first, seen[k] = seen.get(k, 0), seen.get(k, 0) + len(gts)
        r = ours[k]["raw"][first:first + len(gts)].float()
        return r, (r > 0).sum().float().view(-1)

    mod.ShufflingIterator, mod.apply_verifiable_reward = StepIterator, recorded_reward


class Tracer:
    """The learner's locals, read where ``train`` keeps them (it computes the advantages inline, not in a function):
    at each line of ``train``, a new ``training_step`` starts a record, and the first PPO epoch's permutation
    (``b_inds``) marks the advantages, the queries and the response mask as final."""

    def __init__(self, code, record: list[dict], R: int):
        self.code, self.record, self.R, self.step, self.b_inds = code, record, R, None, None

    def __call__(self, frame, event, arg):
        return self.line if frame.f_code is self.code else None

    def line(self, frame, event, arg):
        loc = frame.f_locals
        if loc.get("training_step") is not None and loc["training_step"] != self.step:
            self.step = loc["training_step"]
            self.record.append({"micro": [], "value_micro": [], "grad_norm": [], "lr": [], "value_grad_norm": []})
        b = loc.get("b_inds")
        if b is not None and b is not self.b_inds:
            self.b_inds = b
            if loc["epoch_idx"] == 0:
                adv = loc["advantages"]
                self.record[-1].update(advantages=(adv[:, :self.R] if adv.dim() == 2 else adv).detach().clone(),
                                       prompt_ids=loc["queries"].clone(),
                                       completion_mask=(~loc["padding_mask"][:, :self.R]).long())
        return self.line


def gathered(model) -> dict:
    """The full state dict of a DeepSpeed engine's module, ZeRO-3 partitions gathered."""
    import deepspeed

    params = [p for p in model.parameters() if hasattr(p, "ds_id")]
    with deepspeed.zero.GatheredParameters(params, enabled=bool(params)):
        return {k: v.detach().float().clone() for k, v in model.state_dict().items()}


def instrument(trainer, record: list[dict], R: int) -> None:
    """Record each micro-batch's log-probs (with grad) and loss, the value model's loss, and at each optimiser step
    (DeepSpeed's accumulation boundary) the gradient norm, the lr it steps with and the weights after it."""
    forward = trainer.forward

    def fwd(*args, **kwargs):
        lp = forward(*args, **kwargs)
        if torch.is_grad_enabled():
            record[-1]["micro"].append({"logprobs": lp.detach().float()[:, :R].clone()})
        return lp

    trainer.forward = fwd
    engines = [(trainer.model, "")] + ([(trainer.value_model, "value_")] if hasattr(trainer, "value_model") else [])
    for engine, prefix in engines:
        _hook_engine(engine, prefix, record)


def _hook_engine(engine, prefix: str, record: list[dict]) -> None:
    backward, step = engine.backward, engine.step

    def bwd(loss, *args, **kwargs):
        key = "value_micro" if prefix else "micro"
        if prefix:
            record[-1][key].append({})
        record[-1][key][-1]["loss"] = float(loss)
        return backward(loss, *args, **kwargs)

    def stepped(*args, **kwargs):
        boundary, lr = engine.is_gradient_accumulation_boundary(), engine.get_lr()[0]
        out = step(*args, **kwargs)
        if boundary:
            record[-1][f"{prefix}grad_norm"].append(float(engine.get_global_grad_norm()))
            if not prefix:
                record[-1]["lr"].append(float(lr))
            record[-1][f"{prefix}weights"] = gathered(engine.module)
        return out

    engine.backward, engine.step = bwd, stepped


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def main(command_file: str, ours_dir: str, given: str = "{}") -> None:
    torch.set_num_threads(1)
    install_stand_ins()
    out, given = Path(ours_dir), json.loads(given)
    ours = torch.load(out / "ours.pt", weights_only=False)
    meta, steps = ours["meta"], ours["steps"]
    dtype = getattr(torch, given.get("engine", {}).get("dtype", "float32"))
    name, flags = source_flags(Path(command_file))
    mod = importlib.import_module(name)
    init = v4_folder(out / "init", out / "oi_init")
    critic = v4_folder(out / "init_critic", out / "oi_init_critic") if (out / "init_critic").exists() else None
    meta = {**meta, "rows": steps[0]["input_ids"].shape[0]}
    args, data_cfg, model_cfg = tiny_args(mod, flags, meta, init, critic, out / "oi_run", given.get("deviations", {}))
    engine_dtype(mod, dtype)
    feed(mod, steps)
    tokenizer = their_tokenizer(mod, init, data_cfg, model_cfg)
    data = prompts_dataset(mod, steps, tokenizer, data_cfg)
    os.environ.setdefault("MASTER_PORT", free_port())
    trainer = mod.PolicyTrainerRayProcess(1, 0, "cpu", os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    trainer.from_pretrained(args, model_cfg, types.SimpleNamespace(beaker_dataset_id_urls=[]), None)  # not on Beaker
    record: list[dict] = []
    R = steps[0]["response_mask"].shape[1]
    instrument(trainer, record, R)
    collator = mod.SimpleGenerateCollatorWithGroundTruth(pad_token_id=tokenizer.pad_token_id)
    sys.settrace(Tracer(type(trainer).train.__code__, record, R))
    try:
        trainer.train(data, None, tokenizer, [RecordedEngine(steps, meta["group_size"])], queue.Queue(), collator)
    finally:
        sys.settrace(None)
    for s in record:  # the value model's micro-batch losses beside the policy's (PPO: the critic steps first)
        for m, v in zip(s["micro"], s.pop("value_micro")):
            m["value_loss"] = v["loss"]
    commit = (Path(sys.modules["open_instruct"].__path__[0]).parent / "COMMIT").read_text().strip()
    versions = {"open_instruct": commit[:8], "transformers": sys.modules["transformers"].__version__,
                "deepspeed": sys.modules["deepspeed"].__version__, "torch": torch.__version__}
    torch.save({"versions": versions, "args": vars(args), "steps": record}, out / "open_instruct.pt")


def run(main_fn, usage: str) -> None:
    """``main_fn(*argv)``, exiting whatever threads it left (the learner's generation thread waits on its queue)."""
    if len(sys.argv) not in (3, 4):
        sys.exit(usage)
    try:
        main_fn(*sys.argv[1:])
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)


if __name__ == "__main__":
    run(main, "usage: python tests/fidelity/open_instruct_rl.py COMMAND OURS_DIR [GIVEN_JSON]")
