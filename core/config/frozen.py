"""The run's configuration after setup, as plain read-only Python containers.

Hydra composes an OmegaConf ``DictConfig``. Each attribute read on one walks OmegaConf's node machinery
(interpolation, struct and type checks): 15-20 us per level on this machine (``cfg.train.group_size``
takes 36 us), and the RL step reads its config about 70 times. That was 1.4 ms of a ~120 ms tiny GRPO
step (docs/performance.md). Once the config is validated and written to ``config.yaml``, nothing changes
it, so the recipe resolves it once into :class:`FrozenConfig` nodes: the same reads (``cfg.train.lr``,
``cfg.loss.get("entropy_coef")``, ``"key" in cfg.kl``), plain dict speed, and no writes.
"""
from __future__ import annotations

from omegaconf import OmegaConf


class FrozenConfig(dict):
    """A resolved config node: item, attribute and ``get`` reads; any write raises."""

    __slots__ = ()

    def __getattr__(self, key: str):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(f"config key {key!r} not found (keys: {', '.join(sorted(self))})") from None

    def _read_only(self, *args, **kwargs):
        raise TypeError("the run's config is read-only after setup; set values by Hydra override instead")

    __setattr__ = __setitem__ = __delitem__ = _read_only
    clear = pop = popitem = setdefault = update = __ior__ = _read_only

    def __reduce__(self):  # pickle / deepcopy rebuild through dict.__init__, not the blocked __setitem__
        return (FrozenConfig, (dict(self),))


def freeze(cfg) -> FrozenConfig:
    """``cfg`` (a ``DictConfig``) with interpolations resolved, mappings as :class:`FrozenConfig` and lists
    as tuples."""
    return _frozen(OmegaConf.to_container(cfg, resolve=True))


def _frozen(x):
    if isinstance(x, dict):
        return FrozenConfig({k: _frozen(v) for k, v in x.items()})
    if isinstance(x, list):
        return tuple(_frozen(v) for v in x)
    return x
