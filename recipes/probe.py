"""``python -m recipes.probe recipe=NAME [overrides] [--json]``: a recipe's per-GPU memory and FLOPs at its real shapes,
on a CPU, before any GPU-hour is spent.

The project's own code runs one micro-step of each phase on fake tensors (``torch._subclasses.FakeTensorMode``:
shapes, dtypes and storage sizes, no data, nothing allocated), at the recipe's model config (core/models/shapes.py,
no hub needed), lengths and micro-batches:

- ``logprobs``: :func:`recipes.rl_update.rollout_forwards` on ``train.logprob_micro_batch_size`` rows of max prompt +
  max new tokens: old policy (when the loop needs it), reference, critic values, no grad;
- ``update``: :func:`recipes.rl_update.micro_step` on ``train.micro_batch_size`` rows: the policy's forward, its loss
  (``compute_policy_loss``) and backward, then the critic's (PPO);
- ``rm_update`` (reward-model loop): the pair forward, ``bt_loss`` and backward of ``train.micro_batch_size`` pairs
  of ``train.max_len`` tokens.

The models come from the loops' own loaders (``load_causal_lm``, ``load_critic``, ``recipes.rm.build_model``),
whose ``from_pretrained`` builds from the local config instead of reading weights (:func:`configs_only`), so
dtype, gradient checkpointing, dropout and LoRA are what a run gets. Attention is ``sdpa`` (flash-attn needs CUDA);
its flash kernel keeps O(T) memory per layer as flash-attn does. ``MemTracker``
(``torch.distributed._tools.mem_tracker``) records the peak of activations and temporaries; ``FlopCounterMode``
counts FLOPs. Model states are ZeRO-sharded per GPU by DeepSpeed's own estimators, and the frozen reference, the
critic and the colocated vLLM reservation are added per GPU (core/planning/states.py ``resident``: one source for
the probe and ``recipes.plan``).
"""
from __future__ import annotations

import contextlib
import copy
import json
import sys
import time
from dataclasses import dataclass
from unittest import mock

import torch
from omegaconf import OmegaConf
from torch.distributed._tools.mem_tracker import MemTracker

from core.errors import InputError, tool_main
from core.planning.states import GiB, at_vllm_start, prompt_tokens, resident, state_parts
from core.planning.traffic import Traffic
from core.registry import Registry


@dataclass
class Phase:
    name: str
    activations: int  # peak bytes beyond the model states: activations, temporaries, logits
    flops: int
    rows: int  # rows of the micro-step (RM: sequences, chosen and rejected)
    tokens: int  # tokens per row
    bytes: int = 0  # read and written by the ops that are not matrix products or attention (core/planning/traffic.py)
    ops: int = 0  # ops dispatched, each a kernel launch in eager mode
    module_passes: int = 0  # forwards and backwards of parameter-owning modules: ZeRO-3's gathers


# loop -> fn(cfg, plan) -> (list[Phase], models): the phases of one micro-step of that loop
PHASES: Registry = Registry("loop")


def probe(overrides: list[str], fake: bool = True) -> dict:
    """The report of ``overrides`` (a recipe and any keys): phases, resident memory per GPU, total, fit.
    ``fake=False`` runs the same code on real tensors (a tiny model: the tests hold the fake figures to it)."""
    return probe_prepared(prepared_config(overrides), fake)


def probe_prepared(prepared, fake: bool = True) -> dict:
    """:func:`probe` of a config :func:`prepared_config` prepared already (``recipes.plan`` checks it first)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    cfg = prepared.config
    hw, gpus = cfg.hardware, shard_gpus(cfg)
    start = time.perf_counter()
    # a ShapeEnv lets the loops' .item() metrics return symbols instead of failing on data-less tensors
    tensors = FakeTensorMode(shape_env=ShapeEnv()) if fake else contextlib.nullcontext()
    built = sdpa_config(cfg)
    with tensors, configs_only(built), flash_like_attention(), torch.random.fork_rng():
        phases, models = PHASES.get(cfg.loop)(built, prepared.plan)
    at_start = at_vllm_start(cfg, prepared.plan, models, gpus)
    res = resident(cfg, models, gpus, at_start)
    training = sum(v for k, v in res.items() if k != "vllm_awake")
    per_phase = {p.name: {"peak_bytes": training + p.activations, "activation_bytes": p.activations,
                          "flops": p.flops, "traffic_bytes": p.bytes, "ops": p.ops,
                          "module_passes": p.module_passes, "rows": p.rows,
                          "tokens_per_row": p.tokens} for p in phases}
    if res["vllm_awake"]:  # generation: the trainer's states stay, vLLM takes its reservation
        per_phase["generate"] = {"peak_bytes": training - res["vllm_training"] + res["vllm_awake"],
                                 "activation_bytes": 0, "flops": 0, "rows": 0, "tokens_per_row": 0}
    report = {"recipe": cfg.recipe_name, "hardware": {"name": hw.name, "memory_gib": float(hw.memory_gib),
                                                      "gpus": gpus, "nodes": int(hw.nodes)},
              "model": cfg.model.name_or_path, "phases": per_phase, "resident_bytes": res,
              "trainer_bytes_at_vllm_start": at_start,
              # the trained models' states split (weights, gradients, optimiser, frozen): they sum to model_states
              # and critic_states (core/planning/states.py)
              "state_parts": {role: state_parts(m, cfg.zero, gpus) for role, m in models.items()
                              if m is not None and role != "reference"},
              # the allocated peak: what torch.cuda.max_memory_allocated reports
              "per_gpu_bytes": max(p["peak_bytes"] for p in per_phase.values())}
    return {**report, **verdict(cfg, prepared.plan, report), "probe_seconds": round(time.perf_counter() - start, 1)}


def verdict(cfg, plan, report: dict) -> dict:
    """Each phase's overhead beyond the allocated peak (core/planning/memory.py ``overhead``: CUDA context, NCCL,
    DeepSpeed's buckets, fragmentation; what ``recipes.plan`` adds too), the largest total per GPU and whether it
    fits the card."""
    from core.planning.memory import overhead, trainer_bytes

    gpus = report["hardware"]["gpus"]
    for name, phase in report["phases"].items():
        phase["overhead_bytes"] = sum(b for _, b, _ in overhead(cfg, plan, gpus, name, trainer_bytes(report, name)))
    total = max(p["peak_bytes"] + p["overhead_bytes"] for p in report["phases"].values())
    return {"per_gpu_total_bytes": total, "fits": total <= float(cfg.hardware.memory_gib) * GiB}


def sdpa_config(cfg):
    """The config the probe builds and runs the models from: the run's, with sdpa attention (flash-attn runs on CUDA
    only; sdpa's flash kernel keeps the same O(T) memory, :func:`flash_like_attention`). The run's own attention stays
    in the prepared config, which the time side reads (core/planning/phases.py: HF generate's decode)."""
    built = copy.deepcopy(cfg)
    OmegaConf.set_readonly(built, False)
    built.model.attn_implementation = "sdpa"
    OmegaConf.set_readonly(built, True)
    return built


def prepared_config(overrides: list[str]):
    """The recipe's config prepared as a run prepares it (core/config/pipeline.py ``prepare``, checked in a world of
    its learners); an unknown recipe or hardware profile names the available ones."""
    from hydra.errors import MissingConfigException

    from core.config.pipeline import prepare
    from core.paths import CONF_DIR

    try:
        return prepare(overrides, launched=True, packages=False)
    except MissingConfigException as e:
        group = next((g for g in ("recipe", "hardware") if f"'{g}/" in str(e) or f"{g}=" in str(e)), None)
        if group is None:
            raise
        given = next(o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].lstrip("+~") == group)
        names = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
        raise InputError(f"{group}={given}: no such {group}; available: {', '.join(names)}") from None


def shard_gpus(cfg) -> int:
    """GPUs the trained model is sharded over: the layout's learners (RL), every GPU of the hardware (RM)."""
    if cfg.loop == "rl":
        return int(cfg.layout.learner_gpus)
    return int(cfg.hardware.nodes) * int(cfg.hardware.gpus_per_node)


# ----------------------------------------------------------------------------- models without weights
TINY = "<tiny>"  # what the loaders are given for a locally built tiny model (model.tiny)


@contextlib.contextmanager
def configs_only(cfg):
    """``from_pretrained`` of the Auto classes builds the model from its local config (core/models/shapes.py; a
    tiny model's from ``model.tiny``) with random (here: fake) weights and returns it in eval mode, as
    ``from_pretrained`` does; every other step of the loaders (dtype, attention, checkpointing, heads, dropout,
    LoRA) runs as in a run."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from core.models.shapes import shape_config

    model_cfg, critic = cfg.model, cfg.get("advantage", {}).get("critic") or {}
    keys = {critic.get("init_from"): "advantage.critic.init_from"}  # which setting named a checkpoint, for errors

    def config_of(path: str):
        return shape_config(model_cfg, "" if path == TINY else path, keys.get(path, "model.name_or_path"))

    def from_pretrained(cls, path, *args, output_loading_info=False, num_labels=None, **kwargs):
        config = config_of(str(path))
        if num_labels is not None:
            config.num_labels = num_labels
        model = cls.from_config(config, **kwargs).eval()
        fresh = {"missing_keys": [n for n, _ in model.named_parameters() if n.startswith("score.")]}
        return (model, fresh) if output_loading_info else model

    with contextlib.ExitStack() as stack:
        for cls in (AutoModelForCausalLM, AutoModelForSequenceClassification):
            stack.enter_context(mock.patch.object(cls, "from_pretrained", classmethod(from_pretrained)))
        # every model is built on this CPU, so the engines' .to(cpu) has nothing to move; done by Module._apply it
        # would try to swap each fake parameter, which fails for tied ones (embeddings = LM head)
        stack.enter_context(mock.patch.object(torch.nn.Module, "to", lambda self, *a, **k: self))
        yield


@contextlib.contextmanager
def flash_like_attention():
    """sdpa without a ``T x T`` mask, as flash-attn runs: the probe's rows are full length (no padding), for which a
    real run skips the mask and calls sdpa with ``is_causal`` (HF ``_ignore_causal_mask_sdpa``), but HF cannot read a
    fake mask and would build one; a packed row runs as one causal sequence (flash-attn's varlen kernel needs no
    mask either; its memory is the same O(T), its attention FLOPs those of the per-sequence squares)."""
    from transformers import masking_utils

    with mock.patch.object(masking_utils, "_ignore_causal_mask_sdpa", lambda *a, **k: True), \
            mock.patch.object(masking_utils, "find_packed_sequence_indices", lambda position_ids: None):
        yield


def copies_stay_fake():
    """Deep copies made while a model is built (peft's ``modules_to_save``) in the active fake mode, not a new one
    (``FakeCopyMode``); nothing to do on real tensors."""
    from torch._guards import active_fake_mode
    from torch._subclasses.fake_tensor import FakeCopyMode

    mode = active_fake_mode()
    return FakeCopyMode(mode) if mode is not None else contextlib.nullcontext()


def model_path(model_cfg) -> str:
    """What the loaders are given: the hub name, or :data:`TINY` for a locally built tiny model."""
    return str(model_cfg.name_or_path) if model_cfg.name_or_path else TINY


# ----------------------------------------------------------------------------- measuring a phase
def measure(fn, models) -> tuple[int, int, Traffic]:
    """``(peak bytes beyond the weights, FLOPs, traffic)`` of ``fn()`` running ``models``: activations, temporaries,
    logits, and each weight gradient only while it is produced (:func:`grads_dropped`); the traffic counts the ops and
    the bytes of those that are not matrix products or attention (core/planning/traffic.py)."""
    tracker, flops = ActivationPeak(), total_flop_counter()
    traffic = Traffic(flops.flop_registry)
    tracker.track_external(*[m for m in models if m is not None])
    with grads_dropped(models), flops, traffic, tracker:  # the tracker entered last: the others add nothing to its peak
        fn()
    return tracker.peak, flops.get_total_flops(), traffic


def total_flop_counter():
    """``FlopCounterMode`` counting the total only, sdpa's CPU kernels included. Its ``ModuleTracker`` attributes FLOPs
    to modules through autograd hooks that keep module outputs alive into backward: twice the peak memory of a
    4-layer model here. Its table has no formula for the CPU flash kernel the probe runs; torch's own sdpa formulas
    (the full ``T x T`` square, as it counts the CUDA kernels) are given for it."""
    from torch.utils import flop_counter as F

    aten = torch.ops.aten
    counter = F.FlopCounterMode(display=False, custom_mapping={
        aten._scaled_dot_product_flash_attention_for_cpu:
            lambda q, k, v, *_, out_val=None, **__: F.sdpa_flop_count(q, k, v),
        aten._scaled_dot_product_flash_attention_for_cpu_backward:
            lambda g, q, k, v, *_, out_val=None, **__: F.sdpa_backward_flop_count(g, q, k, v)})
    counter.mod_tracker = _GlobalOnly()
    return counter


class _GlobalOnly(contextlib.nullcontext):
    parents = frozenset({"Global"})  # FlopCounterMode adds each op's FLOPs to every parent module named here


@contextlib.contextmanager
def grads_dropped(models):
    """Each weight gradient freed as soon as it is accumulated: ZeRO-2/3 reduce-scatter a gradient bucket and free
    it (the shard they keep is in ``model_states``, core/planning/states.py, as is stage 0's whole gradient), so the
    gradients of a whole model never pile up during backward as they would on the plain engine here."""
    hooks = [p.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
             for m in models if m is not None for p in m.parameters() if p.requires_grad]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()


class ActivationPeak(MemTracker):
    """``MemTracker`` keeping one figure: the peak of everything but the models' parameters and buffers (ZeRO-sharded:
    ``model_states`` counts them). They are registered once (``track_external``), so its per-module hooks, which
    re-walk a module's parameters and snapshot the memory on every call (minutes for a 70B), are off; so are its
    per-module peaks."""

    peak = 0

    def __enter__(self) -> "ActivationPeak":
        super().__enter__()
        self._mod_tracker.clear_user_hooks()  # the per-module snapshots: ModTracker alone tracks fw/bw state
        return self

    def _update_peak_stats(self, peak_state) -> None:
        for snap in self._curr_mem_snap.values():
            self.peak = max(self.peak, sum(snap.get(k, 0) for k in ("Activation", "Temp", "Other", "Gradient")))


# ----------------------------------------------------------------------------- the RL loop's phases
@PHASES.register("rl")
def rl_phases(cfg, plan):
    """``logprobs`` and ``update`` of recipes/rl.py, each on fake rows of full length."""
    from recipes import rl_update

    run = _rl_run(cfg, plan)
    P, R = prompt_tokens(cfg), int(cfg.rollout.max_new_tokens)
    lp_rows, micro = plan.logprob_micro_batch_size, plan.micro_batch_size
    models = [run.engine.module, run.ref and run.ref.module, run.critic and run.critic.module]
    act, flops, t = measure(lambda: rl_update.rollout_forwards(run, _rollout(lp_rows, P, R)), models)
    phases = [Phase("logprobs", act, flops, lp_rows, P + R, t.bytes, t.ops, t.module_passes)]
    roll = _rollout(micro, P, R)
    fw = _forwards(roll, run)
    mask = roll.response_mask.float()  # [n, R]
    adv = ret = torch.zeros_like(mask)  # [n, R]
    agg = _agg(cfg, run, mask)
    act, flops, t = measure(lambda: rl_update.micro_step(run, roll, torch.arange(micro), mask, adv, ret, fw, agg),
                            models)
    phases.append(Phase("update", act, flops, micro, P + R, t.bytes, t.ops, t.module_passes))
    return phases, {"policy": run.engine.module, "reference": run.ref and run.ref.module,
                    "critic": run.critic and run.critic.module}


def _rl_run(cfg, plan):
    """A :class:`recipes.rl.Run` holding what one micro-step touches: the models as
    :func:`recipes.rl_models.load_models` builds them, on a backend that keeps them whole on the CPU (ZeRO's sharding
    is counted by ``model_states``): the policy's and critic's engines (plain torch), the frozen reference, the
    KL controller."""
    from core.algorithms.kl_control import KLController
    from core.config.schema import ZeroConfig, node
    from core.training.backend import Backend
    from core.training.device import DTYPES
    from recipes import rl, rl_models

    backend = Backend(node(ZeroConfig, stage=0), torch.device("cpu"), DTYPES[cfg.model.dtype])  # whole, on the CPU
    micro = plan.grad_accum
    policy, ref, critic = rl_models.load_models(cfg, plan, model_path(cfg.model), backend)
    engine = backend.train_engine(policy, cfg.optim, 1, micro, plan.micro_batch_size)
    if critic is not None:
        critic = backend.train_engine(critic, rl_models.critic_optim(cfg), 1, micro, plan.micro_batch_size)
    return rl.Run(cfg=cfg, plan=plan, run_dir=None, backend=backend, tokenizer=None, data=None, verifier=None,
                  engine=engine, critic=critic, ref=backend.frozen(ref) if ref is not None else None, rollout=None,
                  gen=None, writer=None, kl_ctl=KLController(cfg.kl))


def _rollout(n: int, P: int, R: int):
    """``n`` rows of a full-length rollout: every prompt and response token real (the longest micro-batch)."""
    from core.rollout import RolloutBatch

    ids = torch.zeros(n, P + R, dtype=torch.long)  # [n, P+R]
    return RolloutBatch(ids, torch.ones_like(ids), torch.ones(n, R, dtype=torch.long), torch.zeros(n, R),
                        ["length"] * n, P)


def _forwards(roll, run):
    """The rollout-phase log-probs and values the update reads: as many as the loop would have."""
    from recipes import rl_update

    lp = roll.logprobs  # [n, R]
    return rl_update.Forwards(old=torch.zeros_like(lp), ref=torch.zeros_like(lp) if run.ref is not None else None,
                       values=torch.zeros_like(lp) if run.critic is not None else None, rollout=lp)


def _agg(cfg, run, mask):
    from core.algorithms.loss import AggContext

    return AggContext(num_micro_batches=run.plan.grad_accum, step_tokens=float(mask.numel() * run.plan.grad_accum),
                      world_size=run.plan.world_size, max_tokens=int(cfg.rollout.max_new_tokens))


# ----------------------------------------------------------------------------- the reward-model loop's phase
@PHASES.register("rm")
def rm_phases(cfg, plan):
    """``rm_update``: recipes/rm.py's micro-step (pair forward, Bradley-Terry loss, backward) on ``micro`` pairs of
    ``train.max_len`` tokens, packed or padded as ``train.packing`` says."""
    from core.models import reward_model as RM
    from core.training.engine import TorchEngine
    from recipes import rm

    t, cpu = cfg.train, torch.device("cpu")

    class _Tokenizer:  # build_model reads only the pad id
        pad_token_id = 0

    with copies_stay_fake():  # LoRA's modules_to_save deep-copies the score head
        model = rm.build_model(model_path(cfg.model), cfg, _Tokenizer())
    engine = TorchEngine(model, cfg.optim, 1, 1, cpu)
    L, micro = t.max_len, plan.micro_batch_size
    pairs = [{"chosen": [0] * L, "rejected": [0] * L} for _ in range(micro)]
    batch = RM.packed_batch(pairs) if t.packing else RM.pair_batch(pairs, 0, t.padding_side)

    def step():
        r = engine.forward(RM.sequence_rewards, batch)  # [2 x micro]
        engine.backward(RM.bt_loss(r, batch["margin"], t.loss)[0])

    act, flops, t = measure(step, [engine.module])
    phase = Phase("rm_update", act, flops, 2 * micro, L, t.bytes, t.ops, t.module_passes)
    return [phase], {"policy": engine.module, "reference": None, "critic": None}


# ----------------------------------------------------------------------------- output
def table(report: dict) -> list[str]:
    """The report as a short table: per phase, GiB per GPU and what it holds, then the verdict."""
    hw, res = report["hardware"], report["resident_bytes"]
    out = [f"recipe {report['recipe']}: {report['model']} on {hw['gpus']} x {hw['name']} ({hw['memory_gib']:.1f} GiB "
           f"each), probed in {report['probe_seconds']} s",
           "resident per GPU: " + ", ".join(f"{k} {_gib(v)}" for k, v in res.items() if v and k != "vllm_awake")]
    out.append(f"{'phase':<10} {'rows x tokens':>14} {'activations':>12} {'peak/GPU':>9} {'+overhead':>10} "
               f"{'TFLOPs':>9}")
    for name, p in report["phases"].items():
        out.append(f"{name:<10} {p['rows']:>6} x {p['tokens_per_row']:<6} {_gib(p['activation_bytes']):>12} "
                   f"{_gib(p['peak_bytes']):>9} {_gib(p['peak_bytes'] + p['overhead_bytes']):>10} "
                   f"{p['flops'] / 1e12:>9.1f}")
    worst = max(report["phases"].items(), key=lambda kv: kv[1]["peak_bytes"])
    generating = worst[0] == "generate"
    parts = {"model_states": res["model_states"] + res["critic_states"], "reference": res["reference"],
             "vllm": res["vllm_awake"] if generating else res["vllm_training"],
             "activations": 0 if generating else worst[1]["activation_bytes"]}
    top = max(parts, key=parts.get)
    verdict = "fits" if report["fits"] else "does NOT fit"
    out.append(f"per GPU {_gib(report['per_gpu_bytes'])} GiB allocated at {worst[0]} (largest part: {top} "
               f"{_gib(parts[top])} GiB), {_gib(report['per_gpu_total_bytes'])} GiB with the CUDA context, NCCL, "
               f"DeepSpeed's buckets and fragmentation: {verdict} in {hw['memory_gib']:.1f} GiB")
    return out


def _gib(b: int) -> str:
    return f"{b / GiB:.1f}"


def main(argv: list[str]) -> None:
    tool_main(_report, argv, __doc__)


def _report(argv: list[str]) -> None:
    """The probe's table (``--json``: the report as JSON) on stdout."""
    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed logs to stdout on import; stdout is the report's
        report = probe([a for a in argv if a != "--json"])
    print(json.dumps(report, indent=1) if "--json" in argv else "\n".join(table(report)))


if __name__ == "__main__":
    main(sys.argv[1:])
