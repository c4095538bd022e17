"""Entry point: ``python -m recipes.run [recipe=NAME] [scale=tiny] [key=value ...]``.

Composes ``conf/config.yaml`` with Hydra (no change of working directory), applies the ``scale``
group, and hands the config to the loop named by ``loop`` (``recipes/<loop>.py``). Returns the
loop's objective so Hydra sweepers can optimise it.
"""
from __future__ import annotations

import importlib
import os
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from core.paths import CONF_DIR, PROJECT_ROOT  # noqa: E402

if not OmegaConf.has_resolver("root"):
    OmegaConf.register_new_resolver("root", lambda: str(PROJECT_ROOT))

_NOT_LOOPS = {"__init__", "run", "compare", "explain", "plan"}


def loops() -> list[str]:
    """Loop names: the modules of this package that are training loops (``recipes/<loop>.py``)."""
    return sorted(p.stem for p in Path(__file__).parent.glob("*.py") if p.stem not in _NOT_LOOPS)


def run(cfg: DictConfig) -> float | None:
    """Dispatch to ``recipes.<loop>.main(cfg)``; the loop validates before building any model."""
    if cfg.loop not in loops():
        raise ValueError(f"loop={cfg.loop!r}; expected one of {loops()}")
    return importlib.import_module(f"recipes.{cfg.loop}").main(cfg)


def _quiet() -> None:
    """Keep the console to our own progress bar and summary: no per-load bars or backend banners."""
    import transformers
    from huggingface_hub.utils import disable_progress_bars

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    disable_progress_bars()


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    _quiet()
    set_cpu_threads(int(cfg.cpu_threads))
    return run(cfg)


def set_cpu_threads(n: int) -> None:
    """``torch.set_num_threads(n)`` for ``n > 0`` (config ``cpu_threads``); 0 leaves torch's default."""
    if n < 0:
        raise ValueError(f"cpu_threads={n}: expected 0 (torch's default) or a positive thread count")
    if n:
        import torch

        torch.set_num_threads(n)


if __name__ == "__main__":
    main()
