"""core.config: the run's config after setup, resolved once into read-only plain containers."""
import copy
import pickle

import pytest
from omegaconf import OmegaConf

from core.config.frozen import FrozenConfig, freeze
from recipes import rl
from tests.core.test_rl_runs import BASE


def _cfg():
    return OmegaConf.create({"train": {"lr": 1.0e-4, "steps": 3, "warm": "${train.steps}"},
                             "loss": {"clip": [0.2, 0.28], "entropy_coef": None}, "seed": 0})


def test_freeze_resolves_and_reads_like_the_dictconfig():
    dc, fc = _cfg(), freeze(_cfg())
    assert isinstance(fc, FrozenConfig) and isinstance(fc.train, FrozenConfig)
    assert fc.train.warm == 3  # interpolation resolved
    assert fc.loss.clip == (0.2, 0.28) and isinstance(fc.loss.clip, tuple)
    for read in (lambda c: c.train.lr, lambda c: c["train"]["steps"], lambda c: c.loss.get("entropy_coef"),
                 lambda c: c.loss.get("missing", 7), lambda c: "clip" in c.loss, lambda c: c.seed,
                 lambda c: sorted(c.train)):
        assert read(fc) == read(dc)


def test_frozen_config_refuses_writes_and_names_a_missing_key():
    fc = freeze(_cfg())
    writes = [lambda: setattr(fc.train, "lr", 1.0), lambda: fc.train.__setitem__("lr", 1.0),
              lambda: fc.train.update(lr=1.0), lambda: fc.pop("seed"), lambda: fc.__delitem__("seed"),
              lambda: fc.setdefault("new", 1), lambda: fc.clear(), lambda: fc.popitem()]
    for write in writes:
        with pytest.raises(TypeError, match="read-only"):
            write()
    assert fc.train.lr == 1.0e-4 and fc.seed == 0 and len(writes) == 8
    with pytest.raises(AttributeError, match="'lr_typo' not found.*lr"):
        fc.train.lr_typo
    assert getattr(fc.train, "lr_typo", None) is None  # getattr's default still works


def test_frozen_config_survives_pickle_and_deepcopy():
    fc = freeze(_cfg())
    for back in (pickle.loads(pickle.dumps(fc)), copy.deepcopy(fc)):
        assert back == fc and isinstance(back.train, FrozenConfig) and back.train.warm == 3


def test_an_rl_run_holds_a_frozen_config(compose_cfg, tmp_path):
    """setup writes config.yaml from the DictConfig, then the run reads the frozen one."""
    cfg = compose_cfg(*BASE, f"paths.results_dir={tmp_path}")
    run = rl.setup(cfg, run_dir=str(tmp_path / "run"))
    assert isinstance(run.cfg, FrozenConfig) and isinstance(run.cfg.train, FrozenConfig)
    saved = OmegaConf.load(tmp_path / "run" / "config.yaml")
    assert int(saved.train.group_size) == run.cfg.train.group_size
    with pytest.raises(TypeError, match="read-only"):
        run.cfg.train.group_size = 2
