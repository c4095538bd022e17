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
    import torch
    import transformers
    from huggingface_hub.utils import disable_progress_bars

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed's CPU accelerator, silently
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    disable_progress_bars()


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    from core.runtime import keep_freed_memory, set_cpu_threads

    _quiet()
    keep_freed_memory()  # glibc keeps freed activations mapped: no page faults per step (core/runtime.py)
    set_cpu_threads(int(cfg.cpu_threads))
    return run(cfg)


if __name__ == "__main__":
    main()
