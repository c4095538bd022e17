"""Every registered name is counted and exercised by name somewhere in tests/core; the registry type
(core/registry.py): declared entries, checks, misses, duplicates, ``module:function`` names."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from core.algorithms.advantage import ADVANTAGES, WHITENING
from core.algorithms.kl_control import KL_CONTROLLERS
from core.algorithms.loss import AGGREGATIONS, IS_CORRECTIONS, KL_ESTIMATORS, POLICY_LOSSES
from core.registry import Registry
from tests import stub_rewards
from verifiers import VERIFIERS

REGISTRIES = {"advantage": ADVANTAGES, "whitening": WHITENING, "policy loss": POLICY_LOSSES,
              "is correction": IS_CORRECTIONS, "kl estimator": KL_ESTIMATORS, "aggregation": AGGREGATIONS,
              "kl controller": KL_CONTROLLERS}


def test_registered_name_count():
    counts = {k: len(r.names()) for k, r in REGISTRIES.items()}
    assert counts == {"advantage": 6, "whitening": 3, "policy loss": 2, "is correction": 6, "kl estimator": 3,
                      "aggregation": 5, "kl controller": 2}
    assert sum(counts.values()) == 27


def test_every_registered_name_is_used_by_a_test():
    here = Path(__file__).parent
    text = "\n".join(p.read_text() for p in here.glob("test_*.py") if p.name != Path(__file__).name)
    quoted = set(re.findall(r"[\"']([a-z0-9_]+)[\"']", text)) | set(re.findall(r"=([a-z0-9_]+)[\"' ]", text))
    missing = [f"{k}:{n}" for k, r in REGISTRIES.items() for n in r.names() if n not in quoted]
    assert not missing, f"registered but never named in a test: {missing}"


def test_a_declared_entry_is_listed_checked_and_imported_on_its_first_get():
    calls = []
    reg = Registry("thing", check=lambda name, cfg: calls.append(("all", name, cfg)) or [f"{name}: all"])
    reg.declare("exact", "tests.stub_rewards:exact", check=lambda name, cfg: [f"{name}: own {cfg}"], needs=2)

    @reg.register("eager")
    def eager():
        return 1

    assert reg.names() == ["eager", "exact"] and "exact" in reg and "nope" not in reg
    assert reg.meta("exact") == {"needs": 2} and reg.meta("eager") == {}
    assert reg.problems("exact", 7) == ["exact: all", "exact: own 7"]  # the registry's check, then the entry's
    assert reg.problems("eager", 8) == ["eager: all"] and reg.problems("nope", 9) == ["nope: all"]
    assert calls == [("all", "exact", 7), ("all", "eager", 8), ("all", "nope", 9)]
    assert reg.get("exact") is stub_rewards.exact and reg.get("eager") is eager


def test_registry_misses_duplicates_and_bad_targets_are_refused_with_the_names():
    reg = Registry("rollout.engine")
    reg.declare("hf", "core.rollout.hf:HFGenerateRollout")
    reg.declare("hf", "core.rollout.hf:HFGenerateRollout")  # the same declaration again is no conflict
    with pytest.raises(KeyError) as miss:
        reg.get("nope")
    assert miss.value.args[0] == "unknown rollout.engine 'nope'; registered: hf"
    with pytest.raises(ValueError, match="rollout.engine 'hf' is already registered"):
        reg.register("hf")(lambda: None)
    with pytest.raises(ValueError, match="target 'core.rollout.hf' is not 'package.module:attr'"):
        reg.declare("x", "core.rollout.hf")
    with pytest.raises(KeyError, match="registered: hf"):  # a path is a name only where the registry allows it
        reg.get("tests.stub_rewards:exact")


def test_a_path_registry_imports_module_function_names_and_says_why_one_fails():
    assert VERIFIERS.get("tests.stub_rewards:exact") is stub_rewards.exact
    with pytest.raises(KeyError, match=r"verifier 'tests.stub_rewards:nope': cannot import 'nope'"):
        VERIFIERS.get("tests.stub_rewards:nope")
    with pytest.raises(KeyError, match=r"unknown verifier 'maths'; registered: .* \(or module.path:function, or "
                                       r"path/to/file.py:function\)"):
        VERIFIERS.get("maths")
    with pytest.raises(KeyError, match=r"'my_rewards.mine:score': no module 'my_rewards' on the import path; give the "
                                       r"file instead \(path/to/mine.py:score"):
        VERIFIERS.get("my_rewards.mine:score")
    assert VERIFIERS.problems("tests.stub_rewards:exact", {"strict": True}, "verifier.name", "verifier.kwargs") == [
        "verifier.kwargs.strict: verifier tests.stub_rewards:exact takes no 'strict' (it takes completions, answer)"]


def test_a_verifier_is_loaded_from_a_file_path_without_pythonpath(tmp_path):
    """``path/to/file.py:function`` (veRL's custom_reward_function.path): loaded from the file once, relative paths
    from the project root; a missing file or function is a KeyError naming the spec."""
    from core.paths import PROJECT_ROOT

    (tmp_path / "my_reward.py").write_text("def score(completions, answer, **kw):\n"
                                          "    return [float(c.strip() == a) for c, a in zip(completions, answer)]\n")
    spec = f"{tmp_path}/my_reward.py:score"
    fn = VERIFIERS.get(spec)
    assert fn(["4", "5"], answer=["4", "4"]) == [1.0, 0.0] and VERIFIERS.get(spec) is fn
    relative = f"{os.path.relpath(tmp_path, PROJECT_ROOT)}/my_reward.py:score"
    assert VERIFIERS.get(relative) is fn
    with pytest.raises(KeyError, match=r"my_reward.py:nope': cannot import 'nope'"):
        VERIFIERS.get(f"{tmp_path}/my_reward.py:nope")
    with pytest.raises(KeyError, match=r"absent.py:score': cannot import 'score' .*no such file"):
        VERIFIERS.get(f"{tmp_path}/absent.py:score")
