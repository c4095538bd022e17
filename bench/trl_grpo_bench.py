"""One GRPO step of ``recipes/rl.py`` vs TRL's ``GRPOTrainer`` on an identical tiny configuration, CPU.

Same locally built tiny Qwen2 (conf/model/tiny_qwen2.yaml), same arithmetic prompts (core.data), same
reward (``get_verifier("math")``), group size, completion length, batch, learning rate, KL beta
(k3 in the loss), token-mean loss (TRL ``loss_type="bnpo"``), one optimiser step per generation
batch, fused AdamW, fp32, no gradient checkpointing, the same glibc allocator setting
(``core/runtime.py``; ``BENCH_MALLOC=default`` leaves glibc's defaults on both sides).

Each side runs in its own fresh process, several repetitions. By default both processes of a
repetition live at once and take turns a step at a time (lockstep: the idle one waits blocked on a
pipe), so what the shared machine does meanwhile lands on both sides of each pair of steps, and the
ratio of each pair is a measurement of its own; ``BENCH_LOCKSTEP=0`` runs one whole side, then the
other (the earlier rounds' mode). The per-step wall time excludes setup and the first (warm-up) step;
peak memory is the child process's peak RSS (``ru_maxrss``). Both sides use the same intra-op thread count
(``BENCH_THREADS``, default 1: the tiny model gains nothing from more on 2 shared cores). Our side
multiplies through its default ``cpu_matmul=onednn`` (``core/gemm.py``), TRL through torch's kernel;
``BENCH_CPU_MATMUL=torch`` runs ours on torch's too, which isolates what the kernel choice is worth.

Where the floor is: one extra, untimed step of each side runs under ``torch.utils.flop_counter``,
which counts the matrix-multiply FLOPs the step really executes (forward, backward, generation;
``mm``/``addmm``/``bmm``, not the CPU attention kernel, a few per cent here). Divided by this
machine's measured fp32 GEMM rate at the model's layer shapes, that is the time the step could take
if nothing but its matmuls cost anything; the ratio of our floor to TRL's measured step is the
lowest ratio reachable without doing less arithmetic.

    python -m bench trl                      # or: make bench
    BENCH_REPS=5 BENCH_STEPS=8 python -m bench trl
    BENCH_PROMPT=simplerl BENCH_MAX_NEW=64 python -m bench trl   # longer prompts / completions
    BENCH_CPU_MATMUL=torch python -m bench trl                   # ours on torch's GEMM kernel too
    BENCH_LOCKSTEP=0 python -m bench trl                         # a whole run of each side in turn

``BENCH_PROMPT=simplerl`` wraps each question in SimpleRL-Zoo's pre-templated Qwen prompt (system turn,
the question, "Please reason step by step, ..."; ../shared/reference/simplerl_zoo.md section 3), about
130 tokens with the character tokenizer instead of about 6; ``BENCH_MAX_NEW`` sets the completion cap.
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

PROMPTS, GROUP, BETA, LR, SEED = 8, 8, 0.04, 1.0e-4, 0
MAX_NEW = int(os.environ.get("BENCH_MAX_NEW", 16))
TEMPLATES = {
    "plain": "{prompt}",
    # SimpleRL-Zoo's "qwen" rows (hkust-nlp/SimpleRL-Zoo-Data), doubled braces literal as in the data
    "simplerl": ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{prompt}\n"
                 "Please reason step by step, and put your final answer within \\boxed{{{{}}}}.<|im_end|>\n"
                 "<|im_start|>assistant\n"),
}
PROMPT = os.environ.get("BENCH_PROMPT", "plain")
STEPS = int(os.environ.get("BENCH_STEPS", 6))
REPS = int(os.environ.get("BENCH_REPS", 3))
THREADS = int(os.environ.get("BENCH_THREADS", 1))
OURS_ENGINE = os.environ.get("BENCH_ENGINE", "torch")
LOCKSTEP = os.environ.get("BENCH_LOCKSTEP", "1") != "0"
OURS_MATMUL = os.environ.get("BENCH_CPU_MATMUL", "onednn")  # our side's cpu_matmul (core/gemm.py); TRL: torch's
# both sides run pinned to the same core (the lowest this process may use unless BENCH_CPU names one):
# on a shared VM the cores differ (one takes the virtio interrupts), and a side that lands on the
# busier core at random turns into run-to-run noise; "none" leaves the scheduler free
CPU = os.environ.get("BENCH_CPU") or (str(min(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else "none")


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from core.paths import CONF_DIR, PROJECT_ROOT

    if not OmegaConf.has_resolver("root"):
        OmegaConf.register_new_resolver("root", lambda: str(PROJECT_ROOT))
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    cfg.data.template = TEMPLATES[PROMPT]  # set here: the template's braces and newlines defeat override syntax
    return cfg


def _shared_cfg():
    """Our config for the shared setting; the TRL side reads model, data and sizes from it."""
    n = PROMPTS * GROUP
    return _compose([
        "recipe_name=bench", "train.warm_start.steps=0", "logger.progress=false", "logger.tensorboard=false",
        f"train.prompts_per_step={PROMPTS}", f"train.group_size={GROUP}", f"train.mini_batch_size={n}",
        f"train.micro_batch_size={n}", f"train.logprob_micro_batch_size={n}", f"train.total_steps={STEPS}",
        f"rollout.max_new_tokens={MAX_NEW}", f"rollout.engine={OURS_ENGINE}", f"kl.coef={BETA}",
        f"cpu_matmul={OURS_MATMUL}",
        "kl.estimator=k3", "kl.placement=loss", "loss.aggregation=token_mean", f"optim.optimizer.lr={LR}",
        f"seed={SEED}"])


class Gate:
    """One side's turns and clock. Sequential (``BENCH_LOCKSTEP=0``): every turn is its own. Lockstep: the
    parent alternates the two live processes a step at a time; a side says when it is ready and how long
    each step took, then waits for its next turn blocked on a read (no CPU used meanwhile). The protocol
    is one JSON line per message on the child's original stdout; anything else printed goes to stderr."""

    def __init__(self, lockstep: bool):
        self.lockstep, self.t0, self.ready = lockstep, 0.0, False
        self.out = sys.stdout
        if lockstep:
            self.out = os.fdopen(os.dup(1), "w", buffering=1)
            os.dup2(2, 1)

    def say(self, msg: dict) -> None:
        self.out.write(json.dumps(msg) + "\n")
        self.out.flush()

    def turn(self) -> None:
        """Wait for this side's turn (lockstep), then start the step's clock."""
        if self.lockstep:
            if not self.ready:
                self.say({"ready": True})
                self.ready = True
            if sys.stdin.readline().strip() != "go":
                raise SystemExit("bench: the parent process is gone")
        self.t0 = time.perf_counter()

    def done(self) -> float:
        """The step's wall time (reported to the parent in lockstep)."""
        dt = time.perf_counter() - self.t0
        if self.lockstep:
            self.say({"step_s": dt})
        return dt


def run_ours(gate: Gate) -> tuple[list[float], float]:
    """Per-step wall times of ``recipes.rl.rl_step`` (setup excluded) and the matmul FLOPs of one
    more (untimed) step."""
    from torch.utils.flop_counter import FlopCounterMode

    from recipes import rl

    run = rl.setup(_shared_cfg(), run_dir=tempfile.mkdtemp(prefix="bench_ours_"))
    times = []
    for _ in range(STEPS):
        gate.turn()
        rl.rl_step(run)
        times.append(gate.done())
    gate.turn()  # the counted step takes its turn too
    with FlopCounterMode(display=False) as counter:
        rl.rl_step(run)
    return times, counter.get_total_flops()


def run_trl(gate: Gate) -> tuple[list[float], float]:
    """Per-step wall times of ``GRPOTrainer.train`` (between consecutive ``on_step_end``: the data loader,
    logging and saving hooks included) and the matmul FLOPs of one more step (the last, counted from
    ``on_step_begin`` and not timed)."""
    from datasets import Dataset
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from core import data as D
    from core.models import load_tokenizer, model_dir
    from verifiers import get_verifier

    cfg = _shared_cfg()
    path = model_dir(cfg.model)
    rows = D.load_split(cfg.data, "train")
    dataset = Dataset.from_list([{"prompt": D.format_prompt(r["prompt"], cfg.data), "answer": r["answer"]}
                                 for r in rows])
    verifier = get_verifier(cfg.verifier.name)

    def math_reward(completions, answer, **kw):
        return verifier(completions, answer=answer)

    class Timer(TrainerCallback):
        def __init__(self):
            self.times, self.counter = [], FlopCounterMode(display=False)

        def on_train_begin(self, *a, **k):
            gate.turn()

        def on_step_begin(self, args, state, control, **k):
            if state.global_step == STEPS:  # the extra step: count, do not time
                self.counter.__enter__()

        def on_step_end(self, args, state, control, **k):
            if state.global_step == STEPS + 1:
                self.counter.__exit__(None, None, None)
            else:
                self.times.append(gate.done())
                gate.turn()

    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench_trl_"), use_cpu=True, bf16=False, fp16=False,
        gradient_checkpointing=False, report_to="none", loss_type="bnpo", beta=BETA, num_generations=GROUP,
        per_device_train_batch_size=PROMPTS * GROUP, gradient_accumulation_steps=1,
        max_completion_length=MAX_NEW, temperature=1.0, top_p=1.0, top_k=0, learning_rate=LR,
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, max_steps=STEPS + 1,
        logging_steps=10**6, save_strategy="no", seed=SEED, dataloader_num_workers=0, disable_tqdm=True,
        scale_rewards="group", epsilon=0.2)
    timer = Timer()
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(path, dtype="float32"),
                          reward_funcs=[math_reward], args=args, train_dataset=dataset,
                          processing_class=load_tokenizer(path), callbacks=[timer])
    trainer.train()
    return timer.times, timer.counter.get_total_flops()


SIDES = {"ours": run_ours, "trl": run_trl}


def child(side: str, lockstep: bool) -> None:
    """Run one side in this (fresh) process; its last line says its step times, FLOPs and peak memory."""
    import logging

    import torch

    gate = Gate(lockstep)
    if CPU != "none":
        os.sched_setaffinity(0, {int(CPU)})
    torch.set_num_threads(THREADS)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    times, flops = SIDES[side](gate)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    gate.say({"side": side, "step_s": times, "flops": flops, "peak_rss_mb": peak_mb})


def gemm_rate(reps: int = 200) -> dict[str, float]:
    """fp32 FLOP/s of this machine's GEMM at the tiny model's MLP shape (one step's worth of rows), per
    backend: torch's ``F.linear`` (MKL) and, where this torch has it, oneDNN (``core.gemm``)."""
    import torch
    import torch.nn.functional as F

    from core import gemm

    torch.set_num_threads(THREADS)
    tiny = _shared_cfg().model.tiny
    a = torch.randn(PROMPTS * GROUP * MAX_NEW, int(tiny.hidden_size))  # [tokens, H]
    w = torch.randn(int(tiny.intermediate_size), int(tiny.hidden_size))  # [I, H]
    kernels = {"torch": F.linear}
    if gemm.onednn_available():
        kernels["onednn"] = gemm.linear  # oneDNN in this process: the module's default
    rates = {}
    with torch.inference_mode():
        for name, f in kernels.items():
            f(a, w)  # oneDNN compiles its kernel for the shape on the first call
            best = float("inf")
            for _ in range(5):  # best of 5 timed blocks: the rate the machine can give, not a noisy mean
                t0 = time.perf_counter()
                for _ in range(reps // 5):
                    f(a, w)
                best = min(best, (time.perf_counter() - t0) / (reps // 5))
            rates[name] = 2 * a.shape[0] * a.shape[1] * w.shape[0] / best
    return rates


def _child_env() -> dict:
    from core.runtime import GLIBC_TUNABLES

    # both sides get the allocator setting recipes/run.py applies (core/runtime.py): the ratio compares
    # the two trainers' code, not glibc's defaults (BENCH_MALLOC=default leaves glibc as it is)
    malloc = {} if os.environ.get("BENCH_MALLOC") == "default" else {"GLIBC_TUNABLES": GLIBC_TUNABLES}
    return {**os.environ, "OMP_NUM_THREADS": str(THREADS), "TOKENIZERS_PARALLELISM": "false",
            "DS_ACCELERATOR": "cpu", **malloc}


def _spawn(side: str) -> dict:
    """One side run to its end in a fresh process (sequential mode)."""
    out = subprocess.run([sys.executable, "-m", "bench.trl_grpo_bench", side], capture_output=True, text=True,
                         env=_child_env(), timeout=1800)
    if out.returncode:
        raise RuntimeError(f"{side} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


class _Live:
    """A side's process in lockstep mode: it sets up, says it is ready, and runs a step per turn."""

    def __init__(self, side: str):
        self.side, self.err = side, tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.trl_grpo_bench", side, "lockstep"], text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, env=_child_env())

    def recv(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=60)
            self.err.seek(0)
            raise RuntimeError(f"{self.side} failed (exit {self.proc.returncode}):\n{self.err.read()[-4000:]}")
        return json.loads(line)

    def step(self) -> dict:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return self.recv()


def _lockstep(rep: int) -> dict[str, dict]:
    """Both sides live at once, one step each in turn (who goes first alternates by step and repetition):
    what the machine does meanwhile falls on both sides of each pair of steps."""
    live = {side: _Live(side) for side in SIDES}
    try:
        for p in live.values():
            assert p.recv() == {"ready": True}  # set up (untimed, both at once), now idle
        for i in range(STEPS + 1):  # the last turn is the counted step; its reply is the side's result
            order = ("ours", "trl") if (i + rep) % 2 == 0 else ("trl", "ours")
            replies = {side: live[side].step() for side in order}
        for p in live.values():
            p.proc.wait(timeout=60)
        return replies
    finally:
        for p in live.values():
            if p.proc.poll() is None:
                p.proc.kill()


def main() -> dict:
    """``REPS`` repetitions of both sides, alternating (lockstep: a step each in turn; sequential: a whole
    run each in turn); print medians, the ratio, its spread and peak memory."""
    mode = "lockstep (both live, a step each in turn)" if LOCKSTEP else "sequential (a whole run each in turn)"
    print(f"GRPO step, CPU, {THREADS} thread(s): {PROMPTS} prompts ({PROMPT} template) x {GROUP} completions, "
          f"<= {MAX_NEW} new tokens, beta {BETA}, {STEPS} steps (first excluded), {REPS} reps, {mode}; ours: "
          f"rollout.engine={OURS_ENGINE}, cpu_matmul={OURS_MATMUL}; both pinned to CPU {CPU}", flush=True)
    res = {"ours": [], "trl": []}
    for rep in range(REPS):
        order = ("ours", "trl") if rep % 2 == 0 else ("trl", "ours")
        out = _lockstep(rep) if LOCKSTEP else {side: _spawn(side) for side in order}
        for side in order:
            r = out[side]
            res[side].append(r)
            print(f"  rep {rep} {side:>4}: median step {statistics.median(r['step_s'][1:]):.3f} s, "
                  f"peak RSS {r['peak_rss_mb']:.0f} MB", flush=True)
    med = {s: statistics.median(t for r in rs for t in r["step_s"][1:]) for s, rs in res.items()}
    peak = {s: max(r["peak_rss_mb"] for r in rs) for s, rs in res.items()}
    flops = {s: statistics.median(r["flops"] for r in rs) for s, rs in res.items()}
    rates = gemm_rate()
    # TRL multiplies through torch; ours through its cpu_matmul backend. The floor of either: its matmuls
    # at the fastest rate this machine offers (the lowest ratio no kernel choice can beat)
    rate = {"ours": rates.get(OURS_MATMUL, rates["torch"]), "trl": rates["torch"], "best": max(rates.values())}
    floor = {s: f / rate["best"] for s, f in flops.items()}
    summary = {"ours_step_s": med["ours"], "trl_step_s": med["trl"], "ratio": med["ours"] / med["trl"],
               "ours_peak_rss_mb": peak["ours"], "trl_peak_rss_mb": peak["trl"],
               **{f"gemm_gflops_{k}": v / 1e9 for k, v in rates.items()},
               "ours_matmul_gflop": flops["ours"] / 1e9, "trl_matmul_gflop": flops["trl"] / 1e9,
               "ratio_floor": floor["ours"] / med["trl"]}
    # each repetition's two sides ran close in time: their ratios show how far the machine drifted meanwhile
    paired = sorted(statistics.median(o["step_s"][1:]) / statistics.median(t["step_s"][1:])
                    for o, t in zip(res["ours"], res["trl"]))
    summary["paired_ratios"] = paired
    if LOCKSTEP:  # step k of ours and step k of TRL ran one right after the other
        steps = sorted(a / b for o, t in zip(res["ours"], res["trl"]) for a, b in zip(o["step_s"][1:], t["step_s"][1:]))
        q = statistics.quantiles(steps, n=4) if len(steps) > 1 else steps * 3
        summary.update(step_ratios=steps, step_ratio_median=statistics.median(steps))
    print(f"per-step wall time: ours {med['ours']:.3f} s, TRL {med['trl']:.3f} s, ratio ours/TRL "
          f"{summary['ratio']:.2f}; peak RSS: ours {peak['ours']:.0f} MB, TRL {peak['trl']:.0f} MB", flush=True)
    print(f"per repetition: ratio {paired[0]:.2f}-{paired[-1]:.2f}, median {statistics.median(paired):.2f}", flush=True)
    if LOCKSTEP:
        print(f"per pair of steps ({len(steps)}): ratio median {summary['step_ratio_median']:.2f}, middle half "
              f"{q[0]:.2f}-{q[2]:.2f}, all {steps[0]:.2f}-{steps[-1]:.2f}", flush=True)
    print("fp32 GEMM rate at the MLP shape: " + ", ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in rates.items())
          + f"; ours multiplies through {OURS_MATMUL}, TRL through torch", flush=True)
    took = {s: flops[s] / rate[s] for s in flops}  # each side's matmuls at its own kernel's rate
    print(f"matmul work per step: ours {flops['ours'] / 1e9:.2f} GFLOP, TRL {flops['trl'] / 1e9:.2f} GFLOP; at "
          f"their own kernels' rates that alone takes ours {took['ours'] * 1e3:.1f} ms "
          f"({took['ours'] / med['ours']:.0%} of our step), TRL {took['trl'] * 1e3:.1f} ms "
          f"({took['trl'] / med['trl']:.0%} of its step); lowest ratio without less arithmetic "
          f"(ours at the fastest rate): {summary['ratio_floor']:.2f}", flush=True)
    return summary


if __name__ == "__main__":
    child(sys.argv[1], sys.argv[2:] == ["lockstep"]) if len(sys.argv) > 1 else main()
