"""Rewards for tests that must not depend on what a model generates (loaded by import path:
``verifier.name=tests.stub_rewards:gold_parity``)."""
from __future__ import annotations


def gold_parity(completions: list[str], answer: list[str], **_) -> list[float]:
    """1.0 where the gold answer is even, else 0.0, whatever the completion: a batch of prompts with both
    parities has rewards that differ by construction, on any machine."""
    return [float(int(a) % 2 == 0) for a in answer]


def exact(completions: list[str], answer: list[str]) -> list[float]:
    """1.0 where the completion is the answer: a reward with no keyword arguments beyond its columns."""
    return [float(c.strip() == str(a)) for c, a in zip(completions, answer)]


def step_position(completions: list[str], **_) -> list[float]:
    """The completion's place in the RL step's rows, modulo 3: rewards that differ inside every group of two
    or more even when greedy decoding makes a group's completions equal. Under data parallelism each rank
    holds a contiguous slice of the step's rows in rank order (TRL ``process_slice``), so rank ``r`` of
    ``n`` rows starts at row ``r x n``: the same reward per row as one process gives. Training rows only
    (evaluation splits its prompts otherwise)."""
    import torch.distributed as dist

    first = dist.get_rank() * len(completions) if dist.is_initialized() else 0
    return [float((first + i) % 3) for i in range(len(completions))]


def first_char_even(completions: list[str], **_) -> list[float]:
    """1.0 where the completion starts with a character of even code point: rewards that differ between the
    samples of one prompt (so pass@k differs from avg@n) and that an evaluation's samples.jsonl records."""
    return [float(bool(c) and ord(c[0]) % 2 == 0) for c in completions]


def bonus(completions: list[str], **_) -> list[float]:
    """1.0 for every completion: a format-style bonus that says nothing about the answer (``correct_above = None``:
    not a correctness term), so in a weighted sum it lifts every reward above 0."""
    return [1.0] * len(completions)


bonus.correct_above = None


def math_killed_after(completions: list[str], **columns) -> list[float | None]:
    """The math verifier, which kills its own process with SIGKILL (``kill -9``) once the ``metrics.jsonl`` named
    by ``$RLR_TEST_KILL_AFTER`` (``<file>:<step>``) records that training step: a run killed inside the next
    step, at the same place on any machine however fast its steps are. Without the variable, the math verifier."""
    import json
    import os
    import signal
    from pathlib import Path

    from verifiers.math import math_reward

    path, _, step = os.environ.get("RLR_TEST_KILL_AFTER", "").rpartition(":")
    if path and Path(path).exists():
        rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
        if any("reward/mean" in r and r["step"] >= int(step) for r in rows):
            os.kill(os.getpid(), signal.SIGKILL)
    return math_reward(completions, **columns)


def math_signalled_after(completions: list[str], **columns) -> list[float | None]:
    """The math verifier, which sends a signal once, when the ``metrics.jsonl`` named by ``$RLR_TEST_SIGNAL``
    (``<file>:<step>:<SIGNAME>:<who>``) records that training step: ``who`` is ``agent`` (rank 0 signals its parent,
    the torchrun agent, as Slurm signals a job step's task), a rank number (that rank signals itself alone) or
    ``pid<N>`` (rank 0 signals process N: a generation server). So a signal lands inside the next step, after its
    generation, at the same place on any machine. Without the variable, the math verifier."""
    import json
    import os
    import signal
    from pathlib import Path

    import torch.distributed as dist

    from verifiers.math import math_reward

    spec = os.environ.get("RLR_TEST_SIGNAL", "")
    if spec:
        path, step, name, who = spec.rsplit(":", 3)
        rank = dist.get_rank() if dist.is_initialized() else 0
        sent = Path(f"{path}.signalled{rank}")
        rows = [json.loads(line) for line in Path(path).read_text().splitlines()] if Path(path).exists() else []
        target = os.getpid() if who == str(rank) else None
        if rank == 0 and who == "agent":
            target = os.getppid()
        elif rank == 0 and who.startswith("pid"):
            target = int(who[3:])
        if target is not None and not sent.exists() and any("reward/mean" in r and r["step"] >= int(step) for r in rows):
            sent.touch()
            os.kill(target, getattr(signal, name))
    return math_reward(completions, **columns)


def bad_at_step(completions: list[str], answer: list[str], metrics: str = "", step: int = 0, value: float = 0.0,
                rank: int = -1, **_) -> list[float]:
    """:func:`gold_parity`, but in RL step ``step`` the first completion scores ``value`` (``inf``: a fault;
    ``nan``: a missing reward), on data-parallel rank ``rank`` only (-1: on every rank). Which step is being
    scored is read off the run's ``metrics.jsonl`` (path ``metrics``): one more than the training steps it
    records, so a resumed run (its records cut back to its checkpoint) injects at the same step. Training rows
    only (give the evaluation a verifier of its own: ``verifier.eval_name``)."""
    import json
    from pathlib import Path

    import torch.distributed as dist

    if rank >= 0 and (dist.get_rank() if dist.is_initialized() else 0) != rank:
        return gold_parity(completions, answer)

    rows = Path(metrics).read_text().splitlines() if metrics and Path(metrics).exists() else []
    now = 1 + sum("reward/mean" in json.loads(line) for line in rows)
    rewards = gold_parity(completions, answer)
    if now == step:
        rewards[0] = float(value)
    return rewards
