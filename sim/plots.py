"""PNG plots of a simulation run (matplotlib, Agg backend: no display needed).

- jct.png: the distribution of job completion times (histogram, mean marked);
- utilization.png: cluster utilization (mean of memory and vCores) over time;
- running_jobs.png: jobs running and jobs waiting over time.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")   # before pyplot: files only, no display
import matplotlib.pyplot as plt

from .metrics import Sample


def write_plots(out_dir: Path, title: str, jcts: Sequence[float], samples: Sequence[Sample]) -> list[Path]:
    """Write the three plots into `out_dir`; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    t_h = [s.t / 3600.0 for s in samples]

    fig, ax = plt.subplots(figsize=(6, 4))
    if jcts:
        ax.hist([j / 60.0 for j in jcts], bins=min(30, max(5, len(jcts) // 2)), color="#4477aa")
        ax.axvline(sum(jcts) / len(jcts) / 60.0, color="#cc3311", linestyle="--", label="mean")
        ax.legend()
    ax.set_xlabel("job completion time (min)")
    ax.set_ylabel("jobs")
    ax.set_title(f"{title}: JCT distribution")
    paths.append(_save(fig, out_dir / "jct.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(t_h, [100.0 * s.utilization for s in samples], color="#228833", linewidth=1)
    ax.set_ylim(0, 105)
    ax.set_xlabel("time (h)")
    ax.set_ylabel("utilization (%)")
    ax.set_title(f"{title}: cluster utilization")
    paths.append(_save(fig, out_dir / "utilization.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.step(t_h, [s.running for s in samples], where="post", label="running", color="#4477aa")
    ax.step(t_h, [s.waiting for s in samples], where="post", label="waiting", color="#ee7733")
    ax.set_xlabel("time (h)")
    ax.set_ylabel("jobs")
    ax.legend()
    ax.set_title(f"{title}: jobs over time")
    paths.append(_save(fig, out_dir / "running_jobs.png"))
    return paths


def _save(fig: "plt.Figure", path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


__all__ = ["write_plots"]
