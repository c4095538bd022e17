"""Process-level settings of the training entry point (``recipes/run.py``): the glibc allocator and
torch's CPU thread count (``cpu_threads``).

glibc ``malloc`` (PyTorch's CPU allocator) serves blocks above its dynamic mmap threshold (128 KiB at
start) with fresh pages and hands freed heap tops back to the OS, so on CPU every step's activations
page-fault afresh: measured on the tiny GRPO step, ~4,200 minor faults and ~25% of the policy update
(docs/performance.md). :func:`keep_freed_memory` tells glibc to keep freed memory in the process
instead, which is what PyTorch's CPU performance guide gets from jemalloc or tcmalloc. The same
setting from the environment, for any process: ``GLIBC_TUNABLES=glibc.malloc.mmap_threshold=
33554432:glibc.malloc.trim_threshold=4294967296`` (``bench/trl_grpo_bench.py`` gives it to both sides).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc <malloc.h>
MMAP_THRESHOLD = 32 << 20  # glibc's largest allowed mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
TRIM_THRESHOLD = 4 << 30  # freed heap tops below this stay in the process
GLIBC_TUNABLES = f"glibc.malloc.mmap_threshold={MMAP_THRESHOLD}:glibc.malloc.trim_threshold={TRIM_THRESHOLD}"


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds (blocks under 32 MiB come from the heap and freed memory
    stays mapped; peak RSS is unchanged). Returns False, changing nothing, where libc is not glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, min(TRIM_THRESHOLD, 2**31 - 1)))
    log.debug("glibc malloc thresholds raised: %s", ok)
    return ok


def set_cpu_threads(n: int) -> None:
    """``torch.set_num_threads(n)`` for ``n > 0`` (config ``cpu_threads``); 0 leaves torch's default."""
    if n < 0:
        raise ValueError(f"cpu_threads={n}: expected 0 (torch's default) or a positive thread count")
    if n:
        import torch

        torch.set_num_threads(n)
