"""Size budget of the project's Python (core/ recipes/ verifiers/ launch/ bench/), by an AST pass:

* every file under 500 lines;
* every function and method at most 60 lines, counted from its ``def`` line to its last line (docstring and
  nested functions included, decorators not): the measure of the style rule (median 7, none over ~50);
* each recipe loop (recipes/rl.py, recipes/rm.py) at most 400 lines: the loop reads like its steps, setup lives
  in the components it sets up.

Failures name ``file:line name`` and the length, largest first."""
from __future__ import annotations

import ast
import functools
import statistics
from pathlib import Path

from core.paths import PROJECT_ROOT

DIRS = ("core", "recipes", "verifiers", "launch", "bench")
FILE_LINES = 500  # a file stays under this
FUNCTION_LINES = 60  # the longest was 54 lines when written (verifiers/pool.py score_forked)
RECIPE_LOOPS = {"recipes/rl.py": 400, "recipes/rm.py": 400}


def _files() -> list[Path]:
    return [f for d in DIRS for f in sorted((PROJECT_ROOT / d).rglob("*.py"))]


def _rel(f: Path) -> str:
    return f.relative_to(PROJECT_ROOT).as_posix()


def _lines(f: Path) -> int:
    return len(f.read_text().splitlines())


@functools.cache
def _functions() -> list[tuple[int, str]]:
    """(lines, "file:line name") of every function and method, nested ones included."""
    out = []
    for f in _files():
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((node.end_lineno - node.lineno + 1, f"{_rel(f)}:{node.lineno} {node.name}"))
    return sorted(out, reverse=True)


def test_files_under_500_lines():
    files = _files()
    over = sorted((n, _rel(f)) for f in files if (n := _lines(f)) >= FILE_LINES)
    assert not over, f"files of {FILE_LINES} lines or more:\n" + "\n".join(f"{p}: {n} lines" for n, p in over[::-1])
    assert len(files) >= 75, len(files)  # 93 files when written


def test_functions_within_budget():
    functions = _functions()
    over = [f"{where}: {n} lines (budget {FUNCTION_LINES})" for n, where in functions if n > FUNCTION_LINES]
    assert not over, f"{len(over)} functions over {FUNCTION_LINES} lines:\n" + "\n".join(over)
    assert len(functions) >= 700, len(functions)  # 866 when written
    assert statistics.median(n for n, _ in functions) <= 10, "median function length drifted up"


def test_recipe_loops_within_budget():
    over = [f"{path}: {n} lines (budget {budget})" for path, budget in RECIPE_LOOPS.items()
            if (n := _lines(PROJECT_ROOT / path)) > budget]
    assert not over, "recipe loops over budget:\n" + "\n".join(over)
