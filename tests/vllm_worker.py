"""Worker for tests/test_rollout_vllm.py: the vLLM engine, on the recording double, under ZeRO-3 on this rank.

Run as ``DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 tests/vllm_worker.py MODEL_DIR OUT``; rank r writes
``OUT.rank<r>.pt``. It builds a tiny policy partitioned (every parameter, none kept whole), then:

1. an engine with ``tensor_parallel_size=2`` and sleep mode: push, generate (rank 0 holds 3 prompts, rank 1
   holds 2), one optimiser step, push again (rank 0 also keeps DeepSpeed's own consolidated weights);
2. an engine with ``tensor_parallel_size=1`` and no sleep: push, generate, then generate with a batch seed and no
   log-probs asked for;
3. ``tensor_parallel_size=4`` on 2 ranks, which must be refused;
4. the RL loop itself (recipes/rl.py ``setup``, ``train``, ``save``) with ``rollout.engine=vllm`` on the double at
   ``tensor_parallel_size=2`` (both ranks one engine), sampling at temperature 1: a run of 2 steps, and a run
   stopped after step 1 then resumed to step 2 (:func:`loop_runs`). The double stands in for vLLM in this process:
   ``core.rollout.installed`` reports it installed, and the loop's ``build_rollout`` passes it to the engine (the
   engine refuses a machine without CUDA before importing the real one).
"""
from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from core.config import schema  # noqa: E402
from core.errors import InputError  # noqa: E402
from core.models.loading import load_causal_lm, load_tokenizer  # noqa: E402
from core.rollout import Sampling  # noqa: E402
from core.rollout.vllm import VLLMRollout  # noqa: E402
from core.training import distributed  # noqa: E402
from core.training.backend import Backend  # noqa: E402
from tests import vllm_double  # noqa: E402

MODEL = schema.node(schema.ModelConfig, {"dtype": "float32", "attn_implementation": "sdpa"})
# threshold 0: no parameter of the tiny model stays whole on every rank (DeepSpeed keeps those under 1e5
# elements unpartitioned by default, which would be all of them)
ZERO3 = schema.node(schema.ZeroConfig, {"stage": 3, "options": {"stage3_param_persistence_threshold": 0}})
OPTIM = schema.node(schema.OptimConfig, {"optimizer": {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.5},
                                         "max_grad_norm": 0.0, "scheduler": {"name": "constant"}})
PROMPTS = {0: [[25, 26, 27], [28], [29, 30]], 1: [[31, 32], [33, 34, 35, 36]]}  # unequal counts on purpose
SAMPLING = Sampling(max_new_tokens=3, temperature=1.0)


def whole_numel(model) -> int:
    """Elements of the parameters ZeRO-3 holds whole on this rank right now."""
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    return sum(p.ds_numel for p in model.parameters() if p.ds_status != ZeroParamStatus.NOT_AVAILABLE)


def rollout(engine, tok, vllm_cfg: dict) -> VLLMRollout:
    roll = VLLMRollout(engine.module, tok, schema.node(schema.RolloutConfig, {"vllm": vllm_cfg}), vllm=vllm_double)
    roll.llm.probe = lambda: whole_numel(engine.module)
    return roll


def one_step(engine) -> None:
    ids = torch.tensor([[25, 26, 27, 28], [29, 30, 31, 32]])
    loss = engine.forward(lambda m, x: m(input_ids=x).logits.logsumexp(-1).mean(), ids)
    engine.backward(loss)
    engine.step()


def record(roll: VLLMRollout, batch) -> dict:
    """What the engine's double recorded so far (copies: later calls add to its lists) and ``batch``."""
    llm = roll.llm
    return {"kwargs": llm.kwargs, "events": list(llm.events), "loads": list(llm.loads), "prompts": list(llm.prompts),
            "seeds": list(llm.seeds), "outputs": list(llm.outputs), "vocab": llm.vocab,
            "generate_probes": list(llm.generate_probes), "collective": roll.collective,
            "response_ids": batch.response_ids.tolist(), "response_mask": batch.response_mask.tolist(),
            "logprobs": None if batch.logprobs is None else batch.logprobs.tolist()}


# the tiny recipe on the double: both ranks one vLLM engine, sampled rollouts, a checkpoint every step
LOOP = ["scale=tiny", "rollout=vllm", "rollout.engine=vllm", "rollout.vllm.tensor_parallel_size=2",
        "rollout.greedy=false", "rollout.temperature=1.0", "rollout.max_new_tokens=4", "train.warm_start.steps=0",
        "train.eval_prompts=4", "train.checkpoint_every=1", "logger.progress=false", "logger.tensorboard=false"]


def loop_runs(out: Path) -> dict:
    """What this rank's double generated at each call (prompts, request seeds, tokens) in: a run of 2 steps
    (``whole``); a run of 1 step (``first``); that run resumed to 2 steps (``resumed``)."""
    import core.rollout
    from core.registry import installed
    from recipes import rl

    core.rollout.installed = lambda package: package == "vllm" or installed(package)  # the double is vLLM here
    rl.build_rollout = lambda name, model, tok, cfg: VLLMRollout(model, tok, cfg, vllm=vllm_double)
    return {"whole": _loop(rl, out / "whole", 2, False), "first": _loop(rl, out / "cut", 1, False),
            "resumed": _loop(rl, out / "cut", 2, True)}


def _loop(rl, run_dir: Path, steps: int, resume: bool) -> dict:
    from hydra.core.global_hydra import GlobalHydra

    from core.config.composition import compose

    GlobalHydra.instance().clear()
    cfg = compose([*LOOP, f"train.total_steps={steps}", f"resume={str(resume).lower()}",
                   f"paths.results_dir={run_dir.parent / 'results'}"], with_hydra=True)
    run = rl.setup(cfg, str(run_dir))
    rl.train(run)
    rl.save(run)
    return {"prompts": run.rollout.llm.prompts, "seeds": run.rollout.llm.seeds, "outputs": run.rollout.llm.outputs,
            "vocab": run.rollout.llm.vocab}


def main(model_dir: str, out: str) -> None:
    rank, _ = distributed.init(torch.device("cpu"))
    backend = Backend(ZERO3, torch.device("cpu"), torch.float32)
    with backend.placed():
        policy = load_causal_lm(model_dir, MODEL)
    tok = load_tokenizer(model_dir)
    engine = backend.train_engine(policy, OPTIM, 10, 1, 2)
    result = {"whole_at_start": whole_numel(engine.module)}

    tp = rollout(engine, tok, {"tensor_parallel_size": 2, "enable_sleep_mode": True})
    tp.sync_weights(engine)
    batch = tp.generate(PROMPTS[rank], SAMPLING)
    try:
        tp.generate(PROMPTS[rank], SAMPLING)  # asleep (level 2: weights discarded) until the next push
        result["refused_asleep"] = False
    except RuntimeError:
        result["refused_asleep"] = True
    one_step(engine)
    result["whole_after_step"] = whole_numel(engine.module)
    tp.sync_weights(engine)
    full = engine.engine._zero3_consolidated_16bit_state_dict()  # collective; rank 0 receives it
    if rank == 0:
        result["consolidated"] = {k.removeprefix("inner."): v for k, v in full.items()}
    result["tp"] = record(tp, batch)

    solo = rollout(engine, tok, {})
    solo.sync_weights(engine)
    result["solo"] = record(solo, solo.generate(PROMPTS[rank], SAMPLING))
    seeded = solo.generate(PROMPTS[rank], replace(SAMPLING, seed=7, first_row=10 * rank, logprobs=False))
    result["seeded"] = {"logprobs": seeded.logprobs, "response_ids": seeded.response_ids.tolist(),
                        "params": solo.llm.params[-1], "seeds": solo.llm.seeds[-1]}

    try:
        rollout(engine, tok, {"tensor_parallel_size": 4})
        result["refused_tp4"] = False
    except InputError:
        result["refused_tp4"] = True
    result["loop"] = loop_runs(Path(f"{out}.loop"))
    torch.save(result, f"{out}.rank{rank}.pt")
    distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
