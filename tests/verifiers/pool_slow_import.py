"""A scoring function whose module takes 1 s to import, standing in for sympy + math-verify (a fresh pool worker
imports a function's module when it unpickles its first sample)."""
from __future__ import annotations

import time

time.sleep(1.0)


def echo_after(value, seconds: float):
    time.sleep(seconds)
    return value
