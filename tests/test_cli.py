"""The real CLI end to end: outputs, results rows, multirun, bit-for-bit repeats and resume."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch
import yaml

from core.paths import PROJECT_ROOT
from core.training.checkpoint import checkpoint_dirs
from tests.helpers import CLI_ENV, FAST, results, run_cli, slow

STEP_KEYS = {"reward/mean", "reward/std", "accuracy", "length/mean", "length/max", "length/truncated_frac", "kl",
             "entropy", "clip_frac", "grad_norm", "lr", "loss", "time/generate", "time/verify", "time/logprobs",
             "time/update", "memory/peak_mb"}


def _steps(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "reward/mean" in r]


def _comparable(row):
    return {k: v for k, v in row.items() if not k.startswith(("time/", "memory/"))}


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("straight")
    proc = run_cli(tmp, *FAST, "train.total_steps=3", "logger.tensorboard=true", "kl.coef=0.04",
                   "logger.samples_every=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp


def test_end_to_end_outputs(straight_run):
    from transformers import AutoModelForCausalLM

    run_dir = straight_run / "run"
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [1] * 4 + [2] * 4 + [3] * 4  # logger.samples of each step
    assert all(s["prompt"].endswith("=") and isinstance(s["completion"], str) for s in samples)
    steps = _steps(run_dir)
    assert [r["step"] for r in steps] == [1, 2, 3]
    missing = STEP_KEYS - set(steps[0])
    assert not missing, missing
    assert all(0.0 <= r["reward/mean"] <= 1.0 for r in steps)
    assert (run_dir / "config.yaml").exists() and (run_dir / ".hydra" / "overrides.yaml").exists()
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    model = AutoModelForCausalLM.from_pretrained(run_dir / "model")
    assert sum(p.numel() for p in model.parameters()) > 0
    rows = results(straight_run)
    assert len(rows) == 1 and rows[0]["recipe"] == "tiny_math_grpo" and rows[0]["steps"] == 3
    assert 0.0 <= rows[0]["eval_before"] <= 1.0 and 0.0 <= rows[0]["eval_after"] <= 1.0


def _tb_steps(run_dir, tag: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tb")).Reload()
    return [e.step for e in events.Scalars(tag)]


def _progress(run_dir) -> tuple[int, int]:
    """(metrics rows written, step of the newest checkpoint) of a run in progress."""
    rows = len((run_dir / "metrics.jsonl").read_text().splitlines()) if (run_dir / "metrics.jsonl").exists() else 0
    try:
        newest = checkpoint_dirs(run_dir)
        step = json.loads((newest[0] / "trainer.json").read_text())["step"] if newest else 0
    except (OSError, ValueError):  # pruned between the listing and the read
        step = 0
    return rows, step


def test_killed_at_random_instants_resumes_bit_for_bit(straight_run, tmp_path):
    """SIGKILL the run at seeded random instants and start it again with resume=auto until it finishes: after its
    first record, and at random delays after each checkpoint (inside the next step, or the next checkpoint's
    write). Its records equal the uninterrupted run's, each step once in metrics.jsonl, samples.jsonl and
    TensorBoard, with one results row."""
    import random
    import subprocess

    from core.paths import PROJECT_ROOT
    from tests.helpers import CLI_ENV, cli_command

    cmd = cli_command(tmp_path, *FAST, "train.total_steps=3", "train.checkpoint_every=1", "logger.tensorboard=true",
                      "kl.coef=0.04", "logger.samples_every=1", "resume=auto")
    rng, kills, run_dir = random.Random(0), 0, tmp_path / "run"
    # kill once the run has written its first record, then once past each of its first two checkpoints
    for reached in (lambda r, s: r >= 1, lambda r, s: s >= 1, lambda r, s: s >= 2):
        proc = subprocess.Popen(cmd, cwd=PROJECT_ROOT, env=CLI_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        while proc.poll() is None and not reached(*_progress(run_dir)):
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.3))
        if proc.poll() is None:
            proc.kill()
            kills += 1
        proc.wait()
    final = run_cli(tmp_path, *FAST, "train.total_steps=3", "train.checkpoint_every=1", "logger.tensorboard=true",
                    "kl.coef=0.04", "logger.samples_every=1", "resume=auto")
    assert final.returncode == 0, final.stderr[-3000:]
    assert kills >= 2
    resumed = _steps(tmp_path / "run")
    assert [r["step"] for r in resumed] == [1, 2, 3]
    assert [_comparable(r) for r in resumed] == [_comparable(r) for r in _steps(straight_run / "run")]
    assert _tb_steps(tmp_path / "run", "reward/mean") == [1, 2, 3]
    samples = (tmp_path / "run" / "samples.jsonl").read_text()
    assert samples == (straight_run / "run" / "samples.jsonl").read_text()  # each step's samples once
    assert len(results(tmp_path)) == 1
    assert not [p.name for p in (tmp_path / "run").iterdir() if ".tmp" in p.name or ".old" in p.name]


def test_a_finished_run_is_not_run_again(straight_run):
    again = run_cli(straight_run, *FAST, "train.total_steps=3", "logger.tensorboard=true", "kl.coef=0.04",
                    "logger.samples_every=1", "resume=auto")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already finished" in again.stderr + again.stdout
    assert len(results(straight_run)) == 1 and [r["step"] for r in _steps(straight_run / "run")] == [1, 2, 3]


@pytest.mark.parametrize("resume, held, message", [
    ("true", "nothing", "resume=true but {run} holds no complete checkpoint"),
    slow("false", "a run", "resume=false but {run} already holds a run"),
    slow("maybe", "nothing", "resume='maybe': expected one of ['auto', True, False]"),
])
def test_resume_asks_for_what_the_run_dir_holds(tmp_path, resume, held, message):
    if held == "a run":
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 1}\n')
    proc = run_cli(tmp_path, *FAST, f"resume={resume}")
    assert proc.returncode != 0 and message.format(run=tmp_path / "run") in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "run" / "model").exists()


def test_a_resume_that_changes_the_recipe_is_refused_and_keeps_the_config(tmp_path):
    first = run_cli(tmp_path, *FAST, "train.total_steps=2", "train.checkpoint_every=1")
    assert first.returncode == 0, first.stderr[-3000:]
    (tmp_path / "run" / "summary.json").unlink()  # as if killed after its last checkpoint
    saved = (tmp_path / "run" / "config.yaml").read_text()
    proc = run_cli(tmp_path, *FAST, "train.total_steps=3", "train.checkpoint_every=1", "resume=true",
                   "optim.optimizer.lr=3e-4", "model.tiny.hidden_size=48")
    assert proc.returncode != 0
    assert "optim.optimizer.lr: 0.0001 -> 0.0003" in proc.stderr and "model.tiny.hidden_size: 32 -> 48" in proc.stderr
    assert (tmp_path / "run" / "config.yaml").read_text() == saved


@pytest.mark.slow  # make test: test_multirun_needs_no_sweep_dir (a dir named by the swept value and a row per job)
def test_multirun_gives_one_dir_and_one_row_per_job(tmp_path):
    proc = run_cli(tmp_path, *FAST, "train.total_steps=1", "seed=0,1", multirun=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = results(tmp_path)
    assert sorted(r["seed"] for r in rows) == [0, 1]
    dirs = sorted(p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir() and p.name[0].isdigit())
    assert dirs == ["0_seed=0", "1_seed=1"]  # named by the swept value, not the shared overrides
    assert all((tmp_path / "sweep" / d / "model" / "config.json").exists() for d in dirs)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A 2 x 2 sweep: seeds 0 and 1 at two KL coefficients."""
    tmp = tmp_path_factory.mktemp("sweep")
    proc = run_cli(tmp, *FAST, "train.total_steps=2", "train.warm_start.steps=0", "seed=0,1", "kl.coef=0,0.04",
                   multirun=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp


def test_compare_groups_by_the_swept_key_with_mean_and_std_over_seeds(sweep, tmp_path):
    import csv
    import statistics

    from recipes.compare import main

    out = main(["--results-dir", str(sweep / "results"), "--csv", str(tmp_path / "cmp.csv")])
    lines = out.splitlines()
    assert lines[0] == "RL runs:" and lines[2].split(" | ")[:6] == ["| recipe", "scale", "kl.coef", "n", "seeds",
                                                                   "eval_before"], lines[2]
    assert len(lines) == 6  # title, blank, header, separator, one row per kl.coef
    rows = [r for r in csv.DictReader(open(tmp_path / "cmp.csv")) if r["result"] == "eval_after"]
    assert sorted(r["kl.coef"] for r in rows) == ["0.0", "0.04"] and all(r["n"] == "2" for r in rows)
    assert all(r["seeds"] == "0 1" for r in rows)
    for r in rows:  # the mean and std of the group's own runs, as numbers
        runs = [x for x in results(sweep) if (x["overrides"].count("kl.coef=0.04") > 0) == (r["kl.coef"] == "0.04")]
        after = [x["eval_after"] for x in runs]
        assert float(r["mean"]) == pytest.approx(statistics.fmean(after))
        assert float(r["std"]) == pytest.approx(statistics.stdev(after))


def test_compare_plots_the_training_curves(sweep, tmp_path):
    from recipes.compare import main

    main(["--results-dir", str(sweep / "results"), "--plot", str(tmp_path / "curves.png")])
    png = (tmp_path / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000


# A sample through the command line (exit status, message only, no model dir), one case per kind of refusal the
# CLI reaches: Hydra's composition, the device check, a check that needs the data's rows. tests/core/test_bad_inputs.py
# (and test_device.py, test_pipeline.py) check every refusal in-process; tests/test_resume_cli.py sends a config check
# and a data file check through the CLI (asserting no run dir at all); the rest of the sample runs in
# `make test-slow` (each CLI start costs ~6-10 s here).
@pytest.mark.parametrize("overrides, message", [
    (["recipe=no_such_recipe"], "Available options in 'recipe'"),
    slow(["train.mini_batch_size=24"], "not divisible by train.mini_batch_size=24"),
    slow(["train.micro_batch_size=5"], "train.mini_batch_size=16 is not divisible by train.micro_batch_size"),
    slow(["train.group_size=1", "train.mini_batch_size=4", "train.micro_batch_size=4"], "train.group_size=1"),
    slow(["train.prompts_per_step=100", "train.mini_batch_size=400"], "larger than the training set (64 rows"),
    slow(["data.source=file", "data.path=/nonexistent/train.jsonl"], "data file not found: /nonexistent/train.jsonl"),
    slow(["advantage.name=nope"], "advantage.name='nope': expected one of ['dr_grpo', 'gae', 'grpo'"),
    slow(["train.packing=maybe"], "train.packing='maybe': expected one of ['auto', True, False]"),
    slow(["model.dtype=float16"], "model.dtype=float16: fp16 training needs loss scaling"),
    slow(["model.dtype=nope"], "model.dtype='nope': expected one of ['float32', 'bfloat16', 'float16']"),
    slow(["device=tpu"], "device='tpu': expected auto, cpu, cuda or cuda:N"),
    pytest.param(["device=cuda"], "device=cuda: no CUDA device is available",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")),
    slow(["zero=stage3"], "train.warm_start.steps=5 with zero.stage=3: the warm start trains a full copy"),
    (["train.warm_start.holdout=70"], "train.warm_start.holdout=70 with 64 training rows"),  # issue 30: rows known
    slow(["layout=colocate"], "layout.learner_gpus=8 but this run has 1 rank(s) (no WORLD_SIZE: one process)"),
])
def test_bad_input_fails_before_any_model_is_built(tmp_path, overrides, message):
    proc = run_cli(tmp_path, *FAST, *overrides, "model.init_seed=987654")
    assert proc.returncode != 0
    assert message in proc.stderr + proc.stdout, (proc.stderr + proc.stdout)[-3000:]
    assert not (tmp_path / "run" / "model").exists()
    assert "Traceback" not in proc.stderr  # an input error prints its message only


@pytest.mark.slow  # make test: test_cfg_job_prints_the_config_after_scale_with_command_line_values_kept (the shrunk
# config) and tests/recipes/test_open_r1.py::test_each_recipe_runs_at_tiny_scale (a scale=tiny run of 2 steps)
def test_tiny_scale_shrinks_the_recipe_and_runs(tmp_path):
    proc = run_cli(tmp_path, "scale=tiny", "logger.progress=false", "logger.tensorboard=false",
                   "train.warm_start.steps=5", "train.warm_start.holdout=8")
    assert proc.returncode == 0, proc.stderr[-3000:]
    cfg = (tmp_path / "run" / "config.yaml").read_text()
    assert "prompts_per_step: 4" in cfg and "total_steps: 2" in cfg and "hidden_size: 32" in cfg
    assert [r["step"] for r in _steps(tmp_path / "run")] == [1, 2]


def test_saved_model_generates_like_the_trained_one(straight_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(straight_run / "run" / "model")
    tok = AutoTokenizer.from_pretrained(straight_run / "run" / "model")
    ids = torch.tensor([tok("12+30=", add_special_tokens=False)["input_ids"]])
    out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape[1] > ids.shape[1]


@pytest.mark.slow
def test_ten_runs_started_together_get_ten_dirs_and_ten_rows(tmp_path):
    """Run dirs carry a launch-unique suffix after the timestamp: launches in the same second never share one."""
    import subprocess

    from core.paths import PROJECT_ROOT
    from tests.helpers import CLI_ENV, cli_command

    cmd = cli_command(tmp_path, *FAST, "train.total_steps=1", "train.warm_start.steps=0", "train.eval_prompts=2",
                      default_dirs=True)
    procs = [subprocess.Popen([*cmd, f"seed={s}"], cwd=PROJECT_ROOT, env=CLI_ENV, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for s in range(10)]
    for p in procs:
        assert p.wait(timeout=600) == 0, p.stderr.read()[-3000:]
    dirs = sorted((tmp_path / "results" / "runs" / "tiny_math_grpo").iterdir())
    assert len(dirs) == 10
    rows = results(tmp_path)
    assert sorted(r["seed"] for r in rows) == list(range(10)) and len({r["run_dir"] for r in rows}) == 10
    for d in dirs:  # each dir holds one run's records, not a mix
        summary = json.loads((d / "summary.json").read_text())
        assert summary["run_dir"] == str(d) and f"seed: {summary['seed']}" in (d / "config.yaml").read_text()


@pytest.mark.slow
def test_multirun_needs_no_sweep_dir(tmp_path):
    """The README's multirun, with the config's own sweep dir (it once failed resolving hydra.sweep.dir)."""
    proc = run_cli(tmp_path, *FAST, "train.total_steps=1", "train.warm_start.steps=0", "seed=0,1", multirun=True,
                   default_dirs=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sweep,) = (tmp_path / "results" / "runs" / "tiny_math_grpo").iterdir()
    assert sweep.name.startswith("multirun_") and sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0_seed=0", "1_seed=1"]
    assert sorted(r["seed"] for r in results(tmp_path)) == [0, 1]


def test_cfg_job_prints_the_config_after_scale_with_command_line_values_kept(tmp_path):
    cmd = [sys.executable, "-m", "recipes.run", "--cfg", "job", "scale=tiny", "train.total_steps=10"]
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, env=CLI_ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cfg = yaml.safe_load(proc.stdout)
    assert cfg["train"]["total_steps"] == 10 and cfg["train"]["prompts_per_step"] == 4  # kept; shrunk
    assert cfg["model"]["tiny"]["hidden_size"] == 32 and cfg["scale"]["name"] == "tiny"


def test_a_misspelt_key_is_refused_with_the_nearest_names(tmp_path):
    proc = run_cli(tmp_path, "train.total_step=3")
    assert proc.returncode == 1 and "Key 'total_step' not in 'RLTrainConfig'" in proc.stderr
    assert "did you mean total_steps" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_cli(tmp_path, "+train.total_step=3", "seed=1")
    assert proc.returncode == 1 and "did you mean train.total_steps" in proc.stderr
    assert not (tmp_path / "run" / "model").exists()


TOOLS = ("recipes.explain", "recipes.probe", "recipes.plan", "core.launch")  # the python -m tools that take Hydra overrides


@pytest.mark.parametrize("module", TOOLS)
def test_tools_print_their_usage_on_help_and_a_bad_override_briefly(module, capsys):
    """``--help`` prints the tool's docstring (no override parse error); an override Hydra cannot parse exits 1 with
    Hydra's message and no traceback (issue 27)."""
    import importlib

    tool = importlib.import_module(module)
    tool.main(["--help"])
    assert capsys.readouterr().out.strip() == tool.__doc__.strip()
    with pytest.raises(SystemExit) as exit_:
        tool.main(["bad=="])
    assert "override" in str(exit_.value.code) and "Traceback" not in str(exit_.value.code)


def _module(module: str, *args: str, cwd=PROJECT_ROOT, env=None, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env or CLI_ENV, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("module, args, message", [
    ("recipes.run", ["seed=abc"], "Value 'abc' of type 'str' could not be converted to Integer"),
    ("recipes.run", ["train.group_size=1"], "estimators that take 1: advantage=gae, advantage=reinforce_pp"),
    ("recipes.eval", ["+foo=1"], "foo: unknown key (EvalRunConfig)"),
], ids=["run-type", "run-invalid", "eval-unknown-key"])
def test_cfg_job_of_a_bad_config_prints_its_problems_and_no_config(module, args, message):
    """``--cfg job`` refuses as the run would (issue 27): status 1, the message, no traceback, nothing on stdout; a
    value of the wrong type suggests no other key (its own name is not a misspelling)."""
    proc = _module(module, "--cfg", "job", *args)
    assert proc.returncode == 1 and message in proc.stderr, proc.stderr[-2000:]
    assert proc.stdout == "" and "Traceback" not in proc.stderr and "did you mean" not in proc.stderr


@pytest.mark.parametrize("module", ["recipes.run", "recipes.eval", "recipes.compare", "recipes.explain",
                                    "recipes.probe", "recipes.plan", "core.launch", "bench", "bench.gpu_check",
                                    "core.data.codeforces_tiny"])
def test_every_entry_point_prints_help(module, tmp_path):
    """``python -m MODULE --help`` prints a usage and exits 0, with no traceback, and takes the flag for no name or
    path (core.data.codeforces_tiny once wrote its problems into a folder called ``--help``)."""
    proc = _module(module, "--help", cwd=tmp_path, env={**CLI_ENV, "PYTHONPATH": str(PROJECT_ROOT)})
    assert proc.returncode == 0 and proc.stdout.strip() and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert not list(tmp_path.iterdir())


def test_an_unreachable_hub_dataset_is_named_in_a_short_message(tmp_path):
    """Offline (HF_HUB_OFFLINE=1, an empty hub cache), a hub dataset ends the run with its id, the offline switch
    and the local-file alternative: status 1, no traceback (issue 27: a ConnectionError traceback after 25 s)."""
    env = {**CLI_ENV, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    start = time.monotonic()
    proc = _module("recipes.run", "data=math_lighteval", f"hydra.run.dir={tmp_path}/run", env=env)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "HubError: data.hub_name=DigitalLearningGmbH/MATH-lighteval: the dataset could not be read" in proc.stderr
    assert "HF_HUB_OFFLINE=1 is set" in proc.stderr and "data.source=file data.path=PATH" in proc.stderr
    assert "Traceback" not in proc.stderr and time.monotonic() - start < 120
