"""Resume from the command line as the README says (``hydra.run.dir=<dir> resume=auto``): the run continues as it
was started and says from which step, a finished run asked for more steps is extended (one run in the results
table), the run dir is named at the start, and a refused command leaves none."""
from __future__ import annotations

import subprocess

import pytest
import yaml

from core.paths import PROJECT_ROOT
from core.reporting.results import latest_rows
from tests.helpers import CLI_ENV, FAST, cli_command, results, run_cli
from tests.test_cli import _comparable, _steps

# The run: 8 steps, a checkpoint every 2, and a setting away from the default (kl.coef=0); its verifier
# (tests/stub_rewards.py) kills it when $RLR_TEST_KILL_AFTER asks, else it is the math verifier.
FIRST = [*FAST, "train.total_steps=8", "train.checkpoint_every=2", "kl.coef=0",
         "verifier.name=tests.stub_rewards:math_killed_after"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("uninterrupted")
    proc = run_cli(tmp, *FIRST)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp / "run"


def _config(run_dir) -> dict:
    """``config.yaml`` but for ``resume`` (the command that resumed it says resume=auto)."""
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    saved.pop("resume")
    return saved


def test_a_run_killed_at_step_5_resumes_by_the_readme_command_as_it_started(uninterrupted, tmp_path):
    run_dir = tmp_path / "run"
    env = {**CLI_ENV, "RLR_TEST_KILL_AFTER": f"{run_dir}/metrics.jsonl:5"}  # killed inside step 6 (kill -9)
    killed = subprocess.run(cli_command(tmp_path, *FIRST), cwd=PROJECT_ROOT, env=env, capture_output=True,
                            text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert f"run dir     {run_dir}" in killed.stdout + killed.stderr  # named at the start (the start summary)
    started = _config(run_dir)
    resumed = run_cli(tmp_path, "resume=auto")  # hydra.run.dir=<dir> (and this test's results dir): nothing else
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out[-3000:]
    assert f"resuming {run_dir} from step 4 of 8 (checkpoint {run_dir}/checkpoint-4)" in out
    assert _config(run_dir) == started  # kl.coef=0, 8 steps, a checkpoint every 2: as the run started
    assert [r["step"] for r in _steps(run_dir)] == list(range(1, 9))
    assert [_comparable(r) for r in _steps(run_dir)] == [_comparable(r) for r in _steps(uninterrupted)]
    assert [r["steps"] for r in results(tmp_path)] == [8]


def test_more_steps_extend_a_finished_run_and_the_table_counts_it_once(tmp_path):
    run_dir = tmp_path / "run"
    first = run_cli(tmp_path, *FAST, "train.total_steps=3", "train.checkpoint_every=2")
    assert first.returncode == 0, first.stderr[-3000:]
    before = _steps(run_dir)
    more = run_cli(tmp_path, "resume=auto", "train.total_steps=5")
    out = more.stdout + more.stderr
    assert more.returncode == 0, out[-3000:]
    assert f"extending {run_dir} (finished at step 3) to 5 steps: resuming from step 3" in out  # its last step
    after = _steps(run_dir)
    assert [r["step"] for r in after] == [1, 2, 3, 4, 5] and after[:3] == before
    rows = results(tmp_path)
    assert [r["steps"] for r in rows] == [3, 5] and [r["steps"] for r in latest_rows(rows)] == [5]
    again = run_cli(tmp_path, "resume=auto")  # the extended run, as its config.yaml now says: finished
    assert again.returncode == 0 and "already finished (5 steps)" in again.stdout + again.stderr
    assert len(results(tmp_path)) == 2


@pytest.mark.parametrize("overrides, message", [
    (["train.mini_batch_size=24"], "not divisible by train.mini_batch_size=24"),  # a config check
    (["data.source=file", "data.path=/nonexistent/train.jsonl", "data.eval_path=/nonexistent/eval.jsonl"],
     "data file not found: /nonexistent/train.jsonl"),  # a data check, after the config's
])
def test_a_refused_command_leaves_no_run_dir(tmp_path, overrides, message):
    proc = run_cli(tmp_path, *FAST, *overrides)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert message in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_reward_model_run_resumes_by_the_readme_command(tmp_path):
    run_dir = tmp_path / "run"
    first = run_cli(tmp_path, "recipe=tiny_rm", "scale=tiny", "logger.progress=false", "logger.tensorboard=false",
                    "train.checkpoint_every=1")
    assert first.returncode == 0, first.stderr[-3000:]
    (run_dir / "summary.json").unlink()  # as if killed after its last checkpoint
    resumed = run_cli(tmp_path, "resume=auto")  # its recipe (and loop) from config.yaml, not the default's
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out[-3000:]
    assert f"resuming {run_dir} from step 4 (checkpoint {run_dir}/checkpoint-4)" in out
    assert len(results(tmp_path)) == 1


@pytest.mark.slow
def test_two_identical_jobs_on_one_run_dir_one_trains_and_the_other_is_refused(tmp_path):
    """The issue's replay: the same ``resume=auto`` command started twice at once on one run dir (a requeue while the
    old job runs, a command typed twice). One trains, the other is refused naming it (exit 1, no traceback):
    ``metrics.jsonl`` holds each step once, the table one row. Before, both trained and both wrote: steps 1,1,2,2,..."""
    run_dir = tmp_path / "run"
    cmd = cli_command(tmp_path, *FAST, "train.total_steps=4", "train.checkpoint_every=2", "resume=auto")
    jobs = [subprocess.Popen(cmd, cwd=PROJECT_ROOT, env=CLI_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for _ in range(2)]
    outs = [job.communicate(timeout=600) for job in jobs]
    (trained, _), (refused, refused_out) = sorted(zip(jobs, outs), key=lambda j: j[0].returncode)
    assert (trained.returncode, refused.returncode) == (0, 1), [o[1][-2000:] for o in outs]
    err = refused_out[1]
    assert f"RunDirBusy: {run_dir} is in use by another job (pid {trained.pid} on " in err and "Traceback" not in err
    assert [r["step"] for r in _steps(run_dir)] == [1, 2, 3, 4]
    assert [r["steps"] for r in results(tmp_path)] == [4]
