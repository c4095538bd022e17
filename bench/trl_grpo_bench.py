"""One GRPO step of ``recipes/rl.py`` vs TRL's ``GRPOTrainer`` with the same model and config, on any device.

Same model, prompts (core.data), reward (``get_verifier("math")``), group size, completion length, batch,
learning rate, KL beta (k3 in the loss), token-mean loss (TRL ``loss_type="bnpo"``), one optimiser step per
generation batch, HF ``generate`` on both sides, no gradient checkpointing. Each side runs in a fresh
process, ``BENCH_REPS`` times, alternating which goes first; a step's wall time excludes setup and the
first (warm-up) step. Peak memory is the GPU's peak allocation on CUDA, the process's peak RSS on a CPU.

On a GPU (``BENCH_DEVICE``, default cuda when present) the model is Qwen2.5-0.5B-shaped with random weights
in bf16 (``conf/model/qwen2_5_0_5b_random.yaml``; ``BENCH_MODEL`` names another ``model`` option): the
comparison users care about, goal ours/TRL <= 0.7. On a CPU it is the tiny demo model in fp32 and the
figure only guards against regressions (docs/performance.md).

    python -m bench trl                      # or: make bench
    BENCH_REPS=5 BENCH_STEPS=8 python -m bench trl
    BENCH_PROMPT=simplerl BENCH_MAX_NEW=64 python -m bench trl   # longer prompts / completions

``BENCH_PROMPT=simplerl`` wraps each question in SimpleRL-Zoo's pre-templated Qwen prompt (system turn, the
question, "Please reason step by step, ..."; ../shared/reference/simplerl_zoo.md section 3).
"""
from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import torch

PROMPTS, GROUP, BETA, LR, SEED = 8, 8, 0.04, 1.0e-4, 0
DEVICE = os.environ.get("BENCH_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
MODEL = os.environ.get("BENCH_MODEL") or ("qwen2_5_0_5b_random" if DEVICE.startswith("cuda") else "tiny_qwen2")
MAX_NEW = int(os.environ.get("BENCH_MAX_NEW", 128 if DEVICE.startswith("cuda") else 16))
STEPS = int(os.environ.get("BENCH_STEPS", 6))
REPS = int(os.environ.get("BENCH_REPS", 3))
THREADS = int(os.environ.get("BENCH_THREADS", 1))  # CPU intra-op threads, both sides
TEMPLATES = {
    "plain": "{prompt}",
    # SimpleRL-Zoo's "qwen" rows (hkust-nlp/SimpleRL-Zoo-Data), doubled braces literal as in the data
    "simplerl": ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{prompt}\n"
                 "Please reason step by step, and put your final answer within \\boxed{{{{}}}}.<|im_end|>\n"
                 "<|im_start|>assistant\n"),
}
PROMPT = os.environ.get("BENCH_PROMPT", "plain")


def shared_overrides(device: str = DEVICE, model: str = MODEL, max_new: int = MAX_NEW,
                     steps: int = STEPS) -> list[str]:
    """Our overrides for the shared setting (``make gpu-check`` predicts the same config: bench/gpu_check.py)."""
    n = PROMPTS * GROUP
    return ["recipe_name=bench", f"model={model}", f"device={device}", "train.warm_start.steps=0",
            "logger.progress=false", "logger.tensorboard=false", f"train.prompts_per_step={PROMPTS}",
            f"train.group_size={GROUP}", f"train.mini_batch_size={n}", f"train.micro_batch_size={n}",
            f"train.logprob_micro_batch_size={n}", f"train.total_steps={steps}", f"rollout.max_new_tokens={max_new}",
            f"kl.coef={BETA}", "kl.estimator=k3", "kl.placement=loss", "loss.aggregation=token_mean",
            f"optim.optimizer.lr={LR}", f"seed={SEED}"]


def shared_cfg():
    """Our config for the shared setting; the TRL side reads model, data and sizes from it."""
    from core.config.composition import compose

    cfg = compose(shared_overrides())
    cfg.data.template = TEMPLATES[PROMPT]  # set here: the template's braces and newlines defeat override syntax
    return cfg


def run_ours() -> tuple[list[float], list[dict]]:
    """Per-step wall times of ``recipes.rl.rl_step`` (setup excluded) and each step's seconds per phase."""
    from bench.gpu_smoke import PHASE_METRICS
    from recipes import rl

    run = rl.setup(shared_cfg(), run_dir=tempfile.mkdtemp(prefix="bench_ours_"))
    times, phases = [], []
    for _ in range(STEPS):
        t0 = time.perf_counter()
        metrics = rl.rl_step(run)
        _sync()
        times.append(time.perf_counter() - t0)
        phases.append({p: metrics[k] for p, k in PHASE_METRICS.items()})
    return times, phases


def run_trl() -> tuple[list[float], list[dict]]:
    """Per-step wall times of ``GRPOTrainer.train`` (between consecutive ``on_step_end``: the data loader,
    logging and saving hooks included); no seconds per phase."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from core.data import prompts as D
    from core.models.loading import load_tokenizer, model_dir
    from verifiers import get_verifier

    cfg = shared_cfg()
    path = model_dir(cfg.model)
    rows = D.load_split(cfg.data, "train")
    dataset = Dataset.from_list([{"prompt": D.format_prompt(r["prompt"], cfg.data), "answer": r["answer"]}
                                 for r in rows])
    verifier = get_verifier(cfg.verifier.name)

    def math_reward(completions, answer, **kw):
        return verifier(completions, answer=answer)

    class Timer(TrainerCallback):
        def __init__(self):
            self.times, self.t0 = [], 0.0

        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            _sync()
            self.times.append(time.perf_counter() - self.t0)

    bf16 = cfg.model.dtype == "bfloat16"
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench_trl_"), use_cpu=DEVICE == "cpu", bf16=bf16, fp16=False,
        gradient_checkpointing=False, report_to="none", loss_type="bnpo", beta=BETA, num_generations=GROUP,
        per_device_train_batch_size=PROMPTS * GROUP, gradient_accumulation_steps=1,
        max_completion_length=MAX_NEW, temperature=1.0, top_p=1.0, top_k=0, learning_rate=LR,
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, max_steps=STEPS,
        logging_steps=10**6, save_strategy="no", seed=SEED, dataloader_num_workers=0, disable_tqdm=True,
        scale_rewards="group", epsilon=0.2)
    timer = Timer()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16 if bf16 else torch.float32,
                                                 attn_implementation=cfg.model.attn_implementation)
    trainer = GRPOTrainer(model=model, reward_funcs=[math_reward], args=args, train_dataset=dataset,
                          processing_class=load_tokenizer(path), callbacks=[timer])
    trainer.train()
    return timer.times, []


SIDES = {"ours": run_ours, "trl": run_trl}


def _sync() -> None:
    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()


def child(side: str) -> None:
    """Run one side in this (fresh) process; its last line says its step times (and ours its seconds per phase)
    and peak memory."""
    import logging

    torch.set_num_threads(THREADS)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    times, phases = SIDES[side]()
    if DEVICE.startswith("cuda"):
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"side": side, "step_s": times, "phases": phases, "peak_mb": peak}))


def spawn(side: str, env: dict | None = None, timeout: float = 3600) -> dict:
    """One side in a fresh process, with ``env`` over this one's (``BENCH_*`` set there apply to that side)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    out = subprocess.run([sys.executable, "-m", "bench.trl_grpo_bench", side], capture_output=True, text=True,
                         env=env, timeout=timeout)
    if out.returncode:
        raise RuntimeError(f"{side} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def summarize(res: dict[str, list[dict]]) -> dict:
    """Medians of the steps after each run's first, peak memory, the ratio ours/TRL and its per-repetition spread."""
    med = {s: statistics.median(t for r in rs for t in r["step_s"][1:]) for s, rs in res.items()}
    peak = {s: max(r["peak_mb"] for r in rs) for s, rs in res.items()}
    paired = sorted(statistics.median(o["step_s"][1:]) / statistics.median(t["step_s"][1:])
                    for o, t in zip(res["ours"], res["trl"]))
    return {"ours_step_s": med["ours"], "trl_step_s": med["trl"], "ratio": med["ours"] / med["trl"],
            "ours_peak_mb": peak["ours"], "trl_peak_mb": peak["trl"], "paired_ratios": paired}


def main() -> dict:
    """``REPS`` repetitions of both sides, alternating which goes first; medians, the ratio and peak memory."""
    where = torch.cuda.get_device_name() if DEVICE.startswith("cuda") else f"CPU, {THREADS} thread(s)"
    print(f"GRPO step on {where}: model {MODEL}, {PROMPTS} prompts ({PROMPT} template) x {GROUP} completions, "
          f"<= {MAX_NEW} new tokens, beta {BETA}, {STEPS} steps (first excluded), {REPS} reps", flush=True)
    res = {"ours": [], "trl": []}
    for rep in range(REPS):
        for side in (("ours", "trl") if rep % 2 == 0 else ("trl", "ours")):
            r = spawn(side)
            res[side].append(r)
            print(f"  rep {rep} {side:>4}: median step {statistics.median(r['step_s'][1:]):.3f} s, "
                  f"peak memory {r['peak_mb']:.0f} MB", flush=True)
    summary = summarize(res)
    paired = summary["paired_ratios"]
    print(f"per-step wall time: ours {summary['ours_step_s']:.3f} s, TRL {summary['trl_step_s']:.3f} s, ratio ours/TRL "
          f"{summary['ratio']:.2f}; peak memory: ours {summary['ours_peak_mb']:.0f} MB, TRL "
          f"{summary['trl_peak_mb']:.0f} MB", flush=True)
    print(f"per repetition: ratio {paired[0]:.2f}-{paired[-1]:.2f}, median {statistics.median(paired):.2f}", flush=True)
    return summary


if __name__ == "__main__":
    child(sys.argv[1]) if len(sys.argv) > 1 else main()
