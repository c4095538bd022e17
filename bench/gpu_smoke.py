"""``make gpu-smoke``: the GPU path end to end on one CUDA device, with a real-shaped model.

1. Packed vs padded in bf16: a Qwen2.5-0.5B-shaped model (``conf/model/qwen2_5_0_5b_random.yaml``: random
   weights, bf16, sdpa) scores a sampled batch (left padding, early EOS) both ways; the log-probs and the
   parameter gradients of a weighted sum must agree to bf16 rounding.
2. The tiny recipe (``tiny_math_grpo``, no warm start) with that model under ``zero=none``, ``stage2`` and
   ``stage3`` at world size 1, each in its own process (``python -m recipes.run``), a few RL steps each.
   From the steps after the first (warm-up): tokens per second of generation and of the policy update,
   each step's peak GPU memory, and the update's MFU: training FLOPs (:func:`train_flops_per_token`) x tokens
   / time / the device's dense bf16 peak (:data:`PEAK_TFLOPS`, or ``GPU_PEAK_TFLOPS``), as model FLOPs (MFU)
   and as hardware FLOPs, which add the forward recomputed under gradient checkpointing (HFU).

    make gpu-smoke                        # or: python -m bench.gpu_smoke
    GPU_SMOKE_STEPS=6 GPU_SMOKE_MAX_NEW=512 python -m bench.gpu_smoke

``GPU_SMOKE_DEVICE=cpu GPU_SMOKE_SHAPES=tiny`` runs the same script on the CPU with a tiny model, which is
how its code is tested where there is no GPU (tests/test_gpu_smoke.py); those figures mean nothing.
Figures of runs on GPUs: docs/performance.md.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from core.config.composition import compose

TOLERANCE = {"torch.bfloat16": {"logprob_max_abs": 0.25, "logprob_mean_abs": 0.02, "grad_rel": 0.05},
             "torch.float32": {"logprob_max_abs": 1e-4, "logprob_mean_abs": 1e-5, "grad_rel": 1e-4}}
# Dense bf16 tensor-core peaks (TFLOP/s, no sparsity) from the vendors' datasheets.
PEAK_TFLOPS = {"H200": 989.4, "H100 SXM": 989.4, "H100 80GB HBM3": 989.4, "H100 PCIe": 756.0, "H100": 989.4,
               "A100": 312.0, "L40S": 362.1, "RTX 4090": 165.2}
DEVICE = os.environ.get("GPU_SMOKE_DEVICE", "cuda")
SHAPES = os.environ.get("GPU_SMOKE_SHAPES", "qwen2_5_0_5b")
STEPS = int(os.environ.get("GPU_SMOKE_STEPS", 4))
MAX_NEW = int(os.environ.get("GPU_SMOKE_MAX_NEW", 256))
ZEROS = os.environ.get("GPU_SMOKE_ZERO", "none,stage2,stage3").split(",")
MODEL = {"qwen2_5_0_5b": ["model=qwen2_5_0_5b_random"],
         "tiny": ["model=qwen2_5_0_5b_random", "model.tiny.vocab_size=128", "model.tiny.hidden_size=32",
                  "model.tiny.intermediate_size=64", "model.tiny.num_hidden_layers=2",
                  "model.tiny.num_attention_heads=4", "model.tiny.max_position_embeddings=1024",
                  "model.dtype=float32"]}[SHAPES]
PROMPTS, GROUP = 16, 8  # an RL step's prompts and completions per prompt: the update's rows are PROMPTS x GROUP
# The longest arithmetic prompt ("99+99=") is 6 tokens of the char tokenizer: the limit drops no row, and the probe
# (recipes.probe) needs it to size the rows of the same config.
MAX_PROMPT_TOKENS = 6


def recipe_keys(steps: int, max_new: int) -> list[str]:
    """The tiny recipe's keys of the smoke (and of make gpu-check, bench/gpu_check.py): ``steps`` RL steps of
    PROMPTS x GROUP completions up to ``max_new`` tokens, micro-batch 16, log-prob micro-batch 32, on DEVICE."""
    return ["logger.progress=false", "logger.tensorboard=false", "train.warm_start.steps=0",
            f"train.total_steps={steps}", f"train.prompts_per_step={PROMPTS}", f"train.group_size={GROUP}",
            "train.mini_batch_size=128", "train.micro_batch_size=16", "train.logprob_micro_batch_size=32",
            "train.eval_prompts=16", f"rollout.max_new_tokens={max_new}",
            f"data.max_prompt_tokens={MAX_PROMPT_TOKENS}", f"device={DEVICE}"]


def recipe_overrides(zero: str, steps: int = STEPS, max_new: int = MAX_NEW) -> list[str]:
    """The overrides of one smoke run (``python -m recipes.run``), its run dir aside."""
    return [*MODEL, *recipe_keys(steps, max_new), f"zero={zero}"]


def peak_tflops(name: str) -> float | None:
    if os.environ.get("GPU_PEAK_TFLOPS"):
        return float(os.environ["GPU_PEAK_TFLOPS"])
    return next((v for k, v in PEAK_TFLOPS.items() if k in name), None)


def train_flops_per_token(config, seq_len: float, recompute: bool = False) -> float:
    """FLOPs of one training token (forward and backward) of a decoder. Model FLOPs, PaLM's count (Chowdhery et
    al. 2022, "PaLM", appendix B; Megatron-LM's, Narayanan et al. 2021, section 5.1, is the same up to the vocabulary
    term): ``6 N + 12 L d T``. N: the parameters that multiply (:func:`matmul_params`: all but the input
    embedding, whose lookup does no arithmetic; the LM head counts, tied or not); L layers; d the attention width
    (query heads x head dim); T the sequence length, each token attending to T keys (the causal mask's skipped half
    counted, as PaLM does). A forward is a third of that.

    ``recompute`` (gradient checkpointing) gives hardware FLOPs (Korthikanti et al. 2022, "Reducing Activation
    Recomputation", section 6): backward runs each decoder layer's forward again, ``2 N_layers + 4 L d T`` more
    (the LM head is outside the checkpointed layers). PyTorch's non-reentrant checkpoint stops a layer's recompute
    once the tensors backward needs are back, so it skips the last matmul (the MLP's down projection): the
    device does that much less (tests/test_gpu_smoke.py measures it)."""
    layers = config.num_hidden_layers
    heads = config.num_attention_heads
    width = heads * (getattr(config, "head_dim", None) or config.hidden_size // heads)
    flops = 6 * matmul_params(config) + 12 * layers * width * seq_len
    if recompute:
        flops += 2 * matmul_params(config, head=False) + 4 * layers * width * seq_len
    return flops


def matmul_params(config, head: bool = True) -> int:
    """Parameters of ``config``'s model less the input embedding (a lookup), with the LM head (the tied matrix,
    when tied) or, ``head=False``, without it."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    emb, lm_head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    body = sum(p.numel() for p in model.parameters() if p is not emb and p is not lm_head)
    return body + (lm_head.numel() if head else 0)


def packed_vs_padded() -> dict:
    """Max and mean |log-prob difference| over real response tokens, and the relative gradient difference
    ``|g_packed - g_padded| / |g_padded|`` over all parameters (and of the worst one), packed vs padded, in
    the model's dtype."""
    from core.models.loading import load_causal_lm, load_tokenizer, model_dir
    from core.models.logprobs import response_logprobs
    from core.config import schema
    from core.rollout import Sampling, build_rollout

    cfg = compose(MODEL)
    path = model_dir(cfg.model)
    model, tok = load_causal_lm(path, cfg.model).to(DEVICE), load_tokenizer(path)
    eng = build_rollout("hf", model, tok, schema.node(schema.RolloutConfig))
    eng.eos_ids = sorted(set(tok("abcdefghij", add_special_tokens=False)["input_ids"]))  # some stop early
    torch.manual_seed(0)
    prompts = [tok(f"{a}+{b}=", add_special_tokens=False)["input_ids"] for a, b in ((3, 4), (12, 30), (99, 1), (7, 88))]
    roll = eng.generate([p for p in prompts for _ in range(4)], Sampling(max_new_tokens=64, temperature=1.0))
    keep = roll.response_mask.bool()
    w = torch.randn(keep.shape, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    out = {}
    for packing in (False, True):
        model.zero_grad(set_to_none=True)
        lp, _ = response_logprobs(model, roll.input_ids, roll.attention_mask, roll.prompt_length, 1.0, packing=packing)
        (lp * w * keep).sum().backward()
        out[packing] = (lp.detach().float(), {n: p.grad.float() for n, p in model.named_parameters()})
    diff = (out[True][0] - out[False][0])[keep].abs()
    grads = {n: (out[True][1][n] - g, g) for n, g in out[False][1].items()}
    total = (sum(d.norm() ** 2 for d, _ in grads.values()) / sum(g.norm() ** 2 for _, g in grads.values())).sqrt()
    worst = max((d.norm() / g.norm().clamp(min=1e-12)).item() for d, g in grads.values())
    return {"tokens": int(keep.sum()), "logprob_max_abs": diff.max().item(), "logprob_mean_abs": diff.mean().item(),
            "grad_rel": total.item(), "grad_worst_rel": worst, "dtype": str(next(model.parameters()).dtype)}


def recipe_command(overrides: list[str], run_dir: Path) -> list[str]:
    """``python -m recipes.run`` with ``overrides`` in ``run_dir`` (results rows beside it, not in results/)."""
    return [sys.executable, "-m", "recipes.run", *overrides, f"hydra.run.dir={run_dir}",
            f"paths.results_dir={run_dir.parent / 'results'}"]


def recipe_run(overrides: list[str], run_dir: Path, timeout: float | None = None) -> dict:
    """One run of ``overrides`` in a fresh process (``timeout`` seconds at most); its :func:`step_figures`."""
    proc = subprocess.run(recipe_command(overrides, run_dir), capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HYDRA_FULL_ERROR": "1"})
    if proc.returncode:
        raise RuntimeError(f"python -m recipes.run exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return step_figures(run_dir)


# the planner's phases (core/planning/step_time.py) -> the RL loop's metrics (recipes/rl.py's timer phases)
PHASE_METRICS = {"generate": "time/generate", "score": "time/verify", "logprobs": "time/logprobs",
                 "update": "time/update"}


def step_figures(run_dir: Path) -> dict:
    """Medians over the run's steps after the first (the warm-up; all of them when there is one): seconds per phase,
    tokens, tokens per second of generation and update, the step's peak memory (``memory/peak_mb``: CUDA's
    ``max_memory_allocated``, a CPU's high-water RSS)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "time/update" in r]
    if not steps:
        raise RuntimeError(f"{run_dir / 'metrics.jsonl'}: no step was logged")
    steps = steps[1:] or steps

    def med(key: str) -> float:
        return statistics.median(r[key] for r in steps)

    phases = {p: med(k) for p, k in PHASE_METRICS.items()}
    tokens = {"generated": med("tokens/generated"), "total": med("tokens/total")}
    return {"steps": len(steps), "first_step": steps[0]["step"], "phase_seconds": phases,
            "step_seconds": sum(phases.values()), "tokens": tokens, "peak_mb": med("memory/peak_mb"),
            "generate_tok_s": tokens["generated"] / phases["generate"],
            "update_tok_s": tokens["total"] / phases["update"]}


def update_flops_utilisation(config, figures: dict, peak: float | None, recompute: bool) -> tuple[float, float]:
    """``(MFU, HFU)`` of a run's update (:func:`step_figures`), against ``peak`` TFLOP/s (NaN without one)."""
    if not peak:
        return float("nan"), float("nan")
    tokens, seconds = figures["tokens"]["total"], figures["phase_seconds"]["update"]
    seq = tokens / (PROMPTS * GROUP)  # mean sequence length (prompt and completion)
    mfu, hfu = (train_flops_per_token(config, seq, rc) * tokens / seconds / (peak * 1e12) for rc in (False, recompute))
    return mfu, hfu


def device_name() -> str:
    return torch.cuda.get_device_name() if DEVICE.startswith("cuda") else "cpu"


def require_device(what: str) -> None:
    if DEVICE.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"{what} needs a CUDA device (GPU_SMOKE_DEVICE=cpu GPU_SMOKE_SHAPES=tiny runs it on the CPU)")


def packed_verdict(check: dict) -> str | None:
    """Why the packed and padded forwards disagree beyond ``check``'s dtype's rounding, or None."""
    # bf16 keeps 8 significant bits (relative rounding 2^-9); two kernels' summation orders drift by a few such
    # steps per layer. Bounds, not calibrated on a GPU when written: docs/performance.md says what ran where.
    tol = TOLERANCE[check["dtype"]]
    if any(check[k] > v for k, v in tol.items()):
        return f"packed and padded forwards disagree beyond {check['dtype']} rounding {tol}: {check}"
    return None


def main(argv: list[str]) -> None:
    """The smoke (no arguments), or ``packed``: the packed-vs-padded check alone, as one JSON line (gpu_check)."""
    from core.models.loading import model_dir
    from transformers import AutoConfig

    require_device("make gpu-smoke")
    if argv == ["packed"]:
        check = packed_vs_padded()
        print(json.dumps({**check, "tolerance": TOLERANCE[check["dtype"]], "failure": packed_verdict(check)}))
        return
    name = device_name()
    cfg = compose(MODEL)
    config = AutoConfig.from_pretrained(model_dir(cfg.model))
    n_params, recompute = matmul_params(config), bool(cfg.model.gradient_checkpointing)
    peak = peak_tflops(name)
    print(f"device {name}, torch {torch.__version__}, model {SHAPES} ({n_params / 1e6:.0f}M parameters in "
          f"matmuls, {cfg.model.dtype}, {cfg.model.attn_implementation}, gradient checkpointing {recompute}), "
          f"{STEPS} RL steps of {PROMPTS} x {GROUP}, max_new_tokens {MAX_NEW}",
          flush=True)
    check = packed_vs_padded()
    print(f"packed vs padded ({check['dtype']}, {check['tokens']} tokens): log-prob |diff| max "
          f"{check['logprob_max_abs']:.4f} mean {check['logprob_mean_abs']:.5f}; "
          f"gradients relative diff {check['grad_rel']:.4f} "
          f"(worst parameter {check['grad_worst_rel']:.4f})", flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu_smoke_") as tmp:
        for zero in ZEROS:
            r = recipe_run(recipe_overrides(zero), Path(tmp) / zero)
            mfu, hfu = update_flops_utilisation(config, r, peak, recompute)
            print(f"zero={zero}: generation {r['generate_tok_s']:.0f} tok/s, update {r['update_tok_s']:.0f} tok/s, "
                  f"update MFU {mfu:.3f} HFU {hfu:.3f} (peak {peak} TFLOP/s), peak memory {r['peak_mb']:.0f} MB "
                  f"(median of {r['steps']} steps)", flush=True)
    failure = packed_verdict(check)
    if failure:
        raise SystemExit(failure)


if __name__ == "__main__":
    main(sys.argv[1:])
