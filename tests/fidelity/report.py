"""``python -m tests.fidelity.report``: the fidelity checks' figures (``$FIDELITY_REPORT``, default results/fidelity/,
written by tests/fidelity/harness.py) as the markdown table of docs/fidelity.md: per recipe the source release that
ran, and the largest difference of each quantity over its steps (RL steps or reward-model optimiser steps)."""
from __future__ import annotations

import json
import sys

from tests.fidelity.compare import TOL
from tests.fidelity.harness import REPORT_DIR

# An RL step has advantages and per-token log-probs, a reward-model step rewards, a PPO step its critic's loss and
# weights: "-" where a check has none.
COLUMNS = ["advantages", "logprobs", "rewards", "loss", "grad_norm", "weights", "value_loss", "value_weights"]


def rows() -> list[str]:
    out = ["| recipe | source that ran | steps | " + " | ".join(COLUMNS) + " |",
           "| --- | --- | --- | " + " | ".join("---" for _ in COLUMNS) + " |"]
    for path in sorted(REPORT_DIR.glob("*.json")):
        r = json.loads(path.read_text())
        worst = {k: f"{max(s[k] for s in r['steps']):.2g}" if k in r["steps"][0] else "-" for k in COLUMNS}
        ran = f"{r['package']} {r['ran'].get(r['package'], r['version'])}"
        out.append(f"| `{r['recipe']}` | {ran} | {len(r['steps'])} | " + " | ".join(worst.values()) + " |")
    out.append("| tolerance | | | " + " | ".join(f"{TOL[k]:g}" for k in COLUMNS) + " |")
    return out


def main() -> None:
    if "--help" in sys.argv[1:] or "-h" in sys.argv[1:]:
        print(__doc__)
        return
    if not REPORT_DIR.exists():
        sys.exit(f"no fidelity figures in {REPORT_DIR}: run `make fidelity` first")
    print("\n".join(rows()))


if __name__ == "__main__":
    main()
