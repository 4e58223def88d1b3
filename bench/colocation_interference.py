"""What co-location costs beyond sharing: the interference terms of sim/colocation.py, measured here.

    .venv/bin/python bench/colocation_interference.py [--repeats 5] [--work-s 0.6]

Two terms, each against a baseline measured in the same run:

- `naive_cpu_contention`: two COMP loops (single-threaded numpy matrix products, the apps' kind of
  work) pinned to the same core at once, against one loop alone, repeats interleaved:
  pair wall / (2 x alone wall) - 1. It is what time-sharing a core costs over running the two COMPs
  one after the other (context switches, each evicting the other's cache) -- what a naively
  co-located job pays while another job's COMP runs beside its own, and what Harmony's arbiter
  avoids by granting one COMP at a time.
- `arbiter_handoff_s`: bench/arbiter.py's handoff p50 (A's RELEASE to the waiting B's GRANT, the
  time a queued Harmony subtask waits beyond the previous one's end), run here with few samples:
  the per-subtask cost of interleaving.

Prints a summary, then one JSON object as the last line: {"naive_cpu_contention", "alone_s",
"pair_s", "arbiter_handoff_s", "repeats"} (medians over the repeats).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHILD_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def comp_loop(rounds: int) -> None:
    """One COMP: `rounds` 192x192 matrix products (single-threaded BLAS)."""
    import numpy as np  # noqa: PLC0415 (in the child only)
    a = np.random.default_rng(0).random((192, 192))
    b = a.copy()
    for _ in range(rounds):
        b = a @ b
        b /= float(np.abs(b).max())


def spawn(rounds: int, core: int) -> subprocess.Popen[bytes]:
    code = (f"import os, sys; os.sched_setaffinity(0, {{{core}}}); sys.path.insert(0, {str(ROOT)!r}); "
            f"from bench.colocation_interference import comp_loop; comp_loop({rounds})")
    return subprocess.Popen([sys.executable, "-c", code], env=CHILD_ENV)


def timed(rounds: int, copies: int, core: int) -> float:
    """Wall seconds for `copies` COMP loops of `rounds` pinned to `core`, started together."""
    t = time.perf_counter()
    procs = [spawn(rounds, core) for _ in range(copies)]
    for p in procs:
        if p.wait() != 0:
            raise SystemExit(f"a COMP loop failed (exit {p.returncode})")
    return time.perf_counter() - t


def calibrate_rounds(work_s: float, core: int) -> int:
    """Rounds of the COMP loop that take about `work_s` alone (process start included)."""
    rounds = 200
    t = timed(rounds, 1, core)
    return max(50, int(rounds * work_s / max(t, 1e-3)))


def arbiter_handoff_s() -> float | None:
    """bench/arbiter.py's handoff p50 in seconds (None when it does not run here)."""
    try:
        out = subprocess.run([sys.executable, str(ROOT / "bench" / "arbiter.py"), "--samples", "2000",
                              "--rounds", "2"], capture_output=True, text=True, timeout=300, check=True).stdout
        res = json.loads(out.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError, OSError):
        return None
    v = res.get("handoff_p50_us")
    return None if v is None else float(v) / 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--work-s", type=float, default=0.6, help="one COMP loop's length alone")
    p.add_argument("--core", type=int, default=0)
    p.add_argument("--no-arbiter", action="store_true", help="skip the arbiter handoff measurement")
    ns = p.parse_args(argv)
    rounds = calibrate_rounds(ns.work_s, ns.core)
    alone: list[float] = []
    pair: list[float] = []
    for _ in range(ns.repeats):       # interleaved, so a busy spell on the shared host hits both
        alone.append(timed(rounds, 1, ns.core))
        pair.append(timed(rounds, 2, ns.core))
    ratios = [pw / (2.0 * a) - 1.0 for a, pw in zip(alone, pair)]
    handoff = None if ns.no_arbiter else arbiter_handoff_s()
    res = {"naive_cpu_contention": round(statistics.median(ratios), 4),
           "alone_s": round(statistics.median(alone), 4), "pair_s": round(statistics.median(pair), 4),
           "arbiter_handoff_s": handoff, "repeats": ns.repeats, "rounds": rounds}
    print(f"COMP alone {res['alone_s']} s, two on one core {res['pair_s']} s: contention "
          f"{100 * res['naive_cpu_contention']:.1f} % over running them one after the other; "
          f"arbiter handoff {handoff}", file=sys.stderr)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
