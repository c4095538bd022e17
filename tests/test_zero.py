"""core.training.engine: the torch engine under DDP and DeepSpeed ZeRO-2/3 on CPU (gloo, 2 ranks) match the
single-process torch engine; bf16 master weights keep updates a bf16 parameter cannot hold."""
from __future__ import annotations
from core.config import schema

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import slow

WORKER = Path(__file__).with_name("zero_worker.py")
LOAD_WORKER = Path(__file__).with_name("zero3_load_worker.py")


def _run(tmp: Path, stage: int, nproc: int, zero: dict | None = None) -> dict:
    out = tmp / f"stage{stage}_n{nproc}.json"
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    args = [str(WORKER), str(stage), str(out), json.dumps(zero or {})]
    if nproc == 1 and stage == 0:
        cmd = [sys.executable, *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone", *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("ref"), 0, 1)


@pytest.mark.distributed
# make test: ZeRO-3 here (the same worker and reference); plain DDP on 2 ranks in make test is
# tests/test_data_parallel.py::test_groups_spanning_ranks_train_like_one_process[advantage=grpo]
@pytest.mark.parametrize("stage", [slow(0), slow(2), 3])
def test_two_ranks_match_the_single_process_engine(reference, tmp_path, stage):
    got = _run(tmp_path, stage, 2)
    assert len(got["params"]) == len(reference["params"]) == 6 * 16 + 16 + 16 + 1
    # The same global batch split over 2 ranks x accumulation gives the same updates.
    for a, b in zip(got["params"], reference["params"]):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-5)
    assert got["grad_norm"] == pytest.approx(reference["grad_norm"], rel=1e-4)
    assert got["lrs"] == pytest.approx(reference["lrs"])  # the rate each step used, on both engines
    assert len(got["losses"]) == 3 and got["losses"][-1] < got["losses"][0]


@pytest.mark.slow  # make test: the LoRA case below (nproc 1) runs the same head under ZeRO-3 with accumulation
@pytest.mark.distributed
def test_reward_model_zero3_with_accumulation_matches_plain_torch(tmp_path):
    """Regression: the RM head read off the backbone must run inside DeepSpeed's forward under ZeRO-3."""
    from tests.helpers import run_cli

    norms = {}
    for zero in ("none", "stage3"):
        proc = run_cli(tmp_path / zero, "recipe=tiny_rm", f"zero={zero}", "train.max_steps=3",
                       "train.micro_batch_size=8", "train.eval_before=false", "train.eval_every=0",
                       "logger.progress=false", "logger.tensorboard=false")
        assert proc.returncode == 0, proc.stderr[-3000:]
        rows = [json.loads(line) for line in (tmp_path / zero / "run" / "metrics.jsonl").read_text().splitlines()]
        norms[zero] = [r["grad_norm"] for r in rows if "grad_norm" in r]
    assert len(norms["none"]) == 3
    assert norms["stage3"] == pytest.approx(norms["none"], rel=1e-4)


DTYPES = {"grad_accum_dtype": "fp32", "communication_data_type": "fp32"}  # Open-Instruct's; veRL's fp32 reduce


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_config_carries_the_dtype_keys_exactly_when_set(stage):
    from core.training.engine import deepspeed_config

    optim = schema.node(schema.OptimConfig)
    unset = deepspeed_config(schema.node(schema.ZeroConfig, stage=stage), optim, 2, 4, True)
    assert "data_types" not in unset and "communication_data_type" not in unset  # DeepSpeed's own default
    for accum, comm in (("fp32", "fp32"), ("bf16", None), (None, "fp16")):
        zero = schema.node(schema.ZeroConfig, stage=stage, grad_accum_dtype=accum, communication_data_type=comm)
        got = deepspeed_config(zero, optim, 2, 4, True)
        assert got.get("data_types") == (None if accum is None else {"grad_accum_dtype": accum})
        assert got.get("communication_data_type") == comm
        assert ("communication_data_type" in got) == (comm is not None)
        assert {k: v for k, v in got.items() if k not in ("data_types", "communication_data_type")} == unset


@pytest.mark.distributed
def test_a_deepspeed_engine_reads_the_dtype_keys_and_trains_as_before(reference, tmp_path):
    """One rank, ZeRO-2, fp32 model: fp32 accumulation and reduction are what it did anyway, so the updates
    are the single-process engine's, and DeepSpeed's own config object holds the two keys."""
    got = _run(tmp_path, 2, 1, DTYPES)
    assert got["deepspeed"] == {"grad_accum_dtype": "fp32", "communication_data_type": "torch.float32",
                                "zero_grad_accum_dtype": "torch.float32", "offload_optimizer": None}
    assert len(got["params"]) == len(reference["params"]) == 6 * 16 + 16 + 16 + 1
    for a, b in zip(got["params"], reference["params"]):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-5)


def _tiny_engine(dtype, lr):
    import torch

    from core.training.backend import Backend

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1, bias=False).to(dtype)
    with torch.no_grad():
        model.weight.fill_(1.0)
    optim = schema.node(schema.OptimConfig, {"optimizer": {"_target_": "torch.optim.SGD", "_partial_": True, "lr": lr},
                              "max_grad_norm": 0.0, "scheduler": {"name": "constant"}})
    backend = Backend(schema.node(schema.ZeroConfig, stage=0), torch.device("cpu"), dtype)
    return backend.train_engine(model, optim, 100, 1, 1)


def test_bf16_master_weights_accumulate_updates_below_a_bf16_ulp():
    """A bf16 weight of 1.0 cannot move by 1e-4 (its ulp is 2^-7), so pure-bf16 SGD would never change it;
    with fp32 master weights, 100 such steps add up to -0.01 and the bf16 weight follows."""
    import torch

    eng = _tiny_engine(torch.bfloat16, 1e-4)
    x = torch.ones(1, 4, dtype=torch.bfloat16)
    for _ in range(100):
        eng.backward(eng.forward(lambda m, x: m(x).sum(), x))  # d/dw = 1 for every weight
        eng.step()
    assert eng.master is not None and eng.master.master[0].dtype == torch.float32
    assert eng.master.master[0][0, 0].item() == pytest.approx(1.0 - 100 * 1e-4, rel=1e-5)
    assert eng.module.weight.dtype == torch.bfloat16
    assert eng.module.weight[0, 0].item() == torch.tensor(0.99, dtype=torch.bfloat16).item()
    assert eng.module.weight.grad is None  # gradients moved onto the master copies and cleared
    fp32 = _tiny_engine(torch.float32, 1e-4)
    assert fp32.master is None  # float32 models step their own parameters


def test_a_step_before_its_micro_batches_is_refused():
    import torch

    eng = _tiny_engine(torch.float32, 1e-3)
    with pytest.raises(RuntimeError, match="after 0 micro-batches"):
        eng.step()


@pytest.mark.distributed
@pytest.mark.parametrize("offload", [False, slow(True)])
def test_zero3_models_load_partitioned_and_the_sharded_reference_computes_the_same(tmp_path, offload):
    """Under ZeRO-3 every rank loads only its shard (``HfDeepSpeedConfig``: zero.Init inside from_pretrained),
    the reference runs sharded (a DeepSpeed engine without optimiser) and gives the unsharded log-probs, and
    a fresh critic head is initialised once and partitioned, equal to the unsharded initialisation.

    ``zero.offload_reference``: the reference's partitions were allocated in CPU memory by its own zero.Init
    (the offload config's device name ``"cpu"``; without it, the rank's ``torch.device``). Before, the reference
    was built under the policy's config and only its engine said cpu ("engine_offload"), too late to move it."""
    import torch

    from core.models.critic import load_critic
    from core.models.loading import build_tiny_model_dir, load_causal_lm
    from core.models.logprobs import chunked_logprobs
    from tests.zero3_load_worker import MODEL, batch

    model_dir = str(build_tiny_model_dir("qwen2", {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                                                   "num_attention_heads": 4, "num_key_value_heads": 2,
                                                   "max_position_embeddings": 64, "tie_word_embeddings": True}, 0))
    out = tmp_path / "zero3.json"
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
                           str(LOAD_WORKER), model_dir, str(out), str(int(offload))], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(out.read_text())
    if offload:
        assert got["placement"] == {"remote": ["str:cpu"], "engine_offload": "cpu"}
    else:
        assert got["placement"] == {"remote": ["device:cpu"], "engine_offload": "None"}
    assert got["partitioned"] and got["local"] <= got["full"] // 2 + 64  # this rank's half (and padding)
    assert got["synced"]  # ungathered generation would run with synced_gpus
    ids, am = batch()
    want = chunked_logprobs(load_causal_lm(model_dir, MODEL), ids, am, 6, 1.0, 2, packing=False)
    keep = am[:, 6:].bool()
    torch.testing.assert_close(torch.tensor(got["logprobs"])[keep], want[keep], atol=1e-5, rtol=1e-5)
    head = load_critic(model_dir, schema.node(schema.CriticConfig, head_seed=3), MODEL).score.weight
    assert got["head"] == head.detach().flatten().tolist()


def test_the_reference_is_built_under_its_own_zero3_placement(monkeypatch):
    """``Backend.placed(reference=True)``: the ZeRO-3 config ``from_pretrained`` partitions the reference under
    puts its parameters in CPU memory with ``zero.offload_reference`` (or ``zero.offload_param``), and the
    policy's does not; DeepSpeed never moves a partition afterwards (the 2-rank check above)."""
    import torch
    from transformers.integrations.deepspeed import deepspeed_config

    from core.training import backend

    monkeypatch.setattr(backend, "deepspeed_distributed", lambda: None)  # the config only: no process group
    cpu = {"device": "cpu", "pin_memory": True}
    for keys, policy, reference in (({}, None, None), ({"offload_reference": True}, None, cpu),
                                    ({"offload_param": True}, cpu, cpu)):
        zero = schema.node(schema.ZeroConfig, keys, stage=3)
        for is_ref, want in ((False, policy), (True, reference)):
            with backend.Backend(zero, torch.device("cpu"), torch.float32).placed(reference=is_ref):
                assert deepspeed_config()["zero_optimization"].get("offload_param") == want, (keys, is_ref)
        assert deepspeed_config() is None


def _optim(target: str, **keys):
    return schema.node(schema.OptimConfig, {"optimizer": {"_target_": target, "_partial_": True, **keys}})


@pytest.mark.parametrize("target", ["torch.optim.AdamW", "torch.optim.Adam"])
def test_the_offloaded_optimiser_is_cpu_adam_stepping_as_the_configured_torch_one(deepspeed_cpu_adam_built, target):
    """``zero.offload_optimizer`` steps with DeepSpeed's CPU Adam (a client torch optimiser is refused there):
    its settings are ``optim.optimizer``'s, null keys the torch class's defaults (AdamW decays by 0.01, CPU
    Adam by 0), adamw_mode as the class (decoupled decay or L2), and 5 steps move the weights as torch's do
    (rtol 1e-5, atol 1e-7: both are fp32 evaluations of the same formula, a few ulps apart per step)."""
    import torch

    from core.training.optim import build_optimizer, cpu_adam

    group = cpu_adam([torch.nn.Parameter(torch.zeros(2))], _optim(target, lr=1e-3)).param_groups[0]
    assert (group["betas"], group["eps"], group["weight_decay"]) == ((0.9, 0.999), 1e-8,
                                                                     0.01 if target.endswith("AdamW") else 0.0)
    optim = _optim(target, lr=1e-2, betas=[0.8, 0.95], eps=1e-6, weight_decay=0.1)
    g = torch.Generator().manual_seed(0)
    start, grads = torch.randn(64, generator=g), torch.randn(5, 64, generator=g)
    moved = []
    for build in (cpu_adam, build_optimizer):
        p = torch.nn.Parameter(start.clone())
        opt = build([p], optim)
        for grad in grads:
            p.grad = grad.clone()
            opt.step()
        moved.append(p.detach())
    assert cpu_adam([p], optim).adam_w_mode == target.endswith("AdamW")
    assert not torch.equal(moved[1], start)
    torch.testing.assert_close(moved[0], moved[1], rtol=1e-5, atol=1e-7)


@pytest.mark.distributed
@pytest.mark.parametrize("stage", [2, slow(3)])
def test_zero_offload_trains_as_the_in_memory_optimiser(deepspeed_cpu_adam_built, reference, tmp_path, stage):
    """ZeRO-Offload on 2 ranks (``deepspeed.initialize`` raised on it before: a client torch AdamW with
    ``offload_optimizer``) takes the same 3 steps as the single-process torch engine, to the tolerance the
    in-memory ZeRO runs meet (rel 1e-4, abs 1e-5), with DeepSpeed's CPU Adam stepping CPU-held state."""
    got = _run(tmp_path, stage, 2, {"offload_optimizer": True})
    assert got["deepspeed"]["offload_optimizer"] == {"device": "cpu", "optimizer": "DeepSpeedCPUAdam"}
    assert len(got["params"]) == len(reference["params"])
    for a, b in zip(got["params"], reference["params"]):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-5)
    assert got["lrs"] == pytest.approx(reference["lrs"])
    assert len(got["losses"]) == 3 and got["losses"][-1] < got["losses"][0]


@pytest.mark.distributed
@pytest.mark.parametrize("nproc", [1, slow(2)])
def test_a_lora_reward_model_under_zero3_saves_the_merged_model_plain_torch_saves(tmp_path, nproc):
    """LoRA under ZeRO-3: the merge runs on gathered weights (it failed on the empty partitions before) and the
    saved folder holds the merged weights the single-process run saves (rel 1e-4, abs 1e-5, as the engines'
    updates agree), no LoRA tensors."""
    import torch
    from safetensors.torch import load_file

    from tests.helpers import run_cli

    saved = {}
    for zero, n in (("none", 1), ("stage3", nproc)):
        proc = run_cli(tmp_path / zero, "recipe=tiny_rm", f"zero={zero}", "train.max_steps=2", "train.lora.rank=4",
                       "train.micro_batch_size=8", "train.eval_before=false", "train.eval_every=0",
                       "logger.progress=false", "logger.tensorboard=false", nproc=n)
        assert proc.returncode == 0, proc.stderr[-3000:]
        saved[zero] = load_file(tmp_path / zero / "run" / "model" / "model.safetensors")
    assert sorted(saved["stage3"]) == sorted(saved["none"]) and not any("lora" in k for k in saved["none"])
    for name, want in saved["none"].items():
        torch.testing.assert_close(saved["stage3"][name], want, rtol=1e-4, atol=1e-5, msg=name)
