"""KL coefficient controllers, keyed by ``kl.controller``: the beta used for the KL penalty.

``fixed``: beta stays ``kl.coef``. ``adaptive``: Ziegler et al. 2019 (arXiv 1909.08593, section 2.2)
as OpenRLHF (``trainer/ppo_utils/kl_controller.py``, ``--kl_target`` / ``--kl_horizon``) and veRL
(``core_algos.AdaptiveKLController``) implement it::

    e = clip(KL / target - 1, -0.2, 0.2);   beta <- beta * (1 + e * n / horizon)

with ``n`` the number of samples of the step.
"""
from __future__ import annotations

from typing import Callable

from core.registry import Registry

ControllerFn = Callable[[float, float, int, object], float]
KL_CONTROLLERS: Registry[ControllerFn] = Registry("KL controller")


@KL_CONTROLLERS.register("fixed")
def fixed(beta: float, kl: float, n: int, cfg) -> float:
    return beta


@KL_CONTROLLERS.register("adaptive", needs_target=True)
def adaptive(beta: float, kl: float, n: int, cfg) -> float:
    """One adaptive update from the measured mean KL of the step (Ziegler et al. 2019)."""
    err = min(max(kl / cfg.target - 1.0, -0.2), 0.2)
    return beta * (1.0 + err * n / cfg.horizon)


class KLController:
    """Holds the current beta; ``update`` after each RL step with that step's mean KL."""

    def __init__(self, kl_cfg):
        self.cfg, self.beta = kl_cfg, kl_cfg.coef
        self._fn = KL_CONTROLLERS.get(kl_cfg.controller)

    def update(self, kl: float, n: int) -> float:
        self.beta = self._fn(self.beta, kl, n, self.cfg)
        return self.beta
