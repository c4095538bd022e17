"""``python -m recipes.eval``: the pass@k estimator against subset enumeration, avg@k, stop sequences, the
checks made before any model loads, and the CLI end to end on a tiny model (a model dir and a run dir)."""
from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
import torch

from core.config.composition import compose
from core.evaluation import schema as eval_schema
from core.evaluation.checks import EvalConfigError, prepare_eval
from core.evaluation.estimators import (mean_correct, mean_pass_at_k, pass_at_k, pass_at_k_fraction,
                                        set_metrics)
from core.evaluation.sampling import completion_texts
from core.paths import PROJECT_ROOT
from core.rollout.batch import assemble, sampling_seed
from tests.helpers import CLI_ENV, TINY, results

eval_schema.store()


def _subsets_pass(n: int, c: int, k: int) -> Fraction:
    """The share of the k-subsets of n samples (the first c correct) that hold a correct one, by enumeration."""
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(i < c for i in s) for s in subsets), len(subsets))


def _chen_product(n: int, c: int, k: int) -> float:
    """Chen et al. 2021 Figure 3, the numpy-style product form, as an independent float formula."""
    return 1.0 if n - c < k else 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def test_pass_at_k_equals_subset_enumeration():
    cases = [(n, c, k) for n in range(1, 9) for c in range(n + 1) for k in range(1, n + 1)]
    for n, c, k in cases:
        exact = _subsets_pass(n, c, k)
        assert pass_at_k_fraction(n, c, k) == exact, (n, c, k)
        assert pass_at_k(n, c, k) == float(exact)  # one rounding of the exact value
        assert math.isclose(_chen_product(n, c, k), float(exact), rel_tol=1e-12, abs_tol=1e-15), (n, c, k)
    assert len(cases) == sum((n + 1) * n for n in range(1, 9)) == 240  # every (n, c, k) with n <= 8


def test_large_n_is_exact_where_binomials_overflow_floats():
    n, c, k = 2000, 3, 1000  # C(2000, 1000) has 600 digits
    assert math.comb(n, k) > 10 ** 308
    assert pass_at_k_fraction(n, c, k) == 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert math.isclose(pass_at_k(n, c, k), _chen_product(n, c, k), rel_tol=1e-9)


def test_avg_at_n_is_mean_correctness_and_pass_at_1():
    counts = [(4, 0), (4, 1), (4, 3), (4, 4), (4, 2)]
    m = set_metrics(counts, greedy=False, samples=4, pass_k=[1, 2, 4])
    expected_avg = Fraction(0 + 1 + 3 + 4 + 2, 4 * 5)
    assert m["avg@4"] == float(expected_avg) == m["pass@1"]
    assert m["pass@4"] == float(Fraction(4, 5))  # any correct sample among all four: 4 of the 5 problems
    assert m["pass@2"] == float(sum(_subsets_pass(4, c, 2) for _, c in counts) / 5)
    assert list(m) == ["avg@4", "pass@1", "pass@2", "pass@4"]
    greedy = [(1, 1), (1, 0), (1, 1)]  # greedy pass@1 is the n = 1 estimate of the same outcomes
    assert set_metrics(greedy, greedy=True, samples=1, pass_k=[]) == {"pass@1": float(Fraction(2, 3))}
    assert mean_pass_at_k(greedy, 1) == mean_correct(greedy) == float(Fraction(2, 3))
    assert math.isnan(mean_correct([])) and math.isnan(mean_pass_at_k([], 1))


@pytest.mark.parametrize("n, c, k", [(4, 5, 1), (4, -1, 1), (4, 2, 5), (4, 2, 0)])
def test_pass_at_k_refuses_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass@"):
        pass_at_k_fraction(n, c, k)


def test_completions_end_at_eos_stop_tokens_and_stop_strings():
    from core.models.loading import load_tokenizer, model_dir
    from core.config import schema

    tok = load_tokenizer(model_dir(schema.node(schema.ModelConfig, tiny=TINY)))
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    eos, x = tok.eos_token_id, enc("x")[0]
    rows = [enc("12") + [eos] + enc("99"), enc("ab") + [x] + enc("cd"), enc("abuserQ"), enc("abcdef")]
    width = max(map(len, rows))
    resp = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows])  # [4, R]
    prompt = torch.tensor([enc("p")] * 4)  # [4, 1]
    roll = assemble(prompt, torch.ones_like(prompt), resp, [eos], tok.pad_token_id, torch.zeros(resp.shape))
    texts, finish = completion_texts(tok, roll, {eos, x}, ["user", "_end"])
    assert texts == ["12", "ab", "ab", "abcdef"]
    assert finish == ["stop", "stop", "stop", "length"]


def _eval_cfg(*overrides):
    return compose(["model.name_or_path=" + str(_tiny_dir()), *overrides], with_hydra=True, config_name="eval")


def _tiny_dir() -> Path:
    from core.config import schema
    from core.models.loading import model_dir

    return Path(model_dir(schema.node(schema.ModelConfig, tiny=TINY)))


BAD = [
    (["eval.sets=[math5000]"], "eval.sets: unknown set 'math5000'; known: aime24, amc23, gsm8k"),
    (["eval=open_r1_math500", "eval.pass_k=[1,8]"], "eval.pass_k: k=8 with eval.samples=4"),
    (["eval.samples=4"], "eval.samples=4 with rollout.greedy=true"),
    (["eval.pass_k=[1]"], "pass@k needs sampled completions"),
    (["model.name_or_path=/tmp"], "model.name_or_path=/tmp: the directory has no config.json"),
    (["model.name_or_path=null"], "nothing to evaluate: give run_dir="),
    (["run_dir=/tmp"], "give one of them"),
    (["data.path=x.jsonl"], "data.path='x.jsonl': recipes.eval reads each set's rows"),
    (["++sets.aime24.verifier=nope", "eval.sets=[aime24]"], "sets.aime24.verifier='nope': unknown verifier"),
    (["++sets.aime24.gold=nope", "eval.sets=[aime24]"], "sets.aime24.gold='nope': expected one of"),
    (["+sets.mine.source=hub", "eval.sets=[mine]"], "sets.mine.source=hub needs sets.mine.hub_name"),
    (["+sets.mine.colums=[a]", "+sets.mine.path=a.jsonl", "eval.sets=[mine]"], "did you mean sets.mine.columns"),
    (["eval.sets=[]"], "eval.sets is empty"),
    (["eval.sets=[gsm8k,gsm8k]"], "eval.sets names gsm8k 2 times"),
    (["rollout=vllm_server"], "rollout.engine=vllm_server: recipes.eval samples with one of"),
]


@pytest.mark.parametrize("overrides, message", BAD, ids=[b[1][:40] for b in BAD])
def test_bad_inputs_are_refused_with_the_key_named(overrides, message):
    with pytest.raises(EvalConfigError) as e:
        prepare_eval(_eval_cfg(*overrides))
    assert message in str(e.value)


def test_every_preset_composes_and_checks(tmp_path):
    presets = sorted(p.stem for p in (PROJECT_ROOT / "conf" / "eval").glob("*.yaml"))
    assert {"greedy", "simplerl_zoo_math500_greedy", "simplerl_zoo_aime24_avg32", "simplerl_zoo_paper",
            "open_r1_math500", "open_r1_aime24"} <= set(presets) and len(presets) == 6
    for name in presets:
        cfg = prepare_eval(_eval_cfg(f"eval={name}", f"paths.results_dir={tmp_path}")).config
        assert cfg.preset == name and cfg.eval.sets and "{prompt}" in cfg.data.template


def test_every_shared_set_loads_with_its_gold(shared_data, tmp_path):
    """Each catalog set read through the project's loader as the `greedy` preset formats it: the row counts of
    ../shared/data/*/SOURCE.md, a gold for every math row, the code rows' test columns."""
    from core.evaluation.checks import set_node
    from core.evaluation.sets import load_set

    cfg = _eval_cfg(f"paths.data_dir={shared_data}", f"paths.results_dir={tmp_path}")
    sizes = {"math500": 500, "math500_simplerl": 500, "gsm8k": 1319, "aime24": 30, "amc23": 40, "minerva_math": 272,
             "olympiadbench": 675, "humaneval": 164, "mbpp": 500}
    assert sorted(cfg.sets) == sorted(sizes)
    for name, size in sizes.items():
        s = load_set(name, set_node(cfg, name), cfg.data, "unused", None)
        assert len(s.rows) == size, name
        assert all(isinstance(r["prompt"], str) and r["prompt"].strip() for r in s.rows), name
        if s.cfg.answer_key:
            assert all(str(r["answer"]).strip() and "####" not in str(r["answer"]) for r in s.rows), name
    gsm8k = load_set("gsm8k", set_node(cfg, "gsm8k"), cfg.data, "math", 3)
    assert [r["answer"] for r in gsm8k.rows] == ["18", "3", "70000"]
    mbpp = load_set("mbpp", set_node(cfg, "mbpp"), cfg.data, "code_mbpp", 1)
    assert mbpp.rows[0]["task_id"] == 11 and mbpp.rows[0]["test_list"][0] in mbpp.rows[0]["prompt"]
    assert set(mbpp.verifier_columns(2)) == {"test_list", "test_setup_code"}


def _cli(tmp: Path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "recipes.eval", f"paths.results_dir={tmp}/results", *overrides]
    return subprocess.run(cmd, cwd=PROJECT_ROOT, env=CLI_ENV, capture_output=True, text=True, timeout=300)


def _samples(eval_dir: str) -> list[dict]:
    return [json.loads(line) for line in (Path(eval_dir) / "samples.jsonl").read_text().splitlines()]


def test_cli_greedy_on_math500_rows(tmp_path, shared_data):
    proc = _cli(tmp_path, f"model.name_or_path={_tiny_dir()}", "eval.limit=3", "rollout.max_new_tokens=6",
                f"paths.data_dir={shared_data}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = results(tmp_path)
    assert [(r["kind"], r["preset"], r["set"], r["metric"], r["problems"]) for r in rows] == \
        [("eval", "greedy", "math500", "pass@1", 3)]
    records = _samples(rows[0]["eval_dir"])
    assert len(records) == 3 and all(len(r["completions"]) == len(r["rewards"]) == 1 for r in records)
    assert rows[0]["value"] == float(Fraction(sum(r["correct"] for r in records), 3))
    assert (Path(rows[0]["eval_dir"]) / "config.yaml").exists()


def _run_dir(tmp: Path) -> Path:
    """A finished training run's dir as recipes/rl.py ``save`` leaves it: the resolved config, the model in
    ``model/``, ``summary.json``, and its row in the results table."""
    import shutil

    from core.config.resume import write_config
    from core.reporting.results import append_row, write_summary

    run = tmp / "run"
    cfg = compose(["recipe=tiny_math_grpo", "seed=3"], with_hydra=True)
    write_config(run, cfg)
    shutil.copytree(_tiny_dir(), run / "model")
    row = {"recipe": "tiny_math_grpo", "run_dir": str(run), "seed": 3, "steps": 1, "eval_before": 0.0,
           "eval_after": 0.25}
    write_summary(run, row)
    append_row(tmp / "results", row)
    return run


def test_cli_evaluates_a_run_dir_with_sampled_pass_at_k(tmp_path):
    run = _run_dir(tmp_path)
    data = tmp_path / "set.jsonl"
    data.write_text("".join(json.dumps({"q": f"{a}+{a}=", "a": str(2 * a)}) + "\n" for a in range(3)))
    tiny_set = f"+sets.tiny={{path:{data},prompt_key:q,answer_key:a,verifier:'tests.stub_rewards:first_char_even'}}"
    proc = _cli(tmp_path, f"run_dir={run}", "eval=open_r1_aime24", tiny_set, "eval.sets=[tiny]",
                "eval.samples=4", "eval.pass_k=[1,2,4]", "rollout.max_new_tokens=4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [r for r in results(tmp_path) if r.get("kind") == "eval"]
    assert [r["metric"] for r in rows] == ["avg@4", "pass@1", "pass@2", "pass@4"]
    assert {(r["recipe"], r["run_dir"], r["seed"], r["samples"]) for r in rows} == {("tiny_math_grpo", str(run), 3, 4)}
    records = _samples(rows[0]["eval_dir"])
    assert len(records) == 3 and all(len(r["rewards"]) == 4 for r in records)
    counts = [(4, sum(x == 1.0 for x in r["rewards"])) for r in records]
    assert [r["correct"] for r in records] == [c for _, c in counts]
    value = {r["metric"]: r["value"] for r in rows}
    assert value["avg@4"] == value["pass@1"] == float(Fraction(sum(c for _, c in counts), 12))
    for k in (2, 4):
        assert value[f"pass@{k}"] == float(sum(_subsets_pass(n, c, k) for n, c in counts) / 3)
    from core.reporting.comparison import eval_results, group

    (g,) = group(results(tmp_path))  # the eval rows with their run's training row, one group
    assert [r["seed"] for r in g["runs"]] == [3] and g["runs"][0]["eval_after"] == 0.25
    pass4 = [e for e in eval_results(g) if e["result"] == "pass@4"]
    assert [(e["preset"], e["set"], e["problems"], e["n"], e["mean"]) for e in pass4] == \
        [("open_r1_aime24", "tiny", 3, 1, value["pass@4"])]


def test_cli_refuses_bad_input_before_loading_a_model(tmp_path):
    proc = _cli(tmp_path, f"model.name_or_path={_tiny_dir()}", "eval.sets=[math5000]")
    assert proc.returncode == 1
    assert "EvalConfigError" in proc.stderr and "unknown set 'math5000'" in proc.stderr
    assert "Traceback" not in proc.stderr and not results(tmp_path)


VLLM_SCRIPT = """
import json, sys
from core.config import schema
from core.evaluation.sampling import add_stop_tokens, generate
from core.models.loading import load_tokenizer
from core.rollout import Sampling
from core.rollout.vllm import VLLMRollout
from recipes.eval import POLICIES
from tests import vllm_double

path = sys.argv[1]
tok = load_tokenizer(path)
policy = POLICIES.get("vllm")(path, None, None)
cfg = schema.node(schema.RolloutConfig, {"engine": "vllm", "max_new_tokens": 5, "vllm": {}})
engine = VLLMRollout(policy, tok, cfg, vllm=vllm_double)
prompts = [tok("1+1", add_special_tokens=False)["input_ids"], tok("5+5", add_special_tokens=False)["input_ids"]]
stop_id = tok.convert_tokens_to_ids("4")  # the double counts up from the prompt's last token: 2, 3, 4 after "1"
ends = set(add_stop_tokens(engine, [stop_id, 10 ** 9], len(tok)))
# greedy (the double counts up); one problem per call: the rows are numbered across the calls
texts, finish = generate(engine, tok, prompts, 2, Sampling(5, 0.0, seed=11), 2, ends, [])
llm = engine.llm
print(json.dumps({"model": llm.kwargs["model"], "loads": len(llm.loads), "prompts": llm.prompts, "seeds": llm.seeds,
                  "texts": texts, "finish": finish, "ends": sorted(ends), "stop_id": stop_id, "ids": prompts,
                  "eos": tok.eos_token_id}))
"""


def test_vllm_engine_loads_the_model_by_path_and_stops_at_stop_tokens():
    """rollout=vllm on the recording double (tests/vllm_double.py) in a process of its own (the engine starts a
    gloo process group): vLLM gets the model's path and no weights, each prompt repeated per sample, problem-major,
    each request seeded by the batch seed and its row across the generate calls, and a stop token ends a completion
    as vLLM's stop_token_ids do; an id beyond the vocabulary is left out."""
    proc = subprocess.run([sys.executable, "-c", VLLM_SCRIPT, str(_tiny_dir())], cwd=PROJECT_ROOT, env=CLI_ENV,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["model"] == str(_tiny_dir()) and out["loads"] == 0
    a, b = out["ids"]
    assert out["prompts"] == [[a, a], [b, b]]
    assert out["seeds"] == [[sampling_seed(11, 0), sampling_seed(11, 1)], [sampling_seed(11, 2), sampling_seed(11, 3)]]
    assert out["ends"] == sorted({out["eos"], out["stop_id"]})
    assert out["texts"] == ["23", "23", "6789a", "6789a"]  # the second counts on (string.printable order) to 5
    assert out["finish"] == ["stop", "stop", "length", "length"]


def test_a_run_dirs_best_policy_is_evaluated_when_asked_and_refused_when_absent(tmp_path):
    """``run_model=best`` reads ``best/`` (``train.keep_best``) instead of ``model/``."""
    import shutil

    run = _run_dir(tmp_path)
    with pytest.raises(EvalConfigError, match=r"run_model=best: no best/ \(the run saves it with train.keep_best"):
        prepare_eval(_eval_cfg(f"run_dir={run}", "model.name_or_path=null", "run_model=best"))
    shutil.copytree(run / "model", run / "best")
    prepared = prepare_eval(_eval_cfg(f"run_dir={run}", "model.name_or_path=null", "run_model=best"))
    assert prepared.plan.path == str(run.resolve() / "best")
