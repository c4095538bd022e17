"""Multi-node launch through existing tools (core/launch.py, conf/hydra/launcher/, launch/slurm.sbatch), on a CPU
machine without Slurm: the launcher configs compose and render the sbatch file submitit would submit; a Slurm
submission without site settings, or with a layout the launcher cannot start, is refused before submitting; a
submitit task gets its rank variables; submitit's LocalExecutor runs a 2-rank job end to end; the sbatch script
parses and, with stand-ins for ``srun``/``scontrol``/``curl`` on PATH (test doubles), renders its job steps."""
from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig

from core.config.composition import job_dirname, register_resolvers
from core.config.pipeline import prepare
from core.config.validate import ConfigError
from core.errors import InputError
from core.launch import (EXCLUDE_KEY, check_multirun, export_submitit_ranks, hydra_args, launch_problems, sbatch_values,
                         sweep_dirnames)
from core.paths import CONF_DIR, PROJECT_ROOT
from tests.helpers import CLI_ENV, FAST, cli_command, results

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the slurm extra (pip install -e '.[slurm]')")
register_resolvers()  # and the typed schema, which conf/ names, for the tests that compose with Hydra directly

LAUNCHERS = sorted(p.stem for p in (CONF_DIR / "hydra" / "launcher").glob("*.yaml"))
SBATCH = PROJECT_ROOT / "launch" / "slurm.sbatch"
SITE = ["hydra.launcher.partition=gpu", "hydra.launcher.account=rl"]
# Test doubles for the Slurm and network commands launch/slurm.sbatch calls: srun records each job step (a
# server step stays up for STUB_SERVE_SECONDS) and, with STUB_RUN, runs its command once per task on this
# machine, task i as on the i-th node of --nodelist (SLURMD_NODENAME); scontrol lists STUB_HOSTS; curl answers
# STUB_CURL_RC; getent resolves gpu-a and gpu-b to 10.0.0.1 and 10.0.0.2, and no other name; `ip -o route get`
# routes 10.0.0.N through interface ibN.
SRUN = """#!/bin/bash
printf "%s\\n" "$*" >> "$STUB_LOG"
[[ "$*" == *" serve "* ]] && exec sleep "${STUB_SERVE_SECONDS:-0}"
[[ -z "${STUB_RUN:-}" ]] && exit 0
n=1
while [[ "$1" == --* ]]; do
  [[ "$1" == --ntasks=* ]] && n=${1#--ntasks=}
  [[ "$1" == --nodelist=* ]] && nodes=${1#--nodelist=}
  shift
done
IFS=, read -ra names <<< "${nodes:-}"
for ((i = 0; i < n; i++)); do
  [[ -n "${nodes:-}" ]] && export SLURMD_NODENAME=${names[i]:-${names[0]}}
  "$@" &
done
for ((i = 0; i < n; i++)); do wait -n || exit 1; done
"""
STUBS = {
    "srun": SRUN,
    "scontrol": '#!/bin/bash\nprintf "%s\\n" $STUB_HOSTS\n',
    "curl": '#!/bin/bash\nexit "${STUB_CURL_RC:-0}"\n',
    "getent": '#!/bin/bash\ncase "$2" in gpu-a) ip=10.0.0.1 ;; gpu-b) ip=10.0.0.2 ;; *) exit 2 ;; esac\n'
              'echo "$ip STREAM $2"; echo "$ip DGRAM"\n',
    "ip": '#!/bin/bash\n[[ "$1 $2 $3" == "-o route get" && "$4" == 10.0.0.* ]] || exit 1\n'
          'echo "$4 via 10.0.0.254 dev ib${4##*.} src 10.0.0.9 uid 0 \\    cache"\n',
}


@pytest.fixture
def composed():
    """``composed(*overrides)`` -> the job config, with Hydra's own (``hydra.launcher``) as this process's
    HydraConfig; both cleared afterwards."""
    from core.config.composition import compose

    def _compose(*overrides: str):
        GlobalHydra.instance().clear()
        return compose(list(overrides), with_hydra=True)

    yield _compose
    GlobalHydra.instance().clear()
    HydraConfig.instance().cfg = None


def test_discovery_found_the_launcher_configs():
    assert LAUNCHERS == ["local_ranks", "slurm"]


def test_the_slurm_launcher_takes_its_size_from_the_layout(composed):
    composed("hydra/launcher=slurm", "layout=simplerl_zoo_2node", *SITE)
    launcher = HydraConfig.get().launcher
    assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert (launcher.nodes, launcher.tasks_per_node, launcher.gpus_per_node) == (2, 8, 8)
    assert (launcher.partition, launcher.account, launcher.timeout_min) == ("gpu", "rl", 4320)
    composed("hydra/launcher=local_ranks", "layout.learner_gpus=2")
    local = HydraConfig.get().launcher
    assert local._target_.endswith("submitit_launcher.LocalLauncher") and (local.nodes, local.tasks_per_node) == (1, 2)


def test_the_site_file_is_merged_over_the_launcher(tmp_path):
    """conf/local/slurm/site.yaml (git-ignored; here in a copy of conf/) fills the site keys, as the template says."""
    from hydra import compose, initialize_config_dir

    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf, ignore=shutil.ignore_patterns("local"))
    (conf / "local" / "slurm").mkdir(parents=True)
    site = (PROJECT_ROOT / "launch" / "slurm_site.example.yaml").read_text()
    (conf / "local" / "slurm" / "site.yaml").write_text(site.replace("partition: null", "partition: gpu-long")
                                                        .replace("account: null", "account: rl"))
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose("config", overrides=["hydra/launcher=slurm"], return_hydra_config=True)
    assert (cfg.hydra.launcher.partition, cfg.hydra.launcher.account, cfg.hydra.launcher.qos) == ("gpu-long", "rl", None)


def test_the_slurm_launcher_renders_one_job_of_one_task_per_gpu(tmp_path, monkeypatch):
    """The sbatch file the plugin would submit for a 2 x 8 layout (nothing is submitted: map_array is replaced,
    and submitit's check for ``srun`` finds a test double)."""
    import submitit
    from hydra import compose, initialize_config_dir
    from hydra.core.plugins import Plugins

    _stubs(tmp_path, monkeypatch)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["hydra/launcher=slurm", "layout=simplerl_zoo_2node", *SITE,
                                           f"hydra.sweep.dir={tmp_path}/sweep"], return_hydra_config=True)
    launcher = Plugins.instance().instantiate_launcher(hydra_context=None, task_function=print, config=cfg)
    files = []

    def render(executor, fn, *args):
        files.append(executor._executor._make_submission_file_text("python -u -m submitit.core._submit X", "uid"))
        return []

    with mock.patch.object(submitit.AutoExecutor, "map_array", render):
        assert launcher.launch([["seed=0"], ["seed=1"]], initial_job_idx=0) == []
    lines = set(files[0].splitlines())
    assert {"#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-node=8", "#SBATCH --time=4320",
            "#SBATCH --partition=gpu", "#SBATCH --account=rl", "export SUBMITIT_EXECUTOR=slurm"} <= lines, files[0]
    assert len(files) == 1  # both Hydra jobs in one submission: a job array of two Slurm jobs


def test_a_slurm_submission_without_site_settings_or_with_a_dedicated_server_is_refused(composed):
    cfg = composed("hydra/launcher=slurm", "layout=open_r1_2node", "hydra.launcher.partition=null",
                   "hydra.launcher.account=null")
    problems = launch_problems(cfg, HydraConfig.get().launcher)
    assert problems[0].startswith("hydra.launcher.partition and hydra.launcher.account not set: Slurm site settings "
                                  "go in conf/local/slurm/site.yaml")
    assert "layout.mode=dedicated: the submitit launcher starts learner ranks only" in problems[1]
    assert "hydra.launcher.nodes x hydra.launcher.tasks_per_node = 2 x 8 = 16 tasks but layout.learner_gpus=8" in \
        problems[2]
    assert problems[3].startswith("resume=False: Slurm requeues a job that is preempted or times out") and \
        "add resume=auto" in problems[3]  # the requeued job runs the same command (docs/reliability.md)
    assert launch_problems(composed("hydra/launcher=slurm", "layout=simplerl_zoo_2node", "resume=auto", *SITE),
                           HydraConfig.get().launcher) == []
    assert launch_problems(composed("layout=colocate"), HydraConfig.get().launcher) == []  # Hydra's basic launcher


def test_check_multirun_looks_only_at_multiruns_and_ignores_sweeps(composed):
    check_multirun(["hydra/launcher=slurm"])  # not a multirun: nothing is submitted, nothing to check
    with pytest.raises(ConfigError, match="hydra.launcher.account not set"):
        check_multirun(["-m", "hydra/launcher=slurm", "layout=simplerl_zoo_2node", "seed=0,1",
                        "hydra.launcher.partition=gpu", "hydra.launcher.account=null"])


# Every Hydra flag that takes a value (hydra/_internal/utils.py get_args_parser), each with one, and --info without
# its optional one: none of them or their values is an override. (Hydra's argparse takes the overrides in one run,
# before or after the flags; a bare --info last, or it would read the next override as its value.)
VALUE_FLAGS = [["--cfg", "job"], ["-c", "all"], ["--package", "train"], ["-p", "train"], ["--config-path", "conf"],
               ["-cp", "conf"], ["--config-name", "config"], ["-cn", "config"], ["--config-dir", "conf"],
               ["-cd", "conf"], ["--info", "defaults"], ["-i", "plugins"], ["--info"], ["-i"],
               ["--experimental-rerun", "config.pickle"], ["--cfg=hydra"]]
SHOWN = ("--cfg", "-c", "--info", "-i")  # a command line with one of these submits nothing


def test_every_hydra_flag_with_a_value_is_covered_and_kept_apart_from_the_overrides():
    from hydra._internal.utils import get_args_parser

    takes_value = {o for a in get_args_parser()._actions if a.option_strings and a.nargs != 0 for o in a.option_strings}
    assert takes_value == {f[0].split("=")[0] for f in VALUE_FLAGS} and len(takes_value) == 13
    overrides = ["hydra/launcher=slurm", "seed=0,1"]
    for flag in VALUE_FLAGS:
        for argv in ([*overrides, *flag], *([[*flag, *overrides]] if len(flag) == 2 else [])):
            assert hydra_args(["-m", *argv]).overrides == overrides, argv


@pytest.mark.parametrize("flag", VALUE_FLAGS, ids=" ".join)
def test_check_multirun_reads_past_every_hydra_flag(composed, flag):
    """``-m hydra/launcher=slurm --cfg hydra`` once parsed ``hydra`` as an override. A flag that only shows something
    is refused with ``-m`` as Hydra refuses it, and says what to run instead; any other is checked as before."""
    overrides = ["hydra/launcher=slurm", "layout=simplerl_zoo_2node", "seed=0,1", "hydra.launcher.partition=gpu",
                 "hydra.launcher.account=null"]
    shown = flag[0].split("=")[0] in SHOWN
    with pytest.raises(InputError, match="leave out -m to show" if shown else "hydra.launcher.account not set"):
        check_multirun(["-m", *overrides, *flag])
    if shown:
        check_multirun(["hydra.mode=MULTIRUN", *overrides, *flag])  # shows only: nothing to check


def test_the_cli_refuses_to_submit_and_says_why(tmp_path):
    cmd = cli_command(tmp_path, "hydra/launcher=slurm", "layout=simplerl_zoo_2node", "hydra.launcher.partition=null",
                      "hydra.launcher.account=null", "seed=0,1", multirun=True)
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, env=CLI_ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "ConfigError: cannot submit:\n  - hydra.launcher.partition and hydra.launcher.account not set" in proc.stderr
    assert not (tmp_path / "sweep").exists()  # nothing was submitted


def test_the_cli_says_how_to_show_a_multiruns_launcher(tmp_path):
    proc = subprocess.run(cli_command(tmp_path, "hydra/launcher=slurm", "--cfg", "hydra", multirun=True),
                          cwd=PROJECT_ROOT, env=CLI_ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "Error parsing override" not in proc.stderr
    assert "InputError: -m with --cfg: Hydra runs one of" in proc.stderr and "leave out -m" in proc.stderr


def test_a_submitit_task_exports_its_rank_and_validates_in_that_world(composed, tmp_path, monkeypatch):
    """Task 9 of a 2 x 8 Slurm job (the variables Slurm sets, as submitit's SlurmJobEnvironment reads them), on node
    gpu2: also GLOO_SOCKET_IFNAME, the interface it routes to gpu1 through (the ``ip`` double; the names resolved
    as the getent double resolves gpu-a and gpu-b), and task 1, on gpu1, the one to gpu2."""
    _stubs(tmp_path, monkeypatch)
    real = socket.getaddrinfo
    nodes = {"gpu1": "10.0.0.1", "gpu2": "10.0.0.2"}
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **k: [(socket.AF_INET, socket.SOCK_STREAM, 6, "",
                        (nodes[host], 0))] if host in nodes else real(host, *a, **k))
    slurm = {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "16", "SLURM_PROCID": "9",
             "SLURM_LOCALID": "1", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "gpu[1-2]", "SLURM_NODEID": "1"}
    with mock.patch.dict(os.environ, slurm):  # the whole environment is restored afterwards
        for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                    "GLOO_SOCKET_IFNAME"):
            os.environ.pop(key, None)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        export_submitit_ranks()
        assert {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                           "GLOO_SOCKET_IFNAME")} == {
            "RANK": "9", "WORLD_SIZE": "16", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "8", "MASTER_ADDR": "gpu1",
            "GLOO_SOCKET_IFNAME": "ib1"}
        assert os.environ.get("CUDA_VISIBLE_DEVICES") == visible  # every GPU visible; LOCAL_RANK picks one
        prepare(composed("layout=simplerl_zoo_2node", "train.micro_batch_size=8"))
        os.environ["WORLD_SIZE"] = "2"
        export_submitit_ranks()  # under torchrun its variables stand
        assert os.environ["WORLD_SIZE"] == "2" and os.environ["RANK"] == "9"
        for key in ("WORLD_SIZE", "GLOO_SOCKET_IFNAME"):
            os.environ.pop(key)
        os.environ.update(SLURM_PROCID="1", SLURM_NODEID="0")
        export_submitit_ranks()
        assert (os.environ["RANK"], os.environ["GLOO_SOCKET_IFNAME"]) == ("1", "ib2")


@pytest.mark.slow  # 11-17 s: make test stays near 10 minutes
@pytest.mark.distributed
def test_submitit_runs_a_two_rank_job_end_to_end(tmp_path):
    """``hydra/launcher=local_ranks``: submitit's LocalExecutor starts 2 tasks, each a rank of a gloo process group
    (DDP on the CPU) running the Hydra job; the job's dir is the sweep's, and rank 0 writes one results row."""
    cmd = cli_command(tmp_path, *FAST, "hydra/launcher=local_ranks", "layout.learner_gpus=2",
                      "layout.gpus_per_node=2", "device=cpu", multirun=True, default_dirs=True)
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, env=CLI_ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = results(tmp_path)
    assert len(rows) == 1 and rows[0]["steps"] == 2, rows
    sweep = Path(rows[0]["run_dir"]).parent
    assert sweep.name.startswith("multirun_") and Path(rows[0]["run_dir"]).name == "0"
    logs = sorted((sweep / ".submitit").glob("*/*_log.out"))  # one per task; the job needed WORLD_SIZE=2
    assert [("global_rank=0(2)" in p.read_text(), "global_rank=1(2)" in p.read_text()) for p in logs] == \
        [(True, False), (False, True)]


def _stubs(tmp_path: Path, monkeypatch, **plan_values) -> Path:
    """A bin dir of test doubles first on PATH; with ``plan_values``, also a stand-in Python that prints that
    plan for ``-m core.launch``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stubs = dict(STUBS)
    if plan_values:
        stubs["python"] = "#!/bin/bash\ncat <<'PLAN'\n" + \
            "\n".join(f"{k}={shlex.quote(str(v))}" for k, v in plan_values.items()) + "\nPLAN\n"
    for name, text in stubs.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return bin_dir


def _sbatch(tmp_path, python: str, *overrides: str, hosts: str = "gpu-a gpu-b", **env) -> subprocess.CompletedProcess:
    """Run launch/slurm.sbatch as Slurm would on the first node of a job on ``hosts``."""
    job = {"STUB_LOG": str(tmp_path / "steps.log"), "STUB_HOSTS": hosts, "SLURM_JOB_ID": "77",
           "SLURM_JOB_NUM_NODES": str(len(hosts.split())), "SLURM_JOB_NODELIST": "gpu-[a-b]",
           "SLURM_SUBMIT_DIR": str(PROJECT_ROOT), "PYTHON": python}
    return subprocess.run(["bash", str(SBATCH), *overrides], env={**CLI_ENV, "PATH": os.environ["PATH"], **job, **env},
                          capture_output=True, text=True, timeout=300)


def _steps(tmp_path) -> list[str]:
    return (tmp_path / "steps.log").read_text().splitlines()


def test_the_sbatch_script_parses():
    assert subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True).returncode == 0


@pytest.mark.slow  # 16-19 s
@pytest.mark.distributed
def test_the_sbatch_script_starts_torchrun_across_two_nodes_that_rendezvous(tmp_path, monkeypatch):
    """The real plan (``python -m core.launch``) of a 2-node layout: one torchrun per node, c10d rendezvous at the
    first node, every rank writing to the plan's run dir. The srun double then runs each task here, so the two
    torchrun agents (two "nodes" on this machine) rendezvous and train one 2-rank job over gloo."""
    _stubs(tmp_path, monkeypatch)
    layout = ["layout=colocate", "layout.nodes=2", "layout.gpus_per_node=1", "layout.learner_gpus=2", "device=cpu"]
    with socket.socket() as sock:  # a free port for the rendezvous (the script's default is 29500)
        sock.bind(("localhost", 0))
        port = sock.getsockname()[1]
    proc = _sbatch(tmp_path, sys.executable, *layout, *FAST, f"paths.results_dir={tmp_path}/results",
                   f"hydra.run.dir={tmp_path}/run", hosts="localhost localhost", STUB_RUN="1", RDZV_PORT=str(port),
                   GLOO_SOCKET_IFNAME="lo")  # two "nodes" on one machine reach each other there
    assert proc.returncode == 0, proc.stderr[-3000:]
    (step,) = _steps(tmp_path)
    args = " ".join([*layout, *FAST, f"paths.results_dir={tmp_path}/results", f"hydra.run.dir={tmp_path}/run"])
    assert step == (f"--nodes=2 --ntasks=2 --ntasks-per-node=1 --nodelist=localhost,localhost --kill-on-bad-exit=1 "
                    f"{Path(sys.executable).parent}/torchrun --nnodes=2 --nproc_per_node=1 --rdzv_backend=c10d "
                    f"--rdzv_endpoint=localhost:{port} --rdzv_id=77 --signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,"
                    f"SIGUSR1 --shutdown-timeout=600 -m recipes.run {args} hydra.run.dir={tmp_path}/run")
    rows = results(tmp_path)
    assert len(rows) == 1 and rows[0]["steps"] == 2 and rows[0]["run_dir"] == f"{tmp_path}/run"


SERVE = ("--host 0.0.0.0 --data-parallel-size 1 --gpu-memory-utilization 0.9 --dtype bfloat16 --seed 0 "
         "--enable-prefix-caching --weight-transfer-config '{\"backend\": \"nccl\"}' "
         "--logprobs-mode processed_logprobs --max-logprobs -1")
DEDICATED = {"NODES": 1, "GPUS_PER_NODE": 8, "LEARNER_NODES": 1, "NPROC_PER_NODE": 7,
             "LEARNER_DEVICES": "0,1,2,3,4,5,6", "ROLLOUT_GPUS": 1, "TP": 1, "ENGINES": 1, "SERVERS": "0:7:8000",
             "SERVE_ARGS": SERVE, "SERVER_TIMEOUT": 1, "MODEL": "Qwen/Qwen2.5-Math-7B", "RUN_DIR": "/runs/x"}
# Open-R1's 1 + 1 nodes with 2 engines of TP 4 on the second: one server each, every learner GPU on the first node
TWO_SERVERS = {**DEDICATED, "NODES": 2, "NPROC_PER_NODE": 8, "LEARNER_DEVICES": "", "ROLLOUT_GPUS": 8, "TP": 4,
               "ENGINES": 2, "SERVERS": "1:0,1,2,3:8000 1:4,5,6,7:8001"}
DEDICATED_ARGS = ["layout=dedicated", "rollout=vllm_server", "model.name_or_path=Qwen/Qwen2.5-Math-7B",
                  "train.prompts_per_step=14", "train.mini_batch_size=112", "train.micro_batch_size=16"]


def test_the_sbatch_values_of_a_dedicated_layout(composed):
    """``core.launch.sbatch_values`` of Open-Instruct 8B's 7 + 1 and Open-R1's 1 + 1 nodes (what the stand-in Python below
    prints), and the layouts whose servers it cannot place."""
    assert sbatch_values([*DEDICATED_ARGS, "rollout.server.timeout_s=1", "hydra.run.dir=/runs/x"]) == DEDICATED
    two = sbatch_values(["layout=open_r1_2node", "rollout=vllm_server", "rollout.vllm.tensor_parallel_size=4",
                "rollout.server.hosts=[b,b]", "model.name_or_path=Qwen/Qwen2.5-Math-7B", "train.micro_batch_size=8",
                "rollout.server.timeout_s=1", "hydra.run.dir=/runs/x"])
    assert two == TWO_SERVERS
    with pytest.raises(ConfigError, match="layout.mode=dedicated serves model.name_or_path with vllm serve"):
        sbatch_values([a for a in DEDICATED_ARGS if not a.startswith("model.")])
    with pytest.raises(ConfigError, match="vLLM engine 1 .rollout.vllm.tensor_parallel_size=2. would start at GPU 7 "
                                          "of node 0 and span nodes"):
        sbatch_values(["layout=open_r1_2node", "layout.learner_gpus=5", "layout.rollout_gpus=4", "rollout=vllm_server",
              "rollout.vllm.tensor_parallel_size=2", "rollout.server.hosts=[b,b]",
              "model.name_or_path=Qwen/Qwen2.5-Math-7B", "train.prompts_per_step=5", "train.mini_batch_size=40",
              "train.micro_batch_size=8"])


def test_a_server_takes_its_memory_share_of_the_card(composed):
    """``vllm serve`` has its GPU to itself and takes ``--gpu-memory-utilization`` of the card: the colocated engine's
    ``gpu_memory_utilization_of=free`` (veRL's meaning) is refused for it, naming the key."""
    with pytest.raises(ConfigError, match="rollout.vllm.gpu_memory_utilization_of=free with rollout.engine=vllm_server"):
        sbatch_values([*DEDICATED_ARGS, "rollout.vllm.gpu_memory_utilization_of=free", "hydra.run.dir=/runs/x"])


def test_the_sbatch_script_starts_the_server_and_splits_a_shared_node(tmp_path, monkeypatch):
    _stubs(tmp_path, monkeypatch, **DEDICATED)
    proc = _sbatch(tmp_path, "python", "layout=dedicated", hosts="gpu-a")
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = _steps(tmp_path)  # the server's line may come second: its srun runs in the background
    (server,), (learners,) = [s for s in steps if " serve " in s], [s for s in steps if "torchrun" in s]
    assert server == ("--nodes=1 --ntasks=1 --nodelist=gpu-a --overlap env CUDA_VISIBLE_DEVICES=7 "
                      "VLLM_SERVER_DEV_MODE=1 VLLM_HOST_IP=10.0.0.1 ./vllm serve Qwen/Qwen2.5-Math-7B --port 8000 "
                      "--tensor-parallel-size 1 " +
                      SERVE.replace("'", ""))  # srun's log joins the arguments: the JSON is one of them
    assert learners.startswith("--nodes=1 --ntasks=1 --ntasks-per-node=1 --nodelist=gpu-a --kill-on-bad-exit=1 "
                               "--overlap bash -c ")  # VLLM_HOST_IP set in the task (below)
    assert ("host_ip env CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6 ./torchrun --nnodes=1 --nproc_per_node=7 "
            "--rdzv_backend=c10d --rdzv_endpoint=gpu-a:29500") in learners
    assert learners.endswith("-m recipes.run layout=dedicated hydra.run.dir=/runs/x rollout.server.hosts=[gpu-a]")


def test_the_sbatch_script_starts_one_server_per_engine_on_the_rollout_node(tmp_path, monkeypatch):
    _stubs(tmp_path, monkeypatch, **TWO_SERVERS)
    proc = _sbatch(tmp_path, "python", "layout=open_r1_2node", hosts="gpu-a gpu-b")
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = _steps(tmp_path)
    servers, (learners,) = sorted(s for s in steps if " serve " in s), [s for s in steps if "torchrun" in s]
    assert [s.split(" ./vllm")[0] for s in servers] == [
        "--nodes=1 --ntasks=1 --nodelist=gpu-b --overlap env CUDA_VISIBLE_DEVICES=0,1,2,3 VLLM_SERVER_DEV_MODE=1 "
        "VLLM_HOST_IP=10.0.0.2",
        "--nodes=1 --ntasks=1 --nodelist=gpu-b --overlap env CUDA_VISIBLE_DEVICES=4,5,6,7 VLLM_SERVER_DEV_MODE=1 "
        "VLLM_HOST_IP=10.0.0.2"]
    assert "--port 8000 --tensor-parallel-size 4" in servers[0]
    assert "--port 8001 --tensor-parallel-size 4" in servers[1]
    assert learners.startswith("--nodes=1 --ntasks=1 --ntasks-per-node=1 --nodelist=gpu-a --kill-on-bad-exit=1 "
                               "bash -c ")  # a node of its own: no --overlap
    assert "host_ip ./torchrun --nnodes=1 --nproc_per_node=8" in learners
    assert learners.endswith("rollout.server.hosts=[gpu-b,gpu-b]")


def test_the_sbatch_script_names_the_url_of_a_server_that_does_not_answer(tmp_path, monkeypatch):
    _stubs(tmp_path, monkeypatch, **DEDICATED)
    proc = _sbatch(tmp_path, "python", "layout=dedicated", hosts="gpu-a", STUB_CURL_RC="7", STUB_SERVE_SECONDS="30")
    assert proc.returncode == 1
    assert "the generation server did not answer at http://gpu-a:8000/health within 1s (rollout.server.timeout_s)" \
        in proc.stderr
    assert len(_steps(tmp_path)) == 1  # no learners started


def test_the_sbatch_script_refuses_a_job_of_the_wrong_size(tmp_path, monkeypatch):
    _stubs(tmp_path, monkeypatch, **DEDICATED)
    proc = _sbatch(tmp_path, "python", "layout=dedicated", hosts="gpu-a gpu-b")
    assert proc.returncode == 1 and "this job has 2 node(s) but layout.nodes=1: sbatch --nodes=1" in proc.stderr


def test_the_sbatch_script_gives_each_node_of_a_dedicated_layout_its_address_for_vllm(tmp_path, monkeypatch):
    """VLLM_HOST_IP: the address vLLM's get_ip() gives the weight-transfer group (TRL's VLLMClient advertises the
    trainer's), else 0.0.0.0 on a node without a default route. A server node gets its name's address, resolved
    as the learners resolve rollout.server.hosts; each learner task resolves its own node's name on that node
    (rank 0 may be on any). A server node that does not resolve stops the job before anything starts."""
    bin_dir = _stubs(tmp_path, monkeypatch, **TWO_SERVERS)
    (bin_dir / "torchrun").write_text('#!/bin/bash\necho "torchrun VLLM_HOST_IP=$VLLM_HOST_IP" >> "$STUB_LOG"\n')
    (bin_dir / "torchrun").chmod(0o755)
    proc = _sbatch(tmp_path, str(bin_dir / "python"), "layout=open_r1_2node", hosts="gpu-a gpu-b", STUB_RUN="1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = _steps(tmp_path)
    assert [s.split(" VLLM_HOST_IP=")[1].split()[0] for s in steps if " serve " in s] == ["10.0.0.2", "10.0.0.2"]
    assert steps[-1] == "torchrun VLLM_HOST_IP=10.0.0.1"  # the learner node gpu-a, resolved in its task
    (tmp_path / "steps.log").unlink()
    proc = _sbatch(tmp_path, "python", "layout=open_r1_2node", hosts="gpu-a gpu-x")
    assert proc.returncode == 1 and "cannot resolve the server node gpu-x to an IPv4 address" in proc.stderr
    assert not (tmp_path / "steps.log").exists()  # nothing started


COLOCATED_2NODE = {**DEDICATED, "NODES": 2, "LEARNER_NODES": 2, "NPROC_PER_NODE": 8, "LEARNER_DEVICES": "",
                   "ROLLOUT_GPUS": 0, "ENGINES": 0, "SERVERS": "", "SERVE_ARGS": "", "SERVER_TIMEOUT": 0}


def test_each_node_of_a_multi_node_job_names_the_interface_gloo_binds_to(tmp_path, monkeypatch):
    """GLOO_SOCKET_IFNAME: without it gloo binds to the address the node's name resolves to, loopback on some nodes.
    Each learner task names the interface its node routes to another learner node through (gpu-b to the first node,
    gpu-a to the second); a preset one is kept; a peer that does not resolve leaves it unset, saying so (the ranks
    then refuse a loopback address themselves: tests/core/test_gloo.py)."""
    bin_dir = _stubs(tmp_path, monkeypatch, **COLOCATED_2NODE)
    seen = 'echo "$SLURMD_NODENAME ${GLOO_SOCKET_IFNAME-unset}" >> "$STUB_LOG"'
    (bin_dir / "torchrun").write_text(f"#!/bin/bash\n{seen}\n")
    (bin_dir / "torchrun").chmod(0o755)
    for env, hosts, want in (({}, "gpu-a gpu-b", ["gpu-a ib2", "gpu-b ib1"]),
                             ({"GLOO_SOCKET_IFNAME": "eth7"}, "gpu-a gpu-b", ["gpu-a eth7", "gpu-b eth7"]),
                             ({}, "gpu-a gpu-x", ["gpu-a unset", "gpu-x ib1"])):
        proc = _sbatch(tmp_path, str(bin_dir / "python"), "layout=simplerl_zoo_2node", hosts=hosts, STUB_RUN="1", **env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert sorted(line for line in _steps(tmp_path) if line.startswith("gpu-")) == want  # what torchrun saw
        assert ("gpu-a: no route to gpu-x () names an interface; GLOO_SOCKET_IFNAME left unset" in proc.stderr) == \
            (hosts == "gpu-a gpu-x")
        (tmp_path / "steps.log").unlink()


@pytest.mark.parametrize("argv, added", [
    (["-m", "scale=tiny", "seed=0,1", "+train.x=1", "hydra/launcher=slurm"], "['scale','train.x']"),
    (["-m", "seed=0,1", "optim.optimizer.lr=range(1,3)"], "[]"),
    (["scale=tiny", "seed=0"], None),  # not a multirun: argv as given
    (["-m", "seed=0,1", "hydra.job.config.override_dirname.exclude_keys=[seed]"], None),  # the user's own
])
def test_a_multirun_names_job_dirs_by_the_swept_values_only(argv, added):
    out = sweep_dirnames(argv)
    assert out == argv if added is None else out == [*argv, f"{EXCLUDE_KEY}={added}"]
    assert job_dirname(0, "seed=0,optim.optimizer.lr=1") == "0_seed=0,optim.optimizer.lr=1"
    assert (job_dirname(3, ""), job_dirname(1, "data.path=a/b.jsonl")) == ("3", "1_data.path=a_b.jsonl")
