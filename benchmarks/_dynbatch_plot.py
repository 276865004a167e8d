"""bench_dynbatch's plot: per-rank batch sizes and compute times of the change run."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot(path: str, run: dict[str, Any], S: int, n: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for k in range(n):
        steps = [s for s, _, _ in run["logs"][k]]
        ax1.plot(steps, [b for _, b, _ in run["logs"][k]], label=f"rank {k}")
        ax2.plot(steps, [1e3 * t for _, _, t in run["logs"][k]], label=f"rank {k}")
    for ax in (ax1, ax2):
        for s in (S, 2 * S):
            ax.axvline(s, color="grey", ls=":")
        ax.legend()
    ax1.set_ylabel("batch size")
    ax2.set_ylabel("compute ms / step")
    ax2.set_xlabel("step")
    fig.suptitle("dynamic batching: rank 1 slowdown changes at the dotted lines")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
