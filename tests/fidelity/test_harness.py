"""The fidelity harness (tests/fidelity/harness.py) without the source envs: the environment a driver runs in."""
from __future__ import annotations

import os
import sys

from tests.fidelity import harness


def test_a_driver_builds_its_deepspeed_ops_in_its_own_env(tmp_path, monkeypatch):
    """A source env's DeepSpeed (another release) must not build its CPU ops into the project venv's extensions folder
    (tests/conftest.py names it for every test and its subprocesses): each driver command gets its env's folder."""
    project = str(tmp_path / "project_extensions")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", project)
    monkeypatch.setattr(harness, "ENVS", tmp_path / "envs")
    seen = tmp_path / "seen.txt"
    show = f"import os, pathlib; pathlib.Path({str(seen)!r}).write_text(os.environ['TORCH_EXTENSIONS_DIR'])"
    envs = sorted({s["env"] for s in harness.SOURCES.values() if s["env"]})
    assert len(envs) >= 5  # trl, verl, openrlhf and the two Open-Instruct commits
    for env in envs:
        harness._run([sys.executable, "-c", show], 60, env)
        assert seen.read_text() == str(tmp_path / "envs" / env / "torch_extensions") != project, env
    harness._run([sys.executable, "-c", show], 60)  # our own side keeps the project's folder
    assert seen.read_text() == project == os.environ["TORCH_EXTENSIONS_DIR"]


def test_a_driver_writes_what_its_script_leaves_in_the_working_directory_into_its_check_folder(tmp_path):
    """A source's script may write relative paths (Open-Instruct's reward_modeling.main: TensorBoard events under
    runs/): the driver runs in its check's folder, not in the project tree."""
    check = tmp_path / "check"
    check.mkdir()
    harness._run([sys.executable, "-c", "open('stray.txt', 'w').write('x')"], 60, "trl-0.18.0", check)
    assert (check / "stray.txt").exists() and not (harness.PROJECT_ROOT / "stray.txt").exists()
