"""Whether an RL run's supervised warm start runs (``train.warm_start.enabled``; core/models/warm_start.py trains it).

The warm start teaches a model too weak to earn any reward the answer format, by SFT on the training rows' gold
answers: the demo's tiny random model on its generated arithmetic (conf/recipe/tiny_math_grpo.yaml). On a model or
data of one's own it would be a supervised pass nobody asked for, on the file's gold answers, before "before RL" is
even measured. So ``enabled: auto`` (conf/train/grpo.yaml) runs it only on the recipe's own model and data: not
when the command line names another model or other training data (:data:`OWN_KEYS`); ``true`` runs it whatever the
model and data, ``false`` never. ``train.warm_start.steps`` stays its budget (0: never).

The derive step resolves it once (core/config/plan.py ``RLPlan.warm_start``) and ``config.yaml`` records the
resolved ``true``/``false``, so a resumed run does what the run it continues did, whatever its command line says.
"""
from __future__ import annotations

from dataclasses import dataclass

# Keys that name the model or the training data a run starts from: set on the command line, they make it the
# user's own (a group choice, ``model=`` or ``data=``, counts as the whole node).
OWN_KEYS = ("model", "model.name_or_path", "data", "data.source", "data.path", "data.hub_name", "data.hub_config",
            "data.split")


@dataclass(frozen=True)
class WarmStartDecision:
    """``runs``: whether the warm start trains before RL; ``why``: the reason, in the config's keys (the start
    summary prints it)."""

    runs: bool
    why: str


def decide(ws, command_line: tuple[str, ...]) -> WarmStartDecision:
    """``ws``: the ``train.warm_start`` node; ``command_line``: the keys set on the command line
    (core/config/scale.py ``command_line_keys``)."""
    steps, enabled = int(ws.steps), ws.enabled
    if steps == 0:
        return WarmStartDecision(False, "train.warm_start.steps=0")
    if enabled is True or enabled is False:
        return WarmStartDecision(enabled, f"train.warm_start.enabled={str(enabled).lower()}")
    own = [k for k in command_line if k in OWN_KEYS]
    if own:
        return WarmStartDecision(False, f"{', '.join(own)} set on the command line: a model or data of your own gets "
                                        f"no supervised pass unless train.warm_start.enabled=true")
    return WarmStartDecision(True, "the recipe's own model and data (train.warm_start.enabled=auto)")
