"""The plot legend of ``recipes.compare`` names the few keys that tell its groups apart."""
from __future__ import annotations

from recipes.compare import IGNORED, legend_keys


def _g(**config):
    return {"recipe": "r", "config": {k.replace("__", "."): v for k, v in config.items()}, "runs": [{}]}


def test_legend_keys_tell_every_group_apart_with_few_keys():
    groups = [_g(kl__coef=0.04, scale__name="full", train__lpmb=64, optim__optimizer__lr=1e-4),
              _g(kl__coef=0.04, scale__name="tiny", train__lpmb=16, optim__optimizer__lr=1e-4),
              _g(kl__coef=0.04, scale__name="full", train__lpmb=64, optim__optimizer__lr=3e-4),
              _g(kl__coef=0.0, scale__name="full", train__lpmb=64, optim__optimizer__lr=1e-4)]
    keys = legend_keys(groups)
    assert set(keys) == {"kl.coef", "scale.name", "optim.optimizer.lr"}  # train.lpmb follows scale.name
    labels = {tuple(g["config"][k] for k in keys) for g in groups}
    assert len(labels) == len(groups)
    assert legend_keys(groups[:1]) == []


def test_the_scales_own_settings_never_split_groups():
    assert "scale.model." in IGNORED and "scale.name" not in IGNORED
