"""One plug-in mechanism (core/registry.py, docs/extending.md): every registry in core/, verifiers/ and recipes/ is found
and each of its entries is picked by some config value; declared entries are imported only when asked for; a config
is scaled and checked with no loop imported (the rm recipes at scale=tiny); core imports no recipe and reaches the
verifiers only through their registries."""
from __future__ import annotations

import ast
import dataclasses
import fnmatch
import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from core.paths import CONF_DIR, PROJECT_ROOT
from tests.helpers import CLI_ENV

# Each registry -> the config keys whose values name its entries (a dotted path; * for any one part).
SELECTED_BY = {
    "core.algorithms.advantage:ADVANTAGES": ["advantage.name"],
    "core.algorithms.advantage:WHITENING": ["advantage.whiten"],
    "core.algorithms.kl_control:KL_CONTROLLERS": ["kl.controller"],
    "core.algorithms.loss:POLICY_LOSSES": ["loss.name"],
    "core.algorithms.loss:IS_CORRECTIONS": ["loss.is_correction.mode"],
    "core.algorithms.loss:KL_ESTIMATORS": ["kl.estimator"],
    "core.algorithms.loss:AGGREGATIONS": ["loss.aggregation"],
    "core.config.layout:MODES": ["layout.mode"],
    "core.config.scale:SHRINKERS": ["loop"],
    "core.config.validate:BATCH_SPLITS": ["loop"],
    "core.config.validate:LOOP_CHECKS": ["loop"],
    "core.config.plan:PLANS": ["loop"],
    "core.data.preferences:PAIR_SOURCES": ["data.source", "data.eval_source", "data.tiny.source"],
    "core.data.prompts:SOURCES": ["data.source", "data.tiny.source"],
    "core.evaluation.sets:QUESTIONS": ["sets.*.question"],
    "core.models.reward_model:HEAD_INITS": ["train.head_init"],
    "core.planning.phases:PHASE_TIMES": ["loop"],
    "core.reporting.source_views:SOURCE_VIEWS": ["source.name"],
    "core.rollout:ROLLOUT_ENGINES": ["rollout.engine"],
    "core.rollout.texts:REWARD_TEXTS": ["verifier.text"],
    "core.training.optim:SCHEDULES": ["optim.scheduler.name"],
    "recipes:LOOPS": ["loop"],
    "recipes.eval:POLICIES": ["rollout.engine"],
    "recipes.explain:EXPLANATIONS": ["loop"],
    "recipes.probe:PHASES": ["loop"],
    "verifiers:GOLDS": ["sets.*.gold"],
    "verifiers:VERIFIERS": ["verifier.name", "verifier.eval_name", "verifier.kwargs.terms.*.name",
                            "verifier.tiny.kwargs.terms.*.name", "verifier.kwargs.routes.*",
                            "verifier.kwargs.routes.*.name", "sets.*.verifier", "eval.verifiers.*"],
}
# Entries no YAML under conf/ and no schema default names: options a user sets on the command line, each documented
# and exercised by the tests named.
COMMAND_LINE_ONLY = {
    "core.algorithms.kl_control:KL_CONTROLLERS": {"adaptive"},  # docs/algorithms.md; tests/core/test_shaping_value_kl.py
    # the importance corrections of docs/algorithms.md ("Off-policy correction"); tests/core/test_loss.py
    "core.algorithms.loss:IS_CORRECTIONS": {"sequence_geo_mask", "sequence_mask", "sequence_truncate", "token_mask",
                                            "token_truncate"},
    # TRL dapo / OpenRLHF >= 0.10.4, and veRL's or OpenRLHF's GSPO (docs/algorithms.md table); tests/core/test_loss.py
    "core.algorithms.loss:AGGREGATIONS": {"seq_mean_token_mean_nonempty", "token_mean_global"},
    # the OpenRLHF recipes train reward models, whose lines name no source's flags; tests/test_explain.py
    "core.reporting.source_views:SOURCE_VIEWS": {"openrlhf"},
    # Open-Instruct's layer_init as its script means it; the recipe runs what its launcher does (docs/fidelity.md
    # "Found"); docs/reward_models.md; tests/rm/test_reward_model.py
    "core.models.reward_model:HEAD_INITS": {"inv_sqrt_hidden"},
    # docs/verifiers.md; tests/verifiers/test_cpp.py, test_code.py, test_gsm8k_compose.py, test_format.py
    "verifiers:VERIFIERS": {"code_cpp", "code_mbpp_fraction", "cosine", "gsm8k_numeric", "reasoning_steps",
                            "repetition_penalty", "soft_overlong_punishment"},
}
SCHEMAS = ("core.config.schema", "core.config.schema_rm", "core.evaluation.schema")


def _module(path: Path) -> str:
    return ".".join(path.relative_to(PROJECT_ROOT).with_suffix("").parts).removesuffix(".__init__")


def registries() -> dict:
    """Every module-level ``NAME = Registry(...)`` (annotated or not) in core/, verifiers/ and recipes/."""
    found = {}
    for pkg in ("core", "verifiers", "recipes"):
        for path in sorted((PROJECT_ROOT / pkg).rglob("*.py")):
            for node in ast.parse(path.read_text()).body:
                value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
                if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "Registry":
                    name = (node.targets[0] if isinstance(node, ast.Assign) else node.target).id
                    found[f"{_module(path)}:{name}"] = getattr(importlib.import_module(_module(path)), name)
    return found


def schema_bindings() -> dict[str, list[tuple[str, object]]]:
    """registry (as :func:`registries` names it) -> [(Schema.field, default)] for each schema field checked against
    it (core/config/ranges.py ``registered``); names outside a Registry (tuples of names) are left out."""
    by_id, bound = {id(r): k for k, r in registries().items()}, {}
    for m in SCHEMAS:
        for cls in vars(importlib.import_module(m)).values():
            if dataclasses.is_dataclass(cls) and cls.__module__ == m:
                for f in dataclasses.fields(cls):
                    where = getattr(f.metadata.get("check"), "registry", "")
                    module, _, attr = where.partition(":")
                    reg = by_id.get(id(getattr(importlib.import_module(module), attr))) if where else None
                    if reg:
                        bound.setdefault(reg, []).append((f"{cls.__name__}.{f.name}", f.default))
    return bound


def _leaves(node, path: str):
    if isinstance(node, dict):
        for k, v in node.items():
            if k != "defaults":  # group options, not values
                yield from _leaves(v, f"{path}.{k}" if path else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _leaves(v, f"{path}.{i}")
    else:
        yield path, node


def yaml_values() -> list[tuple[str, object]]:
    """(full dotted key, value) of every leaf of every YAML under conf/: a group file's keys below its group (the
    eval catalog is mounted at ``sets``, conf/eval.yaml), a ``# @package _global_`` file's at the root."""
    out = []
    for path in sorted(CONF_DIR.rglob("*.yaml")):
        text, group = path.read_text(), path.parent.relative_to(CONF_DIR).as_posix()
        package = "" if text.startswith("# @package _global_") or group == "." else \
            {"eval/catalog": "sets"}.get(group, group.replace("/", "."))
        out += list(_leaves(yaml.safe_load(text) or {}, package))
    return out


def test_every_registry_is_found_and_picked_by_a_config_key():
    found = registries()
    assert len(found) == 27 and sum(len(r.names()) for r in found.values()) == 99
    assert sorted(found) == sorted(SELECTED_BY)
    bound = schema_bindings()
    assert len(bound) == 16 and sum(len(f) for f in bound.values()) == 23
    for reg, fields in bound.items():  # the table agrees with the schema's checks
        assert {f.split(".")[1] for f, _ in fields} <= {k.split(".")[-1] for k in SELECTED_BY[reg]}, reg


def test_every_entry_is_named_by_a_config_value_or_is_a_command_line_option():
    values, defaults = yaml_values(), schema_bindings()
    unreached, reached = {}, 0
    for reg, registry in registries().items():
        keys = SELECTED_BY[reg]
        named = {v for p, v in values if any(fnmatch.fnmatchcase(p, k) for k in keys)}
        named |= {d for _, d in defaults.get(reg, [])}
        missing = set(registry.names()) - named
        reached += len(registry.names()) - len(missing)
        if missing:
            unreached[reg] = missing
    assert unreached == COMMAND_LINE_ONLY
    assert reached == 82 and sum(map(len, COMMAND_LINE_ONLY.values())) == 17


def test_every_entry_resolves_to_a_callable():
    count = 0
    for reg, registry in registries().items():
        for name in registry.names():
            assert callable(registry.get(name)), f"{reg} {name}"
            count += 1
    assert count == 99


LAZY = """
import sys
from core.rollout import ROLLOUT_ENGINES
from recipes import LOOPS
from verifiers import GOLDS, VERIFIERS
from core.config.composition import compose

names = [*ROLLOUT_ENGINES.names(), *LOOPS.names(), *VERIFIERS.names(), *GOLDS.names()]
cfg = compose(["rollout=vllm"])
problems = ROLLOUT_ENGINES.problems("vllm", cfg, packages=False) + ROLLOUT_ENGINES.problems("vllm_server", cfg)
loaded = sorted(m for m in sys.modules if m.startswith(("core.rollout.", "recipes.", "verifiers.")))
assert loaded == ["core.rollout.batch"], loaded
assert not problems, problems
assert VERIFIERS.problems("math", {"nope": 1}, "verifier.name", "verifier.kwargs") == []  # math takes **columns
assert "verifiers.math" in sys.modules  # a verifier's check reads its signature: verifiers are CPU-only
import verifiers.gsm8k, core.rollout.hf, recipes.rm
assert VERIFIERS.get("gsm8k") is verifiers.gsm8k.gsm8k_reward
assert ROLLOUT_ENGINES.get("hf") is core.rollout.hf.HFGenerateRollout and LOOPS.get("rm") is recipes.rm.main
print(len(names))
"""


def test_listing_and_checking_import_no_entry_and_get_imports_it():
    proc = subprocess.run([sys.executable, "-c", LAZY], cwd=PROJECT_ROOT, env=CLI_ENV, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["32"]  # 3 engines, 2 loops, 23 verifiers, 4 gold extractors


@pytest.mark.parametrize("command", [["recipes.run", "--cfg", "job"], ["core.launch"]], ids=["cfg-job", "launch"])
def test_the_rm_recipe_at_tiny_scale_needs_no_loop_imported(command):
    """The rm shrinker lives in core/config/scale.py: scaling never depends on recipes/rm.py being imported."""
    proc = subprocess.run([sys.executable, "-m", *command, "recipe=tiny_rm", "scale=tiny"], cwd=PROJECT_ROOT,
                          env=CLI_ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    if command[0] == "recipes.run":
        assert proc.stdout == (Path(__file__).parent / "golden" / "cfg_job" / "tiny_rm__tiny.yaml").read_text()
    else:
        assert "NPROC_PER_NODE=1\n" in proc.stdout and "RUN_DIR=" in proc.stdout


def _imports_and_module_strings(path: Path):
    """(line, module) for every import, and for every string argument of a call that reads as a module path
    (``pkg.mod`` or ``pkg.mod:attr``: ``registered(...)``, ``import_module(...)``, ``declare(...)``)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name, None) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.lineno, node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Call):
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and \
                        arg.value.replace(".", "").replace(":", "").replace("_", "").isalnum():
                    yield node.lineno, arg.value.split(":")[0], "string"


def _core_files() -> list[Path]:
    files = sorted((PROJECT_ROOT / "core").rglob("*.py"))
    assert len(files) >= 50  # every module of core, not a few
    return files


def test_core_imports_no_recipe():
    hits = [f"{p.relative_to(PROJECT_ROOT)}:{line} {mod}" for p in _core_files()
            for line, mod, _ in _imports_and_module_strings(p) if mod == "recipes" or mod.startswith("recipes.")]
    assert hits == []


def test_core_reaches_the_verifiers_only_through_their_registries():
    """verifiers/__init__.py: ``from verifiers import VERIFIERS, GOLDS`` is the whole of core's use of the package."""
    uses = {}
    for p in _core_files():
        for line, mod, names in _imports_and_module_strings(p):
            if mod == "verifiers" or mod.startswith("verifiers."):
                uses[f"{p.relative_to(PROJECT_ROOT)}:{line}"] = (mod, names)
    other = [k for k, (mod, names) in uses.items()
             if mod != "verifiers" or not isinstance(names, list) or not set(names) <= {"VERIFIERS", "GOLDS"}]
    assert other == []
    assert sorted(k.split(":")[0] for k in uses) == ["core/config/validate.py", "core/evaluation/checks.py",
                                                      "core/evaluation/sets.py"]
