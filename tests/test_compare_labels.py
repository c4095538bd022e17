"""The plot legend of ``recipes.compare`` names the few keys that tell its groups apart."""
from __future__ import annotations

from core.reporting.comparison import IGNORED
from core.reporting.figures import group_labels, legend_keys


def _g(scale="full", **config):
    return {"recipe": "r", "scale": scale, "config": {k.replace("__", "."): v for k, v in config.items()},
            "runs": [{}, {}]}


def test_legend_keys_tell_every_group_apart_with_few_keys():
    groups = [_g(kl__coef=0.04, train__lpmb=64, optim__optimizer__lr=1e-4),
              _g(kl__coef=0.04, train__lpmb=16, optim__optimizer__lr=1e-4),
              _g(kl__coef=0.04, train__lpmb=64, optim__optimizer__lr=3e-4),
              _g(kl__coef=0.0, train__lpmb=64, optim__optimizer__lr=1e-4)]
    keys = legend_keys(groups)
    assert set(keys) == {"kl.coef", "train.lpmb", "optim.optimizer.lr"}
    labels = {tuple(g["config"][k] for k in keys) for g in groups}
    assert len(labels) == len(groups)
    assert legend_keys(groups[:1]) == []


def test_labels_name_the_scale_where_it_differs_and_the_seed_count():
    labels = group_labels([_g(scale="tiny", kl__coef=0.0), _g(scale="full", kl__coef=0.0),
                           _g(scale="full", kl__coef=0.04)])
    assert labels == ["scale=tiny kl.coef=0.0  (n=2 seeds)", "scale=full kl.coef=0.0  (n=2 seeds)",
                      "scale=full kl.coef=0.04  (n=2 seeds)"]


def test_the_scale_is_a_column_of_its_own_and_its_settings_never_split_groups():
    assert "scale" in IGNORED and "scale." in IGNORED and "seed" in IGNORED
