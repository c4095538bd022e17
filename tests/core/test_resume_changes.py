"""``resume_allow_changes``: a resume may change the optimiser, and the new values reach the restored
optimiser (the checkpoint's learning rate does not silently win); without the flag the change is refused. A
resume starts from the run's saved config; a finished run resumed for more steps is extended or told how."""
from __future__ import annotations

import json

import pytest
import torch

from core.config import schema
from core.config.resume import check_resume_config, saved_base, with_saved_recipe, write_config
from core.training.checkpoint import AlreadyFinished, ResumeError, prior_run
from core.training.backend import Backend


def _engine(lr: float, warmup: int = 4):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1, bias=False)
    optim = schema.node(schema.OptimConfig, {"optimizer": {"lr": lr, "betas": [0.9, 0.999], "eps": 1e-8,
                                                           "weight_decay": 0.0},
                                             "scheduler": {"name": "linear", "warmup_steps": warmup}})
    backend = Backend(schema.node(schema.ZeroConfig, stage=0), torch.device("cpu"), torch.float32)
    return backend.train_engine(model, optim, 10, 1, 1), optim


def test_retune_puts_the_new_learning_rate_at_the_schedule_step(tmp_path):
    old, _ = _engine(1e-3)
    for _ in range(6):  # past the 4 warmup steps: linear decay over 10
        old.optimizer.step()
        old.scheduler.step()
    old.save_state(tmp_path)
    new, cfg = _engine(5e-4)
    new.load_state(tmp_path)
    assert new.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * 4 / 6)  # the checkpoint's, restored
    new.retune(schema.node(schema.OptimizerConfig, lr=5e-4, betas=[0.8, 0.99], weight_decay=0.1))
    group = new.optimizer.param_groups[0]
    assert group["lr"] == pytest.approx(5e-4 * 4 / 6) and new.scheduler.get_last_lr() == [group["lr"]]
    assert group["betas"] == (0.8, 0.99) and group["weight_decay"] == 0.1
    new.optimizer.step()
    new.scheduler.step()
    assert new.optimizer.param_groups[0]["lr"] == pytest.approx(5e-4 * 3 / 6)  # the schedule goes on from there


def test_an_optimiser_change_is_refused_unless_allowed(compose_cfg, tmp_path):
    saved = compose_cfg("recipe_name=x", "optim.optimizer.lr=1e-4")
    write_config(tmp_path, saved)  # resolved, as a run writes it
    changed = compose_cfg("recipe_name=x", "optim.optimizer.lr=1e-3")
    with pytest.raises(ResumeError, match=r"optim.optimizer.lr: 0.0001 -> 0.001[\s\S]*resume_allow_changes=true"):
        check_resume_config(tmp_path, changed)
    check_resume_config(tmp_path, compose_cfg("recipe_name=x", "optim.optimizer.lr=1e-3", "resume_allow_changes=true"))
    with pytest.raises(ResumeError, match="model.tiny.hidden_size: 128 -> 64"):  # never a model change
        check_resume_config(tmp_path, compose_cfg("recipe_name=x", "optim.optimizer.lr=1e-4",
                                                  "resume_allow_changes=true", "model.tiny.hidden_size=64"))


def test_a_resume_starts_from_the_saved_config_and_changes_only_the_typed_keys(compose_cfg, tmp_path):
    write_config(tmp_path, compose_cfg("recipe_name=x", "kl.coef=0", "train.total_steps=8",
                                       "train.checkpoint_every=2"))
    based = saved_base(compose_cfg("recipe_name=x", "resume=auto", "train.total_steps=12"),
                       ("resume", "train.total_steps"), tmp_path)
    assert (based.kl.coef, based.train.checkpoint_every, based.train.total_steps, based.resume) == (0, 2, 12, "auto")
    check_resume_config(tmp_path, based)  # kl.coef=0 is the run's own: no complaint
    fresh = compose_cfg("recipe_name=x", "resume=false")
    assert saved_base(fresh, ("resume",), tmp_path).kl.coef == fresh.kl.coef  # a fresh run takes nothing
    typed = saved_base(compose_cfg("recipe_name=x", "resume=true", "kl.coef=0.1"), ("resume", "kl.coef"), tmp_path)
    with pytest.raises(ResumeError, match="kl.coef: 0.0 -> 0.1"):  # a typed change is checked, never dropped
        check_resume_config(tmp_path, typed)


def test_a_finished_run_asked_for_more_or_fewer_steps(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"run_dir": str(tmp_path), "steps": 8}))
    with pytest.raises(AlreadyFinished):
        prior_run(tmp_path, "auto", 8)
    with pytest.raises(ResumeError, match=r"but it holds no checkpoint-<step> folder; start a new run from its final "
                                          r"model: model.name_or_path="):
        prior_run(tmp_path, True, 12)
    with pytest.raises(ResumeError, match="finished at step 8; train.total_steps=6 would not extend it"):
        prior_run(tmp_path, "auto", 6)


def test_a_resume_typed_with_no_recipe_takes_the_saved_recipe_whole(compose_cfg, tmp_path):
    """Another recipe's run resumed without naming it: its nodes the default recipe holds as none (the vLLM
    settings), or as other free-form dicts (the weighted verifier's terms), come from config.yaml."""
    from omegaconf import OmegaConf

    saved = compose_cfg("recipe=open_r1_grpo_1_5b", "recipe_name=x", "rollout=vllm", "zero=stage2")
    write_config(tmp_path, saved)
    based = saved_base(compose_cfg("recipe_name=y", "resume=auto"), ("resume",), tmp_path)

    def values(cfg) -> dict:
        return {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k != "resume"}

    assert values(based) == values(saved)


def test_a_resume_that_names_no_recipe_composes_the_runs_own(tmp_path):
    (tmp_path / "config.yaml").write_text("recipe_name: tiny_rm\nloop: rm\n")
    resume = ["resume=auto", f"hydra.run.dir={tmp_path}"]
    assert with_saved_recipe(resume) == [*resume, "recipe=tiny_rm"]  # its loop and groups, not the default's
    assert with_saved_recipe([*resume, "recipe=tiny_math_grpo"]) == [*resume, "recipe=tiny_math_grpo"]
    assert with_saved_recipe(["resume=false", f"hydra.run.dir={tmp_path}"]) == ["resume=false",
                                                                               f"hydra.run.dir={tmp_path}"]


def test_a_saved_key_this_config_has_no_place_for_is_refused(compose_cfg, tmp_path):
    (tmp_path / "config.yaml").write_text("loop: rm\ntrain:\n  batch_size: 64\n")
    with pytest.raises(ResumeError, match=r"holds keys this command's config has no place for \(train.batch_size\)"):
        saved_base(compose_cfg("recipe_name=x", "resume=auto"), ("resume",), tmp_path)
