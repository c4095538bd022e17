"""Scoring functions for the pool tests, in their own light module: pool workers import a function by reference,
so a worker that runs these imports only this file (not pytest, not sympy) and starts in a fraction of a second."""
from __future__ import annotations

import time


def echo_after(value, seconds: float):
    """``value`` after ``seconds`` of sleep: a sample of known cost (a large ``seconds`` is a hanging sample)."""
    time.sleep(seconds)
    return value


def spin(value, seconds: float):
    """``value`` after ``seconds`` of busy CPU (a sample that holds the CPU instead of sleeping)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return value


def crash_if(value, crash: bool):
    """``value``, or the worker process dies on the spot (``os._exit``) when ``crash``."""
    import os

    if crash:
        os._exit(3)
    return value
