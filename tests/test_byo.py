"""docs/byo.md runs as written: every ``bash`` block of the page, in order, in a scratch copy of the repository
(its tracked and untracked files, as a fresh clone holds them), with ``python`` the interpreter running the tests.
Each block must exit 0; the runs it starts leave their rows and dirs as the page says."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from core.paths import PROJECT_ROOT
from tests.helpers import CLI_ENV

PAGE = PROJECT_ROOT / "docs" / "byo.md"


def blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", PAGE.read_text(), re.S)


def scratch_clone(dest: Path) -> Path:
    """The files ``git`` would give a clone (tracked, and new ones not ignored), copied to ``dest``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=PROJECT_ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        src = PROJECT_ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


@pytest.mark.slow  # about 2 minutes: six tiny runs
def test_every_block_of_byo_runs_as_written(tmp_path):
    found = blocks()
    assert len(found) >= 7, len(found)
    clone = scratch_clone(tmp_path / "clone")
    env = {k: v for k, v in CLI_ENV.items() if k != "RLR_RESULTS_DIR"}
    env.update(PYTHONPATH=str(clone), PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
               HF_HUB_OFFLINE="1")
    for block in found:
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=clone, env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, (block, proc.stderr[-3000:])
    rows = [json.loads(line) for line in (clone / "results" / "runs.jsonl").read_text().splitlines()]
    overrides = [" ".join(r["overrides"]) for r in rows]
    assert len(rows) == 6, overrides  # one row per run the page starts
    assert any("data.eval_holdout=0.1" in o for o in overrides)
    assert any("verifier.name=my_reward.py:last_number" in o for o in overrides)
