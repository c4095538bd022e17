"""Every command of the README's "Everyday use" block, run as written in a scratch results dir
(``RLR_RESULTS_DIR``), shrunk: ``recipe=NAME`` is the tiny GRPO recipe, training commands get small batch and
step counts, ``<run dir>`` is the first run's dir."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

from core.paths import PROJECT_ROOT
from tests.helpers import CLI_ENV, FAST


def _everyday_commands() -> list[str]:
    text = (PROJECT_ROOT / "README.md").read_text()
    block = re.search(r"## Everyday use\n\n```bash\n(.*?)```", text, re.S).group(1)
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


@pytest.mark.slow
def test_every_everyday_command_runs_as_written(tmp_path):
    commands = _everyday_commands()
    assert len(commands) == 11, commands
    env = {**CLI_ENV, "RLR_RESULTS_DIR": str(tmp_path / "results")}
    first_run = None
    for command in commands:
        filled = command.replace("recipe=NAME", "recipe=tiny_math_grpo").replace("<run dir>", str(first_run))
        args = shlex.split(filled)
        assert args[:2] == ["python", "-m"], command
        if args[2] == "recipes.run" and "--cfg" not in args:
            args += FAST
        if args[2] in ("recipes.probe", "recipes.plan"):  # the tiny recipe's data sets no prompt length
            args += ["data.max_prompt_tokens=64"]
        proc = subprocess.run([sys.executable, *args[1:]], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, (command, proc.stderr[-3000:])
        if first_run is None:
            first_run = next((tmp_path / "results" / "runs" / "tiny_math_grpo").iterdir())
    rows = [line for line in (tmp_path / "results" / "runs.jsonl").read_text().splitlines()]
    assert len(rows) == 1 + 1 + 1 + 6  # recipe, scale=tiny, lr/seed, 6 multirun jobs; the resume adds none
    assert (tmp_path / "cmp.csv").exists() and (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert os.path.getsize(tmp_path / "curves.png") > 20_000


def test_make_help_and_the_readme_give_one_test_time():
    """``make help`` and the README's "Tests and benchmarks" state the same measured time of ``make test`` (they
    once said 10 and 17 minutes)."""
    makefile = (PROJECT_ROOT / "Makefile").read_text()
    readme = (PROJECT_ROOT / "README.md").read_text()
    minutes = re.search(r"^test: .*## .*about (\d+) min", makefile, re.M)
    seconds = re.search(r"`make test`: .*?(\d+) tests in (\d+) s", readme, re.S)
    assert minutes and seconds, "the Makefile's `test` help or the README's figure moved; update this test"
    assert int(minutes.group(1)) == round(int(seconds.group(2)) / 60), (minutes.group(0), seconds.group(0))
