"""Every repository path the prose names exists: docs (README.md, docs/*.md, launch/README.md), the YAML under
conf/ (comments included), the Makefile, and the docstrings and comments of the Python under core/ recipes/
verifiers/ launch/ bench/ tests/. A path is a token that starts with one of our top-level dirs, or the module of
``-m pkg.mod`` when ``pkg`` is one of our packages; it must be a file or dir, a glob matching at least one, or an
importable module file. Not checked, each by an explicit rule: run outputs and per-machine files (gitignored),
and other projects' files cited as sources (an allowlist, each entry with its project, whose name the citing file
must contain). Markdown links to local files (and their #anchors) must resolve too.

Failures list ``file:line: path``, so a moved module's stale mentions can be fixed one by one."""
from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from collections import Counter
from pathlib import Path

from core.paths import PROJECT_ROOT

TOP_DIRS = ("core", "recipes", "verifiers", "conf", "launch", "results", "tests", "bench", "docs", "constraints",
            ".ci")
# A path token: one of our top-level dirs, then path characters (globs keep their *). The look-behind leaves out
# the same words inside another path or a URL (``src/trl/tests/...``, ``hydra.cc/docs/...``).
PATH_RE = re.compile(r"(?<![\w./-])((?:" + "|".join(re.escape(d) for d in TOP_DIRS) + r")/[\w.*/-]*)")
MODULE_RE = re.compile(r"(?<![\w-])-m\s+([A-Za-z_][\w.]*)")
LINK_RE = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")  # [text](target)
TRAILING = ".,:;"  # sentence punctuation after a path, never part of one here
# A capitalised segment is a placeholder (recipe=NAME, results/runs/RECIPE/TIME_ID) when the literal path is absent.
PLACEHOLDER_RE = re.compile(r"(?<![\w])[A-Z][A-Z0-9_]+(?![\w])")

# Written by runs or per machine, never in the repository: each prefix must be gitignored (checked below).
NOT_IN_REPO = {
    "results/": "run dirs, results table and evals: written by runs (paths.results in conf/config.yaml)",
    "conf/local/": "per-machine configs (Slurm site settings), kept out of git",
}

# Other projects' files cited as sources: path (or dir prefix ending in /) -> (project named in the citing file,
# why it is cited). Listed one by one: a real path of ours that goes stale is never hidden by a pattern.
FOREIGN = {
    "docs/tulu3.md": ("open-instruct", "allenai/open-instruct's Tulu 3 write-up: the Tulu recipes' source"),
    "docs/design.md": ("firecracker", "firecracker-microvm's design doc: E2B's isolation (docs/verifiers.md)"),
    "docs/examples.md": ("submitit", "submitit's torch.distributed pattern (docs/launch.md)"),
    "docs/examples/torch_distributed.py": ("submitit", "submitit's torch.distributed example (core.launch)"),
    "recipes/dev/multinode_grpo.sbatch": ("torchtune", "torchtune's multi-node GRPO script: the sbatch pattern"),
    "recipes/accelerate_configs/": ("open-r1", "Open-R1's accelerate (ZeRO) configs its recipes launch with"),
    "recipes/Qwen2.5-1.5B-Instruct/": ("open-r1", "Open-R1's 1.5B GRPO recipes"),
    "recipes/DeepSeek-R1-Distill-Qwen-1.5B/": ("open-r1", "Open-R1's distill GRPO recipe"),
    "recipes/Qwen2.5-Coder-7B-Instruct/": ("open-r1", "Open-R1's Codeforces GRPO recipe"),
    "recipes/Qwen2.5-Math-7B/": ("open-r1", "Open-R1's SimpleRL-Reason reproduction"),
}

PY_DIRS = ("core", "recipes", "verifiers", "launch", "bench", "tests")


def _doc_files() -> list[Path]:
    return [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md")),
            *sorted((PROJECT_ROOT / "launch").glob("*.md"))]


def _text_files() -> dict[str, list[Path]]:
    """The files scanned whole, by kind (Python is scanned for docstrings and comments only)."""
    return {"docs": _doc_files(), "yaml": sorted((PROJECT_ROOT / "conf").rglob("*.yaml")),
            "Makefile": [PROJECT_ROOT / "Makefile"]}


def _python_prose(path: Path):
    """(line, text) of every comment and every string statement (module, class, function and attribute
    docstrings) of ``path``."""
    src = path.read_text()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for i, line in enumerate(node.value.value.splitlines()):
                yield node.lineno + i, line


def _prose() -> list[tuple[str, Path, int, str]]:
    """(kind, file, line, text) of everything scanned."""
    out = [(kind, f, i, line) for kind, files in _text_files().items() for f in files
           for i, line in enumerate(f.read_text().splitlines(), 1)]
    out += [("python", f, i, line) for d in PY_DIRS for f in sorted((PROJECT_ROOT / d).rglob("*.py"))
            for i, line in _python_prose(f)]
    return out


def _our_packages() -> set[str]:
    return {d for d in TOP_DIRS if (PROJECT_ROOT / d / "__init__.py").is_file()}


def _mentions():
    """(kind, file, line, "path" | "module", token) of every path and module named."""
    packages = _our_packages()
    for kind, f, i, line in _prose():
        for m in PATH_RE.finditer(line):
            yield kind, f, i, "path", m.group(1).rstrip(TRAILING)
        for m in MODULE_RE.finditer(line):
            if m.group(1).split(".")[0] in packages:
                yield kind, f, i, "module", m.group(1).rstrip(TRAILING)


def _path_exists(token: str) -> bool:
    if "*" not in token and (PROJECT_ROOT / token).exists():
        return True
    pattern = PLACEHOLDER_RE.sub("*", token)
    return "*" in pattern and any(PROJECT_ROOT.glob(pattern.rstrip("/")))


def _module_exists(module: str) -> bool:
    base = PROJECT_ROOT / module.replace(".", "/")
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _foreign(token: str) -> str | None:
    return next((key for key in FOREIGN if token == key or (key.endswith("/") and token.startswith(key))), None)


def _where(f: Path, line: int) -> str:
    return f"{f.relative_to(PROJECT_ROOT)}:{line}"


@functools.cache
def _check_mentions():
    """Sort every mention: (checked, missing, foreign_uses, foreign_misplaced, kinds)."""
    checked, missing, misplaced = [], [], []
    foreign_uses, kinds = Counter(), Counter()
    for kind, f, i, what, token in _mentions():
        if what == "module":
            ok = _module_exists(token)
        elif any(token.startswith(prefix) or token == prefix.rstrip("/") for prefix in NOT_IN_REPO):
            continue
        elif _path_exists(token):
            ok = True
        elif (key := _foreign(token)) is not None:
            foreign_uses[key] += 1
            if FOREIGN[key][0] not in f.read_text().lower():
                misplaced.append(f"{_where(f, i)}: {token} (allowed only as {FOREIGN[key][0]}'s, "
                                 f"and this file never names {FOREIGN[key][0]})")
            continue
        else:
            ok = False
        checked.append(token)
        kinds[kind] += 1
        if not ok:
            missing.append(f"{_where(f, i)}: {'python -m ' if what == 'module' else ''}{token}")
    return checked, missing, foreign_uses, misplaced, kinds


def test_every_named_path_exists():
    checked, missing, _, _, kinds = _check_mentions()
    assert not missing, f"{len(missing)} named paths do not exist:\n" + "\n".join(missing)
    # 708 mentions of 173 distinct paths and modules when written; every kind of file contributes.
    assert len(checked) >= 500 and len(set(checked)) >= 140, (len(checked), len(set(checked)))
    assert min(kinds[k] for k in ("docs", "yaml", "Makefile", "python")) >= 5, kinds


ONE_MACHINE_RE = re.compile(r"(?<![\w.~-])/(?:work|home|root|Users)/[\w.-]+")


def test_no_prose_names_a_path_of_one_machine():
    """The reference notes, data and checkouts are named as a clone sees them (``../shared/reference``), never by an
    absolute path of the machine a doc was written on (docs/recipes.md once cited the notes under ``/work``). The
    sandbox tests' deliberate escape targets are code, not prose, and are not scanned."""
    found = [f"{_where(f, i)}: {m.group(0)}" for _, f, i, line in _prose() for m in ONE_MACHINE_RE.finditer(line)]
    assert not found, "absolute paths of one machine:\n" + "\n".join(found)
    assert len(_prose()) > 5000  # every kind of file was read


def test_foreign_citations_are_named_and_used():
    """Each allowlisted foreign path is cited at least once (else the entry is stale), only in files that name its
    project, and none is a path of ours (then it would need no entry)."""
    _, _, uses, misplaced, _ = _check_mentions()
    assert not misplaced, "\n".join(misplaced)
    assert set(uses) == set(FOREIGN), f"allowlist entries never cited: {sorted(set(FOREIGN) - set(uses))}"
    assert not [key for key in FOREIGN if (PROJECT_ROOT / key).exists()]


def test_not_in_repo_prefixes_are_gitignored():
    ignored = [line.strip() for line in (PROJECT_ROOT / ".gitignore").read_text().splitlines()]
    for prefix in NOT_IN_REPO:
        assert any(line.startswith(prefix) for line in ignored), (prefix, ".gitignore ignores nothing under it")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (``-`` and ``_`` kept), spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", doc.read_text(), re.M)}


def _link_problem(doc: Path, target: str) -> str | None:
    """Why the local link ``target`` of ``doc`` does not resolve, or None."""
    path, _, anchor = target.partition("#")
    dest = (doc.parent / path).resolve() if path else doc
    if not dest.exists():
        return f"no file {path}"
    if anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
        return f"no heading with anchor #{anchor} in {path or doc.name}"
    return None


def test_markdown_links_resolve():
    local = [(doc, i, m.group(1)) for doc in _doc_files() for i, line in enumerate(doc.read_text().splitlines(), 1)
             for m in LINK_RE.finditer(line) if not re.match(r"[a-z]+:", m.group(1))]  # http(s):, mailto: aside
    broken = [f"{_where(doc, i)}: {target} ({why})" for doc, i, target in local
              if (why := _link_problem(doc, target)) is not None]
    assert not broken, "\n".join(broken)
    assert len(local) >= 10, len(local)  # 14 local links when written
