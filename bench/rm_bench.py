"""Reward-model training step: our ``rm`` loop vs TRL's ``RewardTrainer``, same tiny Llama, same pairs.

Both sides start from the same locally built tiny Llama (``conf/model/tiny_llama.yaml``), train on the
same pairs (HH-RLHF harmless-base when ../shared/data is present, else the generated copy task) with
EOS appended and pairs over ``MAX_LEN`` tokens dropped (TRL's own preprocessing), AdamW at a constant
lr, grad-norm clip 1.0, fp32 on CPU, the same batches in file order. Each side runs in a fresh
subprocess, alternating, ``REPS`` times.
Step time is the median wall time of a full optimiser step after ``WARMUP`` steps (setup excluded);
peak memory is the process's peak RSS, and the RSS it added while training.

One intra-op thread per side (OMP_NUM_THREADS=1 unless set): with 2 threads on a shared 2-core machine,
spinning OpenMP threads made single steps 20-50x slower at random.
Run: ``python -m bench rm`` (or ``make bench``). Figures are recorded in docs/performance.md.
"""
from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time

BATCH, STEPS, WARMUP, REPS, MAX_LEN, LR, SEED = 8, 12, 2, 5, 256, 1e-4, 0


def _rss_mb() -> float:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS")) / 1024


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cfg():
    from core import paths
    from core.config.composition import compose

    data = "pairs_hh_rlhf" if (paths.data_dir() / "hh_rlhf").is_dir() else "pairs_copy_digits"
    over = ["recipe=tiny_rm", f"data={data}", "data.append_eos=true", "data.too_long=drop",
            f"train.max_len={MAX_LEN}", f"train.batch_size={BATCH}", f"train.micro_batch_size={BATCH}",
            "train.epochs=1", f"optim.optimizer.lr={LR}", "optim.scheduler.name=constant",
            "optim.scheduler.warmup_ratio=0.0", "optim.max_grad_norm=1.0", "logger.tensorboard=false"]
    return compose(over)


def _pairs(cfg, tokenizer) -> list[dict]:
    from core.data import preferences as PD

    train, _, stats = PD.load_pairs(cfg.data)
    return PD.tokenize_pairs(train, tokenizer, cfg.data, MAX_LEN, stats["train"])[: BATCH * (STEPS + WARMUP)]


class _Sequential:
    """Batches in file order, as TRL's ``train_sampling_strategy="sequential"``: identical batches both sides."""

    pos = 0

    def next(self) -> list[int]:
        self.pos += BATCH
        return list(range(self.pos - BATCH, self.pos))


def run_ours() -> dict:
    import torch

    from core.models.loading import load_tokenizer, model_dir
    from core.reporting.metrics import MetricsWriter
    from core.training.checkpoint import seed_everything
    from core.training.backend import Backend
    from recipes import rm

    cfg = _cfg()
    seed_everything(SEED, deterministic=False)
    path = model_dir(cfg.model)
    tok = load_tokenizer(path)
    tok.padding_side = cfg.train.padding_side
    pairs = _pairs(cfg, tok)
    model = rm.build_model(path, cfg, tok)
    backend = Backend(cfg.zero, torch.device("cpu"), torch.float32)
    plan = rm.RMPlan(grad_accum=1, world_size=1, total_steps=STEPS + WARMUP)
    run = rm.Run(cfg=cfg, plan=plan, run_dir=None, backend=backend, tokenizer=tok,
                 data=rm.Data(train_pairs=pairs, eval_pairs=[], stats={}, sampler=_Sequential()),
                 engine=backend.train_engine(model, cfg.optim, plan.total_steps, 1, BATCH),
                 writer=MetricsWriter(".", enabled=False))
    rss0, times = _rss_mb(), []
    for _ in range(STEPS + WARMUP):
        t0 = time.perf_counter()
        rm.rm_step(run)
        times.append(time.perf_counter() - t0)
    return _result("ours", times, rss0, len(pairs))


def run_trl() -> dict:
    import tempfile

    import datasets
    from transformers import TrainerCallback
    from trl import RewardConfig, RewardTrainer

    from core.models import reward_model as RM
    from core.training.checkpoint import seed_everything
    from core.models.loading import load_tokenizer, model_dir

    cfg = _cfg()
    seed_everything(SEED, deterministic=False)
    path = model_dir(cfg.model)
    tok = load_tokenizer(path)
    tok.padding_side = "right"
    pairs = _pairs(cfg, tok)
    rows = [{"chosen": tok.decode(p["chosen"][:-1]), "rejected": tok.decode(p["rejected"][:-1])} for p in pairs]
    model = RM.load_reward_model(path, cfg.model, "transformers", tok.pad_token_id)
    times, marks = [], {}

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            marks["t"] = time.perf_counter()
            marks.setdefault("rss0", _rss_mb())

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - marks["t"])

    with tempfile.TemporaryDirectory() as out:
        args = RewardConfig(
            output_dir=out, per_device_train_batch_size=BATCH, max_steps=STEPS + WARMUP, learning_rate=LR,
            lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0, weight_decay=0.0, use_cpu=True,
            bf16=False, report_to="none", save_strategy="no", logging_steps=10**6, max_length=MAX_LEN, seed=SEED,
            dataloader_num_workers=0, disable_dropout=True, disable_tqdm=True,
            train_sampling_strategy="sequential")
        trainer = RewardTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows),
                                processing_class=tok, callbacks=[Clock()])
        trainer.train()
    return _result("trl", times, marks["rss0"], len(rows))


def _result(side: str, times: list[float], rss0: float, n: int) -> dict:
    timed = times[WARMUP:]
    return {"side": side, "pairs": n, "steps": len(timed), "step_s": statistics.median(timed),
            "peak_rss_mb": _peak_mb(), "train_rss_mb": max(0.0, _peak_mb() - rss0)}


def main() -> None:
    """Alternate fresh subprocesses (ours, TRL) ``REPS`` times; print per-run rows and the summary."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "TOKENIZERS_PARALLELISM": "false"}
    res = {"ours": [], "trl": []}
    for rep in range(REPS):
        for side in ("ours", "trl"):
            out = subprocess.run([sys.executable, "-m", "bench.rm_bench", side], capture_output=True, text=True,
                                 env=env, check=False)
            if out.returncode != 0:
                raise RuntimeError(f"{side} bench failed:\n{out.stderr[-3000:]}")
            row = json.loads(out.stdout.strip().splitlines()[-1])
            res[side].append(row)
            print(f"rep {rep} {side:4s}: step {row['step_s'] * 1000:7.1f} ms  peak RSS {row['peak_rss_mb']:7.1f} MB"
                  f"  training RSS +{row['train_rss_mb']:6.1f} MB  ({row['pairs']} pairs)", flush=True)
    med = {s: {k: statistics.median(r[k] for r in rows) for k in ("step_s", "peak_rss_mb", "train_rss_mb")}
           for s, rows in res.items()}
    print(f"\nmedian of {REPS}: ours {med['ours']['step_s'] * 1000:.1f} ms/step, TRL {med['trl']['step_s'] * 1000:.1f}"
          f" ms/step, ratio ours/TRL {med['ours']['step_s'] / med['trl']['step_s']:.2f}; peak RSS ours "
          f"{med['ours']['peak_rss_mb']:.0f} MB vs TRL {med['trl']['peak_rss_mb']:.0f} MB; training RSS ours "
          f"+{med['ours']['train_rss_mb']:.0f} MB vs TRL +{med['trl']['train_rss_mb']:.0f} MB")
    print(json.dumps({"batch_pairs": BATCH, "max_len": MAX_LEN, "timed_steps": STEPS, "median": med}))


if __name__ == "__main__":
    if len(sys.argv) > 1:
        import logging

        import transformers

        logging.disable(logging.WARNING)
        transformers.utils.logging.set_verbosity_error()
        print(json.dumps({"ours": run_ours, "trl": run_trl}[sys.argv[1]]()))
    else:
        main()
