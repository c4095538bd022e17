"""``python -m recipes.compare``: one value per (config, seed) and per evaluation settings, the scale and the
evaluation's settings shown, only the keys that tell runs apart, numeric CSV, and report figures (one loop kind
each, seed bands, labelled axes, the held-out curve). Synthetic run dirs here; the real CLI end to end last."""
from __future__ import annotations

import csv
import json
import sys

import pytest
import yaml

from core.errors import InputError
from recipes.compare import main
from tests.helpers import FAST, results, run_cli


def _nest(flat: dict) -> dict:
    out = {}
    for key, v in flat.items():
        *head, last = key.split(".")
        node = out
        for h in head:
            node = node.setdefault(h, {})
        node[last] = v
    return out


def _run(tmp, name, *, recipe="r", loop="rl", scale="tiny", seed=0, config=None, overrides=(), sweep=None,
         metrics=(), **fields) -> dict:
    """A finished run's dir (config.yaml, Hydra's hydra.yaml for a multirun job, metrics.jsonl) and its row."""
    run_dir = tmp / sweep / name if sweep else tmp / name
    (run_dir / ".hydra").mkdir(parents=True)
    cfg = _nest({"loop": loop, "seed": seed, "recipe_name": recipe, "scale.name": scale, **(config or {})})
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))
    hydra = {"mode": "MULTIRUN" if sweep else "RUN", "runtime": {"choices": {"recipe": recipe}}}
    (run_dir / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": hydra}))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return {"recipe": recipe, "run_dir": str(run_dir), "seed": seed, "scale": scale,
            "overrides": [*overrides, f"seed={seed}"], **fields}


def _eval(run: dict, value: float, problems: int, tokens: int, name: str) -> dict:
    return {"kind": "eval", "recipe": run["recipe"], "run_dir": run["run_dir"], "model": run["run_dir"] + "/model",
            "preset": "greedy", "set": "math500", "metric": "pass@1", "value": value, "problems": problems,
            "samples": 1, "greedy": True, "temperature": None, "top_p": None, "max_new_tokens": tokens,
            "verifier": "math", "seed": run["seed"], "eval_seed": 0, "eval_dir": f"/evals/{name}"}


def _table(tmp, rows: list[dict]) -> str:
    (tmp / "results").mkdir(exist_ok=True)
    (tmp / "results" / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(tmp / "results")


def _section(out: str, title: str) -> list[dict]:
    """The rows of the markdown table under ``title`` as dicts."""
    after = out.split(title, 1)[1].splitlines()
    start = next(i for i, line in enumerate(after) if line.startswith("|"))
    lines = []
    for line in after[start:]:
        if not line.startswith("|"):
            break
        lines.append(line)
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(head, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]


def test_two_evaluations_of_one_run_are_two_rows_not_a_seed_spread(tmp_path):
    run = _run(tmp_path, "a", eval_after=0.5)
    rows = [run, _eval(run, 0.25, 20, 64, "e1"), _eval(run, 0.0, 5, 8, "e2"), _eval(run, 0.75, 20, 64, "e3")]
    out = main(["--results-dir", _table(tmp_path, rows)])
    evals = _section(out, "evaluations")
    assert sorted((e["problems"], e["max tokens"], e["sampling"], e["n"], e["value"]) for e in evals) == \
        [("20", "64", "greedy", "1", "0.75"), ("5", "8", "greedy", "1", "0")]  # e3 re-measures e1: the latest counts
    assert "±" not in out


def test_a_rerun_with_the_same_seed_replaces_the_earlier_run(tmp_path):
    a = _run(tmp_path, "a", seed=0, eval_after=0.1)
    rows = [a, _run(tmp_path, "b", seed=0, eval_after=0.3), _run(tmp_path, "c", seed=1, eval_after=0.5)]
    out = main(["--results-dir", _table(tmp_path, rows), "--csv", str(tmp_path / "cmp.csv")])
    (row,) = _section(out, "RL runs")
    assert (row["scale"], row["n"], row["seeds"], row["eval_after"]) == ("tiny", "2", "0 1", "0.4 ± 0.14")
    assert f"not counted: 1 earlier run of a config and seed that ran again (the latest counts): {a['run_dir']}" in out
    records = list(csv.DictReader(open(tmp_path / "cmp.csv")))
    (after,) = [r for r in records if r["result"] == "eval_after"]
    assert (after["loop"], after["scale"], int(after["n"]), after["seeds"]) == ("rl", "tiny", 2, "0 1")
    assert float(after["mean"]) == pytest.approx(0.4) and float(after["std"]) == pytest.approx(0.1414, abs=1e-4)
    assert (float(after["min"]), float(after["max"])) == (0.3, 0.5)
    for r in records:  # every statistic a plain number
        assert all(r[k] == "" or float(r[k]) == float(r[k]) for k in ("mean", "std", "min", "max", "n"))


def test_the_table_keeps_to_the_keys_that_tell_runs_apart(tmp_path):
    def run(name, seed, scale="tiny", kl=0.0, lr=1e-4, data_x=1, overrides=()):
        base = {"train.total_steps": 2, "train.prompts_per_step": 4, "train.mini_batch_size": 16} if scale == "tiny" \
            else {"train.total_steps": 100, "train.prompts_per_step": 64, "train.mini_batch_size": 256}
        config = {**base, "kl.coef": kl, "optim.optimizer.lr": lr, "data.x": data_x, "paths.run": name,
                  "model.init_seed": seed}
        return _run(tmp_path, name, seed=seed, scale=scale, config=config, eval_after=0.5,
                    overrides=[f"scale={scale}", f"kl.coef={kl}", *overrides])

    rows = [run(f"t{kl}{s}", s, kl=kl, overrides=["train.total_steps=2"]) for kl in (0.0, 0.04) for s in (0, 1, 2)]
    rows += [run(f"f{s}", s, scale="full", kl=0.04) for s in (0, 1)]
    rows += [run("lr", 0, lr=3e-4, overrides=["optim.optimizer.lr=3e-4"])]
    rows += [run("edited", 0, data_x=2)]  # a recipe file edited between runs: a key no command line set
    out = main(["--results-dir", _table(tmp_path, rows)])
    header = out.split("RL runs:", 1)[1].strip().splitlines()[0]
    # typed keys whose values differ (train.total_steps: typed on some runs, 2 there and 100 in the full-scale
    # runs), and a differing key no command line set; not the keys only the scale changed, nor the seed's
    assert header == ("| recipe | scale | data.x | kl.coef | optim.optimizer.lr | train.total_steps | n | seeds "
                      "| eval_after |")
    table = _section(out, "RL runs")
    assert sorted((r["scale"], r["kl.coef"], r["optim.optimizer.lr"], r["data.x"], r["n"]) for r in table) == [
        ("full", "0.04", "0.0001", "1", "2"), ("tiny", "0", "0.0001", "1", "3"), ("tiny", "0", "0.0001", "2", "1"),
        ("tiny", "0", "0.0003", "1", "1"), ("tiny", "0.04", "0.0001", "1", "3")]


def _curve_rows(steps: int, eval_every: int, level: float, rm: bool = False) -> list[dict]:
    train = [{"step": s, "accuracy": level + 0.01 * s, "loss": 1.0 - 0.1 * s,
              **({"margin": 0.1 * s} if rm else {"reward/mean": level + 0.02 * s, "length/mean": 10.0 + s,
                                                    "kl": 0.001 * s, "entropy": 0.5})} for s in range(1, steps + 1)]
    held = [{"step": s, "eval/accuracy": level + 0.03 * s} for s in range(0, steps + 1, eval_every)]
    return sorted(train + held, key=lambda r: r["step"])


def _sweeps(tmp):
    """Sweep ``s1`` (two RL groups of two seeds), then sweep ``s2`` (RL and reward-model runs, two seeds each)."""
    rows = []
    for sweep, groups in (("s1", [("rl", 0.0), ("rl", 0.04)]), ("s2", [("rl", 0.0), ("rm", 0.0)])):
        for loop, kl in groups:
            for seed in (0, 1):
                rows.append(_run(tmp, f"{loop}{kl}{seed}", sweep=sweep, loop=loop, seed=seed,
                                 recipe="r" if loop == "rl" else "rm_recipe", config={"kl.coef": kl},
                                 overrides=[f"kl.coef={kl}"], metrics=_curve_rows(6, 2, 0.1 * seed + kl, loop == "rm"),
                                 eval_after=0.5))
    return rows


def test_the_plot_draws_one_figure_per_loop_kind_of_the_latest_sweep(tmp_path, capsys):
    out = tmp_path / "fig" / "curves.png"
    main(["--results-dir", _table(tmp_path, _sweeps(tmp_path)), "--plot", str(out)])
    printed = capsys.readouterr().out
    assert f"curves: {out.with_suffix('.rl.png')}" in printed and f"curves: {out.with_suffix('.rm.png')}" in printed
    for loop in ("rl", "rm"):
        assert out.with_suffix(f".{loop}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from core.reporting.results import read_rows
    from recipes.compare import select_sweep

    rows = read_rows(tmp_path / "results")
    latest, name = select_sweep(rows, "latest")
    assert name == "s2" and {r["run_dir"] for r in latest} == {r["run_dir"] for r in rows if "/s2/" in r["run_dir"]}
    assert len(select_sweep(rows, str(tmp_path / "s1"))[0]) == 4
    with pytest.raises(InputError, match="--sweep /nope: no finished run in that sweep"):
        select_sweep(rows, "/nope")


def test_a_figure_has_labelled_axes_seed_bands_counts_and_the_held_out_curve(tmp_path):
    import matplotlib.pyplot as plt

    from core.reporting.comparison import group
    from core.reporting.figures import figure

    groups = group([r for r in _sweeps(tmp_path) if "/s1/" in r["run_dir"]])
    fig = figure(groups, "rl", band="minmax", smooth=0.5)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == ["held-out accuracy", "training accuracy", "reward",
                                               "completion length", "KL to the reference", "policy entropy"]
    assert all(ax.get_ylabel() for ax in axes) and axes[-1].get_xlabel() == "RL step"
    held = axes[0]
    assert [list(line.get_xdata()) for line in held.lines] == [[0, 2, 4, 6], [0, 2, 4, 6]]  # never smoothed
    mean = [0.05 + 0.03 * s for s in (0, 2, 4, 6)]  # seeds 0 and 1 at level 0 and 0.1
    assert list(held.lines[0].get_ydata()) == pytest.approx(mean)
    assert len(held.collections) == 2  # one min-max band per group
    assert len(axes[2].lines) == 4  # smoothed mean over the faint unsmoothed mean, per group
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert texts == ["kl.coef=0.0  (n=2 seeds)", "kl.coef=0.04  (n=2 seeds)", "min to max over seeds",
                     "unsmoothed mean (bold: EMA 0.5; held-out never smoothed)"]
    plt.close(fig)
    with pytest.raises(InputError, match="--metrics nope: not logged by the rl runs shown; they log accuracy"):
        figure(groups, "rl", metrics=["nope"])


def test_ema_is_debiased_and_seed_bands_span_the_seeds():
    from core.reporting.figures import ema, seed_band

    assert ema([1.0, 1.0, 1.0], 0.9) == pytest.approx([1.0, 1.0, 1.0])
    assert ema([0.0, 1.0], 0.5) == pytest.approx([0.0, 0.5 / 0.75])
    assert ema([3.0, 1.0], 0.0) == [3.0, 1.0]
    steps, mean, lo, hi = seed_band([{1: 0.0, 2: 1.0}, {1: 2.0, 2: 3.0, 3: 9.0}], "minmax")
    assert (steps, mean, lo, hi) == ([1, 2], [1.0, 2.0], [0.0, 1.0], [2.0, 3.0])
    assert seed_band([{1: 0.0}, {1: 2.0}], "std")[2:] == (pytest.approx([1 - 2 ** 0.5]), pytest.approx([1 + 2 ** 0.5]))


def _evaluate(tmp, *overrides: str) -> None:
    """``python -m recipes.eval OVERRIDES`` with its rows in ``tmp/results``, in this process: the same ``main`` on
    the config the CLI composes (a CLI start costs ~6 s of imports here; tests/test_eval.py runs the CLI itself)."""
    from hydra.core.hydra_config import HydraConfig

    from core.config.composition import compose
    from recipes.eval import main as evaluate

    cfg = compose([f"paths.results_dir={tmp}/results", *overrides], with_hydra=True, config_name="eval")
    evaluate(cfg, out_dir=HydraConfig.get().run.dir)


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """Real tiny runs: a multirun of seeds 0 and 1, seed 0 again (the CLI), and two evaluations of one run with
    different settings (4 problems at 8 tokens, 2 at 4)."""
    tmp = tmp_path_factory.mktemp("real")
    common = [*FAST, "train.warm_start.steps=0", "train.eval_every=1"]
    assert run_cli(tmp, *common, "seed=0,1", multirun=True).returncode == 0
    again = run_cli(tmp, *common, "seed=0")
    assert again.returncode == 0, again.stderr[-3000:]
    data = tmp / "set.jsonl"
    data.write_text("".join(json.dumps({"q": f"{a}+{a}=", "a": str(2 * a)}) + "\n" for a in range(6)))
    tiny = f"+sets.tiny={{path:{data},prompt_key:q,answer_key:a,verifier:'tests.stub_rewards:first_char_even'}}"
    for limit, tokens in ((4, 8), (2, 4)):  # an eval dir each (one process: one ${run_stamp:} for both)
        _evaluate(tmp, f"run_dir={tmp}/run", "eval=greedy", tiny, "eval.sets=[tiny]", f"eval.limit={limit}",
                  f"rollout.max_new_tokens={tokens}", f"hydra.run.dir={tmp}/evals/{limit}")
    return tmp


def test_compare_of_real_runs_end_to_end(real, tmp_path):
    out = main(["--results-dir", str(real / "results"), "--csv", str(tmp_path / "cmp.csv"),
                "--plot", str(tmp_path / "curves.png"), "--sweep", "all"])
    (row,) = _section(out, "RL runs")
    assert (row["recipe"], row["scale"], row["n"], row["seeds"]) == ("tiny_math_grpo", "full", "2", "0 1")
    trained = [r for r in results(real) if "kind" not in r]
    first = next(r["run_dir"] for r in trained if r["seed"] == 0)  # the multirun's seed 0, replaced by the later one
    assert f"(the latest counts): {first}" in out and first != str(real / "run")
    evals = _section(out, "evaluations")
    assert [(e["problems"], e["max tokens"], e["n"], e["seeds"]) for e in evals] == [("4", "8", "1", "0"),
                                                                                    ("2", "4", "1", "0")]
    records = list(csv.DictReader(open(tmp_path / "cmp.csv")))
    (after,) = [r for r in records if r["result"] == "eval_after"]
    kept = [r["eval_after"] for r in trained if r["run_dir"] == str(real / "run") or r["seed"] == 1]
    assert float(after["mean"]) == pytest.approx(sum(kept) / 2) and int(after["n"]) == 2
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_metric_no_run_logged_is_refused_by_name_without_a_traceback(tmp_path, monkeypatch):
    from recipes.compare import cli

    results_dir = _table(tmp_path, _sweeps(tmp_path))
    monkeypatch.setattr(sys, "argv", ["compare", "--results-dir", results_dir, "--plot", str(tmp_path / "c.png"),
                                      "--metrics", "eval/accuracy,rewards/math/mean"])
    with pytest.raises(SystemExit) as e:
        cli()
    assert str(e.value).startswith("InputError: --metrics rewards/math/mean: not logged by the rl runs shown; they "
                                   "log accuracy, entropy, eval/accuracy, kl, length/mean, loss, reward/mean")
    assert not (tmp_path / "c.png").exists() and not (tmp_path / "c.rl.png").exists()
