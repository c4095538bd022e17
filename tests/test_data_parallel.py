"""The RL loop data-parallel under torchrun (2 CPU ranks over gloo): the same global batch split over
ranks trains the same model as one process, with the plain torch engine (DDP) and DeepSpeed ZeRO-2/3."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from core.paths import PROJECT_ROOT
from tests.helpers import CLI_ENV, results, run_cli, slow, torchrun

# Greedy rollouts make the completions independent of each rank's sampling RNG; a reward of the gold answer
# alone makes rewards differ across the batch on any machine (so the gradient is not zero by accident of
# one CPU's rounding); REINFORCE++ with global whitening and the step-level token mean make every
# cross-rank reduction matter to the gradient.
SAME = ["scale=tiny", "logger.progress=false", "logger.tensorboard=false", "train.eval_prompts=16",
        "train.warm_start.steps=0", "verifier.name=tests.stub_rewards:gold_parity", "advantage=reinforce_pp",
        "kl=k1", "rollout.greedy=true", "loss.aggregation=token_mean_global"]


def _run(tmp: Path, nproc: int, *overrides: str, timeout: int = 300):
    proc = run_cli(tmp, *overrides, nproc=nproc, timeout=timeout)  # a hung collective: TimeoutExpired, ranks killed
    assert proc.returncode == 0, proc.stderr[-4000:]


def _rows(tmp: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp / "run" / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("one")
    _run(tmp, 1, *SAME)
    return _rows(tmp)


# stage 3 partitions every parameter (DeepSpeed keeps those under 1e5 elements whole by default: all of a tiny model's)
STAGE3 = "zero=stage3 +zero.options.stage3_param_persistence_threshold=0"


@pytest.mark.distributed
# make test runs ZeRO-3 here; plain DDP ranks training like one process run in make test as
# test_groups_spanning_ranks_train_like_one_process[advantage=grpo] (zero=none, 2 ranks, grad_norm/loss/kl at rel 1e-4)
@pytest.mark.parametrize("zero", [slow("zero=none"), slow("zero=stage2"), STAGE3,
                                  slow(f"{STAGE3} rollout.gather_for_generation=false")])
def test_two_ranks_train_like_one_process(one_process, tmp_path, zero):
    _run(tmp_path, 2, *SAME, *zero.split())
    rows = _rows(tmp_path)
    steps = [r for r in rows if "grad_norm" in r]
    want = [r for r in one_process if "grad_norm" in r]
    assert [r["step"] for r in steps] == [1, 2]  # rank 0 alone logs
    assert 0 < want[0]["reward/mean"] < 1 and want[0]["grad_norm"] > 0  # rewards differ: a real gradient
    for got, ref in zip(steps, want):
        assert got["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-4)
        assert got["reward/mean"] == ref["reward/mean"]  # the whole step's rows, gathered for logging
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    assert evals == [r["eval/accuracy"] for r in one_process if "eval/accuracy" in r]
    assert (tmp_path / "run" / "model" / "model.safetensors").exists()
    assert len(results(tmp_path)) == 1


# 3 prompts x 2 completions on 2 ranks: 3 rows each, so the second prompt's group spans the ranks (TRL
# process_slice; the old whole-groups split refused it). The reward of a row is its place in the step.
SPLIT = [*SAME[:5], "verifier.name=tests.stub_rewards:step_position", "kl=k1", "rollout.greedy=true",
         "loss.aggregation=token_mean_global", "train.prompts_per_step=3", "train.group_size=2",
         "train.mini_batch_size=6", "train.micro_batch_size=3"]


@pytest.mark.distributed
@pytest.mark.parametrize("advantage", ["advantage=grpo", slow("advantage=rloo")])
def test_groups_spanning_ranks_train_like_one_process(tmp_path, advantage):
    _run(tmp_path / "one", 1, *SPLIT, advantage)
    _run(tmp_path / "two", 2, *SPLIT, advantage)
    want, got = ([r for r in _rows(tmp_path / d) if "grad_norm" in r] for d in ("one", "two"))
    assert [r["step"] for r in got] == [r["step"] for r in want] == [1, 2]
    for g, w in zip(got, want):
        assert w["reward/mean"] == 1.0 and w["grad_norm"] > 0  # rewards 0, 1, 2, 0, 1, 2: a real gradient
        assert g["reward/mean"] == w["reward/mean"]
        for key in ("grad_norm", "loss", "kl_reward"):
            assert g[key] == pytest.approx(w[key], rel=1e-4, abs=1e-7), key


@pytest.mark.slow
@pytest.mark.distributed
def test_two_rank_run_killed_after_a_checkpoint_resumes(tmp_path):
    import os
    import signal
    import subprocess
    import time

    from core.paths import PROJECT_ROOT
    from tests.helpers import CLI_ENV, cli_command

    common = ["scale=tiny", "logger.progress=false", "logger.tensorboard=false", "train.eval_prompts=8",
              "train.warm_start.steps=0", "train.checkpoint_every=1", "zero=stage2", "train.total_steps=3"]
    ckpt = tmp_path / "run" / "checkpoint-1"  # the first
    proc = subprocess.Popen(cli_command(tmp_path, *common, nproc=2), cwd=PROJECT_ROOT, env=CLI_ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    while proc.poll() is None and not (ckpt / "rng.rank1.pt").exists():
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)  # torchrun and both ranks, right after the first checkpoint
    proc.wait()
    step = json.loads((ckpt / "trainer.json").read_text())["step"]
    assert step < 3 and (ckpt / "rng.pt").exists()  # each rank's RNG stream
    _run(tmp_path, 2, *common, "resume=true")
    from core.training.checkpoint import checkpoint_dirs

    newest = checkpoint_dirs(tmp_path / "run")  # train.keep_checkpoints=2: the last two
    assert [p.name for p in newest] == ["checkpoint-3", "checkpoint-2"]
    assert json.loads((newest[0] / "trainer.json").read_text())["step"] == 3
    assert [r["step"] for r in _rows(tmp_path) if "loss" in r] == [1, 2, 3]
    assert len(results(tmp_path)) == 1


# Each rank composes the run config as recipes.run does; rank 1 a second later, so their clocks name other seconds.
RESOLVE_RUN_DIR = """
import os, time
from hydra.core.hydra_config import HydraConfig
from core.config.composition import compose
time.sleep(1.1 * int(os.environ["RANK"]))
compose(["recipe=tiny_rm"], with_hydra=True)
print("run dir", HydraConfig.get().run.dir, flush=True)
"""


@pytest.mark.distributed
def test_the_ranks_of_a_plain_torchrun_resolve_one_run_dir():
    """Hydra's run dir (launch time and id) is rank 0's on every rank: a plain torchrun gives the ranks no shared id
    and they start apart."""
    proc = subprocess.run([*torchrun(2), "--no-python", sys.executable, "-c", RESOLVE_RUN_DIR], cwd=PROJECT_ROOT,
                          env=CLI_ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    dirs = [line for line in proc.stdout.splitlines() if line.startswith("run dir")]
    assert len(dirs) == 2 and dirs[0] == dirs[1], dirs


# Rank 1 builds a tiny model's cache entry first (rank 0 waits), then rank 0 loads what it built.
BUILD_ON_RANK_1 = """
import os, sys, torch.distributed as dist
os.environ["RLR_CACHE_DIR"] = sys.argv[1]
dist.init_process_group("gloo")
from core.models.loading import build_tiny_model_dir
from transformers import AutoModelForCausalLM
tiny = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 1, "max_position_embeddings": 64}
if dist.get_rank() == 1:
    build_tiny_model_dir("qwen2", tiny, 0)
dist.barrier()
AutoModelForCausalLM.from_pretrained(build_tiny_model_dir("qwen2", tiny, 0))
print("loaded", flush=True)
"""


@pytest.mark.distributed
def test_a_tiny_model_built_by_rank_1_holds_its_weights(tmp_path):
    """transformers 5 saves from rank 0 alone under a process group; a cache entry is built by whichever rank takes
    its lock (core/models/loading.py)."""
    proc = subprocess.run([*torchrun(2), "--no-python", sys.executable, "-c", BUILD_ON_RANK_1, str(tmp_path)],
                          cwd=PROJECT_ROOT, env=CLI_ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.count("loaded") == 2, proc.stderr[-3000:]


RM = ["recipe=tiny_rm", "scale=tiny", "logger.progress=false", "logger.tensorboard=false"]


@pytest.mark.slow  # 60-140 s
@pytest.mark.distributed
def test_rm_two_ranks_write_one_run_like_one_process(tmp_path):
    """The RM loop at 2 ranks: one run dir (Hydra's own, which the ranks resolve apart: a plain torchrun shares no
    run id), one metrics row per step, one results row, one summary, and the evaluation of one process."""
    _run(tmp_path / "one", 1, *RM)
    proc = run_cli(tmp_path / "two", *RM, nproc=2, default_dirs=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    dirs = list((tmp_path / "two" / "results" / "runs" / "tiny_rm").iterdir())
    assert len(dirs) == 1, dirs
    rows = [json.loads(line) for line in (dirs[0] / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "grad_norm" in r] == [1, 2, 3, 4]
    (got,), (want,) = results(tmp_path / "two"), results(tmp_path / "one")
    assert json.loads((dirs[0] / "summary.json").read_text())["run_dir"] == got["run_dir"] == str(dirs[0])
    assert got["eval_before"] == want["eval_before"]
    for key in ("eval_after", "reward_mean", "reward_std"):
        assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key


# 3 held-out prompts generated one at a time on partitioned ZeRO-3 weights: rank 0 holds 2, rank 1 one, and each
# chunk is a synced generate whose layer gathers every rank must join.
UNEVEN_EVAL = [*SAME[:3], "train.eval_prompts=3", *SAME[4:], "rollout.generation_batch_size=1", "train.total_steps=1"]


class _ChunkedCollective:
    """A collective rollout generating one prompt per collective call (``hf`` on partitioned ZeRO-3 weights with
    ``rollout.generation_batch_size=1``): records the prompts it got; completion ``[9]``."""

    collective, gathers_policy = True, False

    def __init__(self):
        self.prompts = []

    def generate(self, prompts, sampling):
        from core.rollout.batch import from_token_lists

        self.prompts = prompts
        return from_token_lists(prompts, [[9]] * len(prompts), [[0.0]] * len(prompts), [1], 0)


@pytest.mark.parametrize("rank,ids,scored", [(0, [[10], [12]], [[10], [12]]), (1, [[11], [10]], [[11]])])
def test_every_rank_generates_as_many_eval_prompts_when_generate_is_collective(monkeypatch, rank, ids, scored):
    """3 held-out prompts on 2 ranks: rank 1's single prompt is joined by a stand-in (the first prompt), so both
    ranks run 2 collective chunks; only its own completion is scored."""
    from contextlib import nullcontext
    from types import SimpleNamespace

    from recipes import rl, rl_rewards
    from tests.helpers import group_option
    from core.training import distributed

    monkeypatch.setattr(distributed, "world", lambda: 2)
    monkeypatch.setattr(distributed, "rank", lambda: rank)
    monkeypatch.setattr(distributed, "all_sum", lambda x: x)
    seen = []
    monkeypatch.setattr(rl_rewards, "score", lambda run, roll, rows, evaluation: seen.append(
        roll.input_ids[:, :1].tolist()) or SimpleNamespace(correct=torch.ones(len(rows)),
                                                           judged=torch.ones(len(rows), dtype=torch.bool)))
    rollout = _ChunkedCollective()
    data = SimpleNamespace(eval_rows=[{"i": i} for i in range(3)], eval_ids=[[10], [11], [12]])
    run = SimpleNamespace(cfg=SimpleNamespace(seed=0, train=SimpleNamespace(eval_prompts=0),
                                              rollout=group_option("rollout/hf")),
                          data=data, step=0,
        gen=SimpleNamespace(push=lambda *a: None), engine=SimpleNamespace(gathered=lambda on: nullcontext()),
        rollout=rollout)
    assert rl.evaluate(run) == 1.0
    assert rollout.prompts == ids and seen == [scored]


@pytest.mark.slow  # 40-70 s
@pytest.mark.distributed
def test_two_ranks_evaluate_uneven_shares_on_partitioned_zero3(tmp_path):
    """Every rank runs as many synced generate chunks as the others (a short share is filled with stand-ins, their
    completions dropped), so the evaluation ends, with the accuracy of one process."""
    _run(tmp_path / "one", 1, *UNEVEN_EVAL)
    _run(tmp_path / "two", 2, *UNEVEN_EVAL, *STAGE3.split(), "rollout.gather_for_generation=false", timeout=180)
    want, got = ([r["eval/accuracy"] for r in _rows(tmp_path / d) if "eval/accuracy" in r] for d in ("one", "two"))
    assert len(got) == 2 and got == want


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["stop", "skip"])
def test_an_infinite_reward_on_one_rank_stops_or_skips_the_step_on_both(tmp_path, mode):
    """Rank 1 alone scores an infinite reward at step 2: both ranks stop there (the saved batch holds both ranks'
    rows), or both skip its update and the run finishes: the check is summed over ranks, so no rank waits in a
    collective the other left (core/training/numerics.py)."""
    run_dir = tmp_path / "run"
    bad = ["verifier.name=tests.stub_rewards:bad_at_step", f"+verifier.kwargs.metrics={run_dir}/metrics.jsonl",
           "+verifier.kwargs.step=2", "+verifier.kwargs.value=inf", "+verifier.kwargs.rank=1",
           "verifier.eval_name=tests.stub_rewards:gold_parity", f"train.on_nonfinite={mode}"]
    proc = run_cli(tmp_path, *SAME, *bad, nproc=2, timeout=300)
    saved = json.loads((run_dir / "nonfinite" / "step-2.json").read_text())
    assert saved["nonfinite"]["reward"][0] == 1 and len(saved["rows"]) == 16  # scale=tiny: 4 prompts x 4, both ranks
    steps = [r for r in _rows(tmp_path) if "reward/mean" in r]
    if mode == "stop":
        assert proc.returncode != 0 and "step 2: non-finite reward (1 of 16 values)" in proc.stderr
        assert [r["step"] for r in steps] == [1] and not results(tmp_path)
    else:
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert [r["nonfinite/skipped"] for r in steps] == [0.0, 1.0] and "grad_norm" not in steps[1]
        assert len(results(tmp_path)) == 1
