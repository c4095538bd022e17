"""``make gpu-smoke`` (bench/gpu_smoke.py): on a CUDA machine it runs with a real-shaped model (the ``gpu``
test); here its code runs on the CPU with a tiny model, so the script a GPU session relies on works."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from core.paths import PROJECT_ROOT


def _smoke(**env) -> str:
    out = subprocess.run([sys.executable, "-m", "bench.gpu_smoke"], cwd=PROJECT_ROOT, capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=1800)
    assert out.returncode == 0, out.stderr[-4000:]
    return out.stdout


def _check(stdout: str) -> None:
    check = re.search(r"packed vs padded \((\S+), (\d+) tokens\): log-prob \|diff\| max ([\d.]+)", stdout)
    assert check and int(check[2]) > 20, stdout[-2000:]
    runs = re.findall(r"zero=(\w+): generation (\d+) tok/s, update (\d+) tok/s, update MFU (\S+)", stdout)
    assert [r[0] for r in runs] == ["none", "stage2", "stage3"], stdout[-2000:]
    assert all(int(r[1]) > 0 and int(r[2]) > 0 for r in runs)


@pytest.mark.slow
def test_the_smoke_script_runs_on_the_cpu_with_a_tiny_model():
    _check(_smoke(GPU_SMOKE_DEVICE="cpu", GPU_SMOKE_SHAPES="tiny", GPU_SMOKE_STEPS="2", GPU_SMOKE_MAX_NEW="16"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_smoke():
    out = _smoke()
    _check(out)
    assert "packed vs padded (torch.bfloat16" in out
    assert all(float(m) > 0 for m in re.findall(r"update MFU ([\d.]+)", out))


def _tiny_qwen2(**kw):
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, **kw)
    torch.manual_seed(0)
    return config, AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)


def _counted_flops_per_token(model, batch: int, seq: int) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    ids = torch.randint(0, model.config.vocab_size, (batch, seq))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    return counter.get_total_flops() / (batch * seq)


# FlopCounterMode counts matmuls only; the formula's 6N also counts the norms' weights and the q/k/v biases
# (0.2% of N here) and leaves out softmax, norms and activations (not counted by either).
TOLERANCE = 0.01


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("recompute", [False, True])
def test_train_flops_per_token_matches_torch_flop_counter(tied, recompute):
    """With recompute the device does less than a whole extra forward of the layers: PyTorch's checkpoint stops
    before each layer's last matmul, the MLP down projection (train_flops_per_token's docstring)."""
    from omegaconf import OmegaConf

    from bench.gpu_smoke import train_flops_per_token
    from core.models.loading import with_checkpointing

    config, model = _tiny_qwen2(tie_word_embeddings=tied)
    if recompute:
        with_checkpointing(model, OmegaConf.create({"gradient_checkpointing": True}))  # as the loops enable it
    model.train()
    counted = _counted_flops_per_token(model, batch=2, seq=96)
    skipped = 2 * sum(layer.mlp.down_proj.weight.numel() for layer in model.model.layers) if recompute else 0
    assert train_flops_per_token(config, 96, recompute) - skipped == pytest.approx(counted, rel=TOLERANCE)


def test_the_input_embedding_is_not_counted_and_the_lm_head_is():
    from bench.gpu_smoke import matmul_params

    for tied in (False, True):
        config, model = _tiny_qwen2(tie_word_embeddings=tied)
        total, emb = sum(p.numel() for p in model.parameters()), config.vocab_size * config.hidden_size
        assert matmul_params(config) == total - emb * (not tied)  # tied: the one matrix counts, as the LM head
        assert matmul_params(config, head=False) == total - emb * (2 - tied)
