"""The planner's activation memory against what the process measures (docs/planner.md "Memory: validation").

For each case, in a fresh process: the probe's prediction on fake tensors (``recipes.probe.probe``), then the same
phases on real tensors of the same small model, each phase's resident set size (``/proc/self/statm``) sampled every
millisecond while it runs; measured = the peak minus the RSS just before (after a warm-up call of the phase, its
gradients dropped, so lazy initialisation is not counted). glibc is told to map every allocation of 64 KiB or more
on its own (``MALLOC_MMAP_THRESHOLD_``), so a freed tensor leaves the RSS and the RSS follows what is live.

``python -m bench plan_memory`` (or ``python -m bench.plan_memory_bench``) prints one row per case and phase.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

MODEL = ["model.tiny.hidden_size=256", "model.tiny.intermediate_size=1024", "model.tiny.num_hidden_layers=4",
         "model.tiny.num_attention_heads=4", "model.tiny.num_key_value_heads=2",
         "model.tiny.max_position_embeddings=4096"]
CASES = {
    "rm, 4 pairs x 1024": ["recipe=tiny_rm", "train.max_len=1024", "train.micro_batch_size=4", *MODEL],
    "rm, 4 pairs x 1024, checkpointing": ["recipe=tiny_rm", "train.max_len=1024", "train.micro_batch_size=4",
                                          "model.gradient_checkpointing=true", *MODEL],
    "rl, 8 x (256 + 512)": ["recipe=tiny_math_grpo", "data.max_prompt_tokens=256", "rollout.max_new_tokens=512",
                            "train.micro_batch_size=8", "train.logprob_micro_batch_size=8", *MODEL],
    "rl, 8 x (256 + 512), checkpointing": ["recipe=tiny_math_grpo", "data.max_prompt_tokens=256",
                                           "rollout.max_new_tokens=512", "train.micro_batch_size=8",
                                           "train.logprob_micro_batch_size=8", "model.gradient_checkpointing=true",
                                           *MODEL],
}
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class PeakRSS:
    """The highest RSS seen, sampled every millisecond in a thread, while the ``with`` block runs."""

    def __enter__(self) -> "PeakRSS":
        self.peak, self._stop = rss(), threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss())
            time.sleep(0.001)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())


def one(overrides: list[str]) -> dict:
    """``{phase: (predicted bytes, measured bytes)}`` of one case, in this process."""
    import gc

    from recipes import probe

    predicted = {n: p["activation_bytes"] for n, p in probe.probe(overrides)["phases"].items()}
    measured, measure = {}, probe.measure

    def measuring(fn, models):
        fn()  # warm-up: kernels' and thread pools' lazy allocations are not the phase's
        for m in models:
            if m is not None:
                m.zero_grad(set_to_none=True)
        gc.collect()
        before = rss()
        with PeakRSS() as peak:
            result = measure(fn, models)
        measured[len(measured)] = peak.peak - before
        return result

    probe.measure = measuring
    real = probe.probe(overrides, fake=False)
    names = [n for n in real["phases"] if real["phases"][n]["activation_bytes"]]
    return {n: (predicted[n], measured[i], real["phases"][n]["activation_bytes"]) for i, n in enumerate(names)}


def main() -> None:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}
    print(f"{'case':<38} {'phase':<9} {'predicted MiB':>13} {'tracked MiB':>12} {'RSS MiB':>9} {'pred/RSS':>9}")
    for case, overrides in CASES.items():
        proc = subprocess.run([sys.executable, "-m", "bench.plan_memory_bench", "--one", json.dumps(overrides)],
                              env=env, capture_output=True, text=True, check=True)
        for phase, (pred, meas, tracked) in json.loads(proc.stdout.splitlines()[-1]).items():
            print(f"{case:<38} {phase:<9} {pred / 2**20:>13.1f} {tracked / 2**20:>12.1f} {meas / 2**20:>9.1f} "
                  f"{pred / meas:>9.2f}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        import contextlib

        with contextlib.redirect_stdout(sys.stderr):
            result = one(json.loads(sys.argv[2]))
        print(json.dumps(result))
    else:
        main()
