"""Run every benchmark module ``bench/<name>_bench.py`` (or only those named on the command line)."""
from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    from core.errors import printed_help

    if printed_help(argv, f"python -m bench [NAME ...]: {__doc__}"):
        return 0
    names = sorted(p.stem for p in Path(__file__).parent.glob("*_bench.py"))
    chosen = [n for n in names if not argv or any(a in n for a in argv)]
    if not chosen:
        print(f"no benchmark matches {argv}; available: {names}")
        return 2
    for name in chosen:
        print(f"\n=== {name} ===", flush=True)
        start = time.perf_counter()
        importlib.import_module(f"bench.{name}").main()
        print(f"=== {name}: {time.perf_counter() - start:.1f} s ===", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
