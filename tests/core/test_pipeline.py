"""The config pipeline (core/config/pipeline.py ``prepare``: compose -> scale -> check -> derive -> freeze): every
recipe (conf/recipe/, counted) prepared at full and tiny scale and read by what each entry point builds on it; every
entry point going through it; the plan's figures against the published runs; nothing written after it."""
from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import ReadonlyConfigError

from core.config.composition import compose
from core.config.pipeline import Prepared, prepare, recorded
from core.config.plan import RLPlan, RMPlan
from core.config.validate import ConfigError
from core.paths import CONF_DIR

RECIPES = sorted(p.stem for p in (CONF_DIR / "recipe").glob("*.yaml"))
CASES = [(r, s) for r in RECIPES for s in ("full", "tiny")]


@pytest.fixture(autouse=True)
def one_process(monkeypatch):
    """No torchrun: ``scale=tiny`` collapses every layout to this one process."""
    for key in ("WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)


def test_every_recipe_is_discovered():
    assert len(RECIPES) == 17 and len(CASES) == 34 and {"tiny_math_grpo", "tiny_rm", "simplerl_zoo_7b"} <= set(RECIPES)


@pytest.mark.parametrize("recipe,scale", CASES, ids=[f"{r}-{s}" for r, s in CASES])
def test_every_recipe_prepares_for_every_entry_point(recipe, scale):
    """Full scale: checked in the world its layout asks for, without the gpu extra (``--cfg job``, ``core.launch``,
    ``recipes.explain``, ``recipes.probe``). Tiny: as the loop prepares it on this machine (one process, every
    package check). Then what ``core.launch`` and ``recipes.explain`` build on the result."""
    from core.launch import launch_values
    from recipes.explain import explanation

    overrides = [f"recipe={recipe}", f"scale={scale}"]
    p = prepare(overrides, launched=True, packages=False) if scale == "full" else prepare(overrides)
    plan, lay = p.plan, p.config.layout
    assert isinstance(plan, {"rl": RLPlan, "rm": RMPlan}[p.config.loop]) and OmegaConf.is_readonly(p.config)
    assert plan.world_size == plan.layout.learner_gpus == lay.learner_gpus and plan.models[0].trainable
    assert plan.models[0].source == (p.config.model.name_or_path or "tiny")
    if scale == "tiny":
        assert (plan.layout.mode, plan.world_size, plan.models[0].source) == ("colocate", 1, "tiny")
    values = launch_values(p, "/runs/x")
    assert values["NPROC_PER_NODE"] == min(lay.learner_gpus, lay.gpus_per_node) and values["RUN_DIR"] == "/runs/x"
    if isinstance(plan, RLPlan):
        lines = explanation(p, rows=None)
        assert lines[0].startswith(f"recipe {recipe}") and f"= {plan.samples_per_step} completions" in lines[2]
        assert plan.grad_accum * plan.micro_batch_size * plan.world_size == plan.mini_batch_size


class _Stop(Exception):
    """Raised once the pipeline has run: the entry point stops before it builds, prints or trains anything."""


def test_every_entry_point_goes_through_the_pipeline(monkeypatch):
    from core import launch
    from core.config import pipeline
    from core.evaluation import checks
    from recipes import eval as evaluation
    from recipes import explain, probe, run

    plans = []

    def finished(cfg, plan):  # the pipeline's last step
        plans.append(plan)
        raise _Stop

    monkeypatch.setattr(pipeline, "finished", finished)
    monkeypatch.setattr(checks, "finished", finished)
    tiny = ["recipe=tiny_math_grpo"]
    entry_points = {
        "python -m recipes.run --cfg job": lambda: run.print_job_config(["--cfg", "job", *tiny]),
        "python -m recipes.run (rl loop)": lambda: run.run(compose(tiny, with_hydra=True)),
        "python -m recipes.run (rm loop)": lambda: run.run(compose(["recipe=tiny_rm"], with_hydra=True)),
        "python -m core.launch": lambda: launch.sbatch_values(tiny),
        "python -m recipes.explain": lambda: explain.explain(tiny),
        "python -m recipes.probe": lambda: probe.probe(tiny),
        "python -m recipes.eval": lambda: evaluation.main(compose(["model.name_or_path=Qwen/Qwen2.5-0.5B"],
                                                                  with_hydra=True, config_name="eval")),
    }
    for name, call in entry_points.items():
        with pytest.raises(_Stop):
            call()
    kinds = [type(plan).__name__ for plan in plans]
    assert kinds == ["RLPlan", "RLPlan", "RMPlan", "RLPlan", "RLPlan", "RLPlan", "Source"] and len(entry_points) == 7


# Published figures (conf/recipe/*.yaml cite them): (recipe, world the layout asks for, plan attributes).
PUBLISHED = [
    # SimpleRL-Zoo 7B: train_batch_size 1024 x rollout.n 8; ppo_mini_batch_size 256 prompts = 2048 responses; 2 x 8
    # GPUs with micro-batches of 2 responses; 100 steps.
    ("simplerl_zoo_7b", {"world_size": 16, "prompts_per_step": 1024, "group_size": 8, "samples_per_step": 8192,
                         "samples_per_rank": 512, "mini_batch_size": 2048, "mini_batches": 4, "mini_batch_per_rank": 128,
                         "micro_batch_size": 2, "grad_accum": 64, "ppo_epochs": 1, "optimizer_steps_per_rl_step": 4,
                         "total_steps": 100, "total_optimizer_steps": 400}),
    # Open-Instruct 8B RLVR: local_rollout_batch_size 32 x 7 learners = 224 prompts, one sample each;
    # local_mini_batch_size 32 with per_device_train_batch_size 2 (accumulation 16); 4 PPO epochs; 10M episodes.
    ("open_instruct_rlvr_8b", {"world_size": 7, "prompts_per_step": 224, "group_size": 1, "samples_per_step": 224,
                               "samples_per_rank": 32, "mini_batch_per_rank": 32, "micro_batch_size": 2,
                               "grad_accum": 16, "ppo_epochs": 4, "optimizer_steps_per_rl_step": 4,
                               "total_steps": 44642, "total_optimizer_steps": 178568, "warmup": 0}),
    # Open-R1 Math 7B: 7 processes x per_device 16 x GAS 8 = 896 completions of num_generations 7; 1 epoch.
    ("open_r1_grpo_math_7b", {"world_size": 7, "samples_per_step": 896, "samples_per_rank": 128, "grad_accum": 8,
                              "optimizer_steps_per_rl_step": 1, "total_steps": None, "epochs": 1}),
]


@pytest.mark.parametrize("recipe,figures", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_the_plan_holds_the_published_figures(recipe, figures):
    plan = prepare([f"recipe={recipe}"], launched=True, packages=False).plan
    assert {k: getattr(plan, k) for k in figures} == figures


def test_the_models_and_layout_of_a_ppo_recipe():
    """Open-Instruct 8B RLVR: a policy, its reference (KL in the reward) and a critic from the 8B reward model,
    ZeRO-3; 7 learners and 1 vLLM server GPU."""
    plan = prepare(["recipe=open_instruct_rlvr_8b"], launched=True, packages=False).plan
    roles = {m.role: (m.source, m.trainable, m.zero_stage) for m in plan.models}
    assert roles == {"policy": ("allenai/Llama-3.1-Tulu-3-8B-DPO", True, 3),
                     "reference": ("allenai/Llama-3.1-Tulu-3-8B-DPO", False, 3),
                     "critic": ("allenai/Llama-3.1-Tulu-3-8B-RM", True, 3)}
    lay = plan.layout
    assert (lay.mode, lay.learner_gpus, lay.rollout_gpus, lay.engines, lay.tp) == ("dedicated", 7, 1, 1, 1)
    assert plan.schedule.name == "linear" and plan.model("reward_model") is None


def test_rows_decide_the_steps_of_an_epochs_recipe_and_must_fill_a_step():
    """Open-R1 Math 7B (``train.epochs=1``): rows // 128 steps, cosine warmup ceil(0.1 x steps); fewer rows than a
    step's prompts are refused with the keys named."""
    plan = prepare(["recipe=open_r1_grpo_math_7b"], launched=True, packages=False).plan
    resolved = plan.for_rows(93733)
    assert (resolved.rows, resolved.total_steps, resolved.total_optimizer_steps, resolved.warmup) == (93733, 732, 732, 74)
    assert plan.total_steps is None and plan.warmup is None  # the plan itself is unchanged
    with pytest.raises(ConfigError, match=r"train.prompts_per_step=128 is larger than the training set \(100 rows "
                                          r"after filtering\)"):
        plan.for_rows(100)


def test_a_reward_model_plan_takes_its_steps_from_the_pairs():
    """OpenRLHF's Llama-3 8B RM: train_batch_size 256 of micro 1 on its 8 GPUs (32 accumulated), max_epochs 1:
    len(pairs) // 256 steps."""
    from core.data.prompts import DataError

    plan = prepare(["recipe=openrlhf_rm_llama3_8b"], launched=True, packages=False).plan
    assert (plan.batch_size, plan.micro_batch_size, plan.grad_accum, plan.total_steps) == (256, 1, 32, None)
    assert plan.for_rows(1000).total_steps == 3 and [m.role for m in plan.models] == ["reward_model"]
    with pytest.raises(DataError, match="255 usable training pairs make no optimiser step"):
        plan.for_rows(255)


def test_nothing_writes_the_config_after_prepare(compose_cfg):
    cfg = compose_cfg("recipe_name=tiny_math_grpo", "train.total_steps=null", "train.epochs=2")
    p = prepare(cfg)
    assert prepare(p) is p and not OmegaConf.is_readonly(cfg)  # a prepared config passes; the input stays the caller's
    with pytest.raises(ReadonlyConfigError):
        p.config.train.total_steps = 3
    with pytest.raises(ReadonlyConfigError):
        OmegaConf.update(p.config, "seed", 1)
    with pytest.raises(TypeError, match="read-only"):
        p.frozen.train.total_steps = 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.plan.total_steps = 3
    resolved = p.plan.for_rows(64)
    assert resolved.total_steps == 2 * (64 // p.plan.prompts_per_step) and p.config.train.total_steps is None
    record = recorded(p.frozen, resolved)  # config.yaml: the steps the rows gave, where runs have recorded them
    assert record.train.total_steps == resolved.total_steps and record.train.epochs == 2
    assert isinstance(p, Prepared) and p.frozen.train.total_steps is None
