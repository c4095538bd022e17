"""Evaluation: ``python -m recipes.eval eval=PRESET run_dir=RUN_DIR | model.name_or_path=MODEL [key=value ...]``.

Composes ``conf/eval.yaml`` with Hydra: a preset (``conf/eval/<name>.yaml``, one source's settings: sets,
samples per problem, sampling, prompt format, stop sequences, verifier) over the sets of
``conf/eval/catalog/``. Every input is checked before a weight is read (core/evaluation/checks.py), then each
set's prompts, repeated ``eval.samples`` times, go through a rollout engine (``rollout=hf`` on any device,
``rollout=vllm`` on a GPU), each completion is scored by the set's verifier, and the set's greedy pass@1 or
sampled avg@n and pass@k (core/evaluation/estimators.py) are appended to the results table, one row per
(model, set, metric), beside the training rows they compare with (``python -m recipes.compare``). The output
dir holds ``samples.jsonl`` (per problem: prompt, completions, rewards), ``config.yaml`` and ``summary.json``.
Returns the first metric, so Hydra sweepers can use it. docs/eval.md.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402

from core.config.composition import register_resolvers  # noqa: E402
from core.config.resume import write_config  # noqa: E402
from core.evaluation import schema  # noqa: E402
from core.evaluation.checks import EvalConfigError, Source, prepare_eval, set_node, set_verifier  # noqa: E402
from core.evaluation.estimators import set_metrics  # noqa: E402
from core.evaluation.sampling import SetResult, add_stop_tokens, generate, score  # noqa: E402
from core.evaluation.sets import EvalSet, load_set, tokenize_set  # noqa: E402
from core.paths import CONF_DIR  # noqa: E402
from core.reporting.console import announced  # noqa: E402
from core.registry import Registry  # noqa: E402
from core.reporting.results import append_rows, command_line_overrides, markdown_table, write_summary  # noqa: E402

register_resolvers()
schema.store()
log = logging.getLogger(__name__)

# How each engine gets the policy it samples from: ``hf`` generates with the loaded model; vLLM loads the
# weights itself from the model's path, so it gets only the path and generation config, and a GPU holds one copy.
POLICIES: Registry = Registry("rollout.engine (recipes.eval)")


@POLICIES.register("hf")
def loaded_policy(path: str, model_cfg, device):
    from core.models.loading import load_causal_lm

    return load_causal_lm(path, model_cfg).to(device).eval()


@dataclass
class WeightsByPath:
    """What ``core.rollout.vllm.VLLMRollout`` reads of a policy it loads by path: the path, the generation config
    (for its EOS ids)."""

    name_or_path: str
    generation_config: object


@POLICIES.register("vllm")
def policy_by_path(path: str, model_cfg, device) -> WeightsByPath:
    from transformers import GenerationConfig

    try:
        gen = GenerationConfig.from_pretrained(path)
    except OSError:  # a model without generation_config.json: the tokenizer's EOS alone
        gen = None
    return WeightsByPath(path, gen)


def main(cfg, out_dir: str | None = None) -> float:
    """Check, load the sets, sample, score, write rows; returns the first metric. ``cfg``: a composed eval config,
    or one prepared already (core/evaluation/checks.py ``prepare_eval``). ``out_dir`` defaults to Hydra's run dir
    (given explicitly by tests that compose configs)."""
    prepared = prepare_eval(cfg)  # every key, the model, the sets, samples and k: before anything is read
    cfg, src = prepared.config, prepared.plan
    out = Path(out_dir or HydraConfig.get().runtime.output_dir)
    sets = [_load(cfg, name) for name in cfg.eval.sets]  # rows before any model: a missing file or column fails here
    from core.models.loading import load_tokenizer
    from core.training.checkpoint import seed_everything
    from core.training.device import check_precision, resolve_device

    device = resolve_device(cfg.device)
    check_precision(cfg.model.dtype, device)
    tokenizer = load_tokenizer(src.path)
    for s in sets:
        tokenize_set(s, cfg.data, tokenizer)
        if not s.rows:
            raise EvalConfigError(f"sets.{s.name}: no problems left (data.max_prompt_chars="
                                  f"{cfg.data.max_prompt_chars}, data.max_prompt_tokens={cfg.data.max_prompt_tokens})")
    write_config(out, cfg)
    log.info("evaluating %s on %s (%s); output dir %s", src.path, ", ".join(f"{s.name}: {len(s.rows)} problems"
             for s in sets), f"{cfg.eval.samples} sample(s) each", out)
    with announced(log, f"loading {src.path} ({cfg.rollout.engine})"):
        rollout = _rollout(cfg, src, tokenizer, device)
    ends = set(add_stop_tokens(rollout, list(cfg.eval.stop_token_ids), len(tokenizer)))
    rows = []
    with open(out / "samples.jsonl", "w", encoding="utf-8") as fh:
        for s in sets:
            # each set's draws are its own, whichever sets run before it
            seed_everything(int(cfg.seed), bool(cfg.deterministic))
            start = time.perf_counter()
            with announced(log, f"{s.name}: {len(s.rows)} problems x {cfg.eval.samples} sample(s)"):
                res = evaluate_set(cfg, s, rollout, tokenizer, ends)
            fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in res.records)
            rows += result_rows(cfg, src, s, res, out, time.perf_counter() - start)
    append_rows(Path(str(cfg.paths.results_dir)), rows, key=("kind", "eval_dir", "set", "metric"))
    write_summary(out, {"eval_dir": str(out), "rows": rows})
    print(markdown_table(rows, ["recipe", "preset", "set", "metric", "value", "problems", "samples"]))
    log.info("rows appended to %s; completions in %s", Path(str(cfg.paths.results_dir)) / "runs.jsonl",
             out / "samples.jsonl")
    return rows[0]["value"]


def _load(cfg, name: str) -> EvalSet:
    node = set_node(cfg, name)
    return load_set(name, node, cfg.data, set_verifier(cfg, node), cfg.eval.limit)


def _rollout(cfg, src: Source, tokenizer, device):
    from core.rollout import build_rollout

    policy = POLICIES.get(cfg.rollout.engine)(src.path, cfg.model, device)
    return build_rollout(cfg.rollout.engine, policy, tokenizer, cfg.rollout)


def evaluate_set(cfg, s: EvalSet, rollout, tokenizer, ends: set[int]) -> SetResult:
    """``eval.samples`` completions of every problem of ``s``, ended at the stops and scored."""
    from core.rollout import Sampling, sampling_seed
    from verifiers.correctness import Scorer

    n = int(cfg.eval.samples)
    # each set's rows seeded from the eval's seed and the set's name, whichever sets run before it (vLLM seeds each
    # request: docs/vllm.md); scoring reads the texts, not the log-probs
    sampling = Sampling.from_cfg(cfg.rollout, seed=sampling_seed(int(cfg.seed), "eval", s.name), logprobs=False)
    texts, finish = generate(rollout, tokenizer, s.ids, n, sampling, int(cfg.rollout.generation_batch_size), ends,
                             list(cfg.eval.stop), desc=s.name)
    prompts = tokenizer.batch_decode(s.ids)
    scorer = Scorer(s.verifier_name, dict(s.cfg.verifier_kwargs), s.cfg.accuracy_term, f"sets.{s.name}.accuracy_term")
    bar = cfg.eval.pass_reward
    return score(s, scorer, texts, finish, n, None if bar is None else float(bar), prompts)


def result_rows(cfg, src: Source, s: EvalSet, res: SetResult, out: Path, seconds: float) -> list[dict]:
    """One results-table row per metric of set ``s``. ``recipe``, ``run_dir`` and ``seed`` are the training run's
    when the model came from one, so recipes.compare groups the rows with it; ``eval_dir`` keys them."""
    r, greedy = cfg.rollout, bool(cfg.rollout.greedy)
    metrics = set_metrics(res.counts, greedy, int(cfg.eval.samples), [int(k) for k in cfg.eval.pass_k])
    common = {
        "kind": "eval", "recipe": src.recipe, "run_dir": src.run_dir or str(out), "model": src.path,
        "preset": cfg.preset, "set": s.name, "problems": len(res.counts), "skipped": res.skipped,
        "samples": int(cfg.eval.samples), "greedy": greedy, "temperature": None if greedy else float(r.temperature),
        "top_p": None if greedy else float(r.top_p), "max_new_tokens": int(r.max_new_tokens),
        "verifier": s.verifier_name, "seed": src.seed, "eval_seed": int(cfg.seed), "eval_dir": str(out),
        "eval_seconds": round(seconds, 2), "overrides": command_line_overrides(),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    return [{**common, "metric": name, "value": value} for name, value in metrics.items()]


@hydra.main(config_path=str(CONF_DIR), config_name="eval", version_base="1.3")
def _hydra_main(cfg) -> float:
    from recipes.run import _quiet, set_cpu_threads

    _quiet()
    set_cpu_threads(int(cfg.cpu_threads))
    return main(cfg)


def cli() -> None:
    import sys

    from recipes.run import briefly_on_input_errors, print_job_config

    def start():
        if not print_job_config(sys.argv[1:], prepare_eval):  # --cfg job: checked as a run checks it
            _hydra_main()

    briefly_on_input_errors(start)


if __name__ == "__main__":
    cli()
