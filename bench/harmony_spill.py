"""Harmony's spill where memory binds (dissertation §4.3.3, Fig. 4.19): the adaptive alpha against fixed alphas.

    python bench/harmony_spill.py [--quick] [--repeats 3] [--samples 400000 --executor-mb 160 --epochs 4]

The scenario. Co-located under Harmony, k jobs share a host's memory, so each job's containers get
about 1/k of it; a job whose input was sized for a host of its own no longer fits. Here one MLR
worker holds ~165 MB of input (400,000 rows of 412 bytes) in a 160 MB container, beside the
executor's own footprint: without spill it cannot fit, and run isolated it would need more hosts
(`setup.hosts_to_fit_without_spill`: the input over what a container leaves once the executor's
footprint is in, measured here as the peak of the alpha-1 run less its blocks in flight). The
container's limit is the NM's cgroup memory limit (one local NM with cgroups: the scenario is one
container's memory, so one node is enough); a container past it is killed by the kernel and
reported -104 (KILLED_EXCEEDED_PMEM), as in YARN. Without usable cgroups the NM's RSS monitor
enforces instead, and `setup.enforcement` says so.

The modes, each the same job and seed: `spill_alpha` fixed at 0, 0.25, 0.5, 0.75 and 1, then "auto"
(the initial alpha from sampled sizes against the container's limit, then hill climbing per clock
between load stalls and memory pressure). Round robin over the modes, `--repeats` times.

What adaptive alpha can win here, honestly. The paper's win is GC overhead avoided in a managed
runtime; CPython has no tracing GC to thrash (reference counting frees a block when it is dropped),
so memory pressure short of the limit costs nothing, and the only loss is being killed. A lower
alpha reloads (and decompresses) fewer blocks per epoch, so the best fixed alpha is the lowest one
that is never killed -- and finding it by trial costs a killed run per alpha tried below it. The
adaptive alpha should land there (or just above) in one run, without trials. So the figures are:
is the adaptive run killed (`adaptive_killed`), and its iteration time over the best fixed alpha
that was never killed (`adaptive_time_over_best_fixed`, 1.0 = as good; above 1 is the price of its
margin and its first clocks), beside `trials_to_find_lowest_unkilled`: the runs a search from
alpha 0 upwards needs before it finds the lowest alpha that is not killed.

Per mode: `iteration_s`, the median epoch time after the first; `peak_rss_mb`, the largest RSS of
the job's executors (VmRSS of their processes, sampled every 0.1 s; a warm executor forked from the
NM's zygote is found by its process title, and its RSS counts the zygote's shared pages, which
are charged to the NM); `peak_cgroup_mb`, the largest charge of their container cgroups less file
page cache, sampled the same way (`psruntime.spill.memory_reading`, what the tuner reads: the
kernel's own `memory.max_usage_in_bytes` counts the spill files' page cache, which it reclaims
before it kills, so it sits at the limit in every run that spills); `executor_cpu_s`, the CPU
seconds of the job's executors over the whole run (less swayed than wall time by other load on a
shared machine; `adaptive_cpu_over_best_fixed` compares it as the time ratio does); `killed`: any executor killed -104; `alpha`, the job's mean
alpha at its end; `stall_s`; `spilled_mb`; `outcome`. Each figure is the median over the repeats
(`killed`: killed in any repeat), with every repeat's iteration time beside it.

Last line, JSON: {"modes": {"0.0": {...}, ..., "auto": {...}}, "adaptive_time_over_best_fixed",
"adaptive_cpu_over_best_fixed", "adaptive_killed", "best_fixed_alpha", "lowest_unkilled_fixed_alpha", "adaptive_alpha",
"trials_to_find_lowest_unkilled", "repeats", "setup"}.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from elastane_cli.local_cluster import LocalCluster  # noqa: E402
from protocol.ps_status import FINAL_STATUS_FILE, read_status  # noqa: E402
from psruntime.spill.memory_reading import ContainerMemory  # noqa: E402
from support.watched_job import FINAL, Job, am_log_tail, http, wait_for  # noqa: E402
from support.sigterm import unwind_on_sigterm  # noqa: E402  (bench/support: not a benchmark itself)

FIXED = (0.0, 0.25, 0.5, 0.75, 1.0)
QUICK_FIXED = (0.0, 0.5, 1.0)
ROW_BYTES = 412     # an MLR row of 50 non-zeros as the generator stores it (CSR + label)


def log(text: str) -> None:
    print(f"[harmony_spill] {text}", file=sys.stderr, flush=True)


def app_pids(app_id: str) -> list[int]:
    """The app's live processes: by environment (cold launches) or by the process title a warm
    executor forked from the NM's zygote shows (its /proc environ is the zygote's)."""
    needle = f"APPLICATION_ID={app_id}".encode()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if (d / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            if needle in (d / "environ").read_bytes().split(b"\0") or \
                    needle in (d / "cmdline").read_bytes().replace(b"\0", b" ").split():
                out.append(int(d.name))
        except (OSError, IndexError):
            continue
    return out


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """utime + stime of a process (seconds)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _vm_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class PeakSampler:
    """Samples the app's executors every `interval_s`: the largest VmRSS, and the largest charge
    of their container cgroups less file page cache."""

    def __init__(self, app_id: str, interval_s: float = 0.1) -> None:
        self.app_id = app_id
        self.interval_s = interval_s
        self.rss = 0
        self.cgroup = 0
        self._cpu: dict[int, float] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "PeakSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    @property
    def cpu_s(self) -> float:
        """CPU seconds the executors used, as last sampled (the last 0.1 s of each may be missed)."""
        return sum(self._cpu.values())

    def _run(self) -> None:
        while not self._done.is_set():
            for pid in app_pids(self.app_id):
                try:
                    if b"psruntime.executor" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                        continue
                    self.rss = max(self.rss, _vm_rss(pid))
                    self._cpu[pid] = max(self._cpu.get(pid, 0.0), _cpu_s(pid))
                except OSError:
                    continue
                mem = ContainerMemory(f"/proc/{pid}")
                if mem.cgroup is not None and mem.cgroup.path.name.startswith("container_"):
                    self.cgroup = max(self.cgroup, mem.used_bytes())
            self._done.wait(self.interval_s)


def job_spec(ns: argparse.Namespace, alpha: float | str) -> dict[str, Any]:
    return {"app": "mlr", "preset": "tiny", "workers": 1, "servers": 1, "max_epochs": ns.epochs,
            "convergence_threshold": 1e-12, "executor_memory_mb": ns.executor_mb, "heldout_every_epochs": 0,
            "clock_batches": ns.clock_batches, "spill_alpha": alpha,
            "data": {"num_samples": ns.samples, "rows_per_block": ns.rows_per_block, "num_features": 1000,
                     "nnz_per_sample": 50, "num_heldout": 500},
            "hparams": {"batch_size": 2000, "learning_rate": 0.3}}


def run_one(cluster: LocalCluster, ns: argparse.Namespace, alpha: float | str) -> dict[str, Any]:
    job = Job(cluster, job_spec(ns, alpha), f"spill-{alpha}")
    with PeakSampler(job.app_id) as peaks:
        try:
            app = wait_for(lambda: (a := job.app())["state"] in FINAL and a, ns.timeout_s, f"{job.app_id} to end")
        finally:
            if job.app()["state"] not in FINAL:
                http(f"{cluster.rm_url}/ws/v1/cluster/apps/{job.app_id}/state?user.name=bench", "PUT",
                     {"state": "KILLED"})
    wait_for(lambda: not app_pids(job.app_id), 60, f"the processes of {job.app_id} to exit")
    diag = app.get("diagnostics") or ""
    out: dict[str, Any] = {"outcome": app["finalStatus"], "killed": "-104" in diag,
                           "peak_rss_mb": round(peaks.rss / 2**20, 1), "peak_cgroup_mb": round(peaks.cgroup / 2**20, 1),
                           "executor_cpu_s": round(peaks.cpu_s, 2),
                           "iteration_s": None, "stall_s": None, "alpha": None, "spilled_mb": None}
    if app["finalStatus"] != "SUCCEEDED":
        out["outcome"] = f"{app['finalStatus']}: {diag[:200]}"
        log(f"alpha {alpha}: {out}\n{'' if out['killed'] else am_log_tail(cluster, job.app_id, 5)}")
        return out
    final = read_status((cluster.base_dir / "rm" / "apps" / job.app_id / FINAL_STATUS_FILE).read_bytes())
    shape = app.get("shape") or {}
    times = [e.epoch_time_s for e in final.objective_history]
    steady = times[1:] or times
    workers = [e for e in (final.shape.executors if final.shape else []) if e.role == "worker"]
    out.update(iteration_s=round(statistics.median(steady), 3) if steady else None,
               stall_s=round(sum(e.spill_stall_s for e in workers), 3),
               alpha=None if shape.get("alpha") is None else round(shape["alpha"], 3),
               spilled_mb=round(shape.get("spilled_mb") or 0.0, 1),
               epoch_times=[round(t, 2) for t in times])
    log(f"alpha {alpha}: {out}")
    return out


def _median(xs: list[Optional[float]]) -> Optional[float]:
    known = [x for x in xs if x is not None]
    return round(statistics.median(known), 3) if known else None


def merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One mode's repeats as one: medians of the figures over the runs that have them; killed if
    any run was; the outcomes and iteration times of every run beside them."""
    out: dict[str, Any] = {k: _median([r[k] for r in runs])
                           for k in ("iteration_s", "executor_cpu_s", "peak_rss_mb", "peak_cgroup_mb", "stall_s", "alpha",
                                     "spilled_mb")}
    out["killed"] = any(r["killed"] for r in runs)
    out["killed_runs"] = sum(1 for r in runs if r["killed"])
    out["outcomes"] = [r["outcome"] for r in runs]
    out["iteration_s_runs"] = [r["iteration_s"] for r in runs]
    out["peak_rss_mb_runs"] = [r["peak_rss_mb"] for r in runs]
    return out


def summary(modes: dict[str, dict[str, Any]], fixed: list[float]) -> dict[str, Any]:
    """The comparison keys of the last line from the merged modes."""
    safe = [a for a in fixed if not modes[str(a)]["killed"] and modes[str(a)]["iteration_s"] is not None]
    best = min(safe, key=lambda a: modes[str(a)]["iteration_s"]) if safe else None
    auto = modes.get("auto", {})
    ratio = cpu_ratio = None
    if best is not None and auto.get("iteration_s") is not None and not auto["killed"]:
        ratio = round(auto["iteration_s"] / modes[str(best)]["iteration_s"], 3)
        if auto.get("executor_cpu_s") and modes[str(best)].get("executor_cpu_s"):
            cpu_ratio = round(auto["executor_cpu_s"] / modes[str(best)]["executor_cpu_s"], 3)
    lowest = min(safe) if safe else None
    return {"adaptive_time_over_best_fixed": ratio, "adaptive_cpu_over_best_fixed": cpu_ratio,
            "adaptive_killed": bool(auto.get("killed")),
            "best_fixed_alpha": best, "lowest_unkilled_fixed_alpha": lowest, "adaptive_alpha": auto.get("alpha"),
            # A search from alpha 0 upwards in the steps tried here: every killed alpha below the
            # lowest one that survives, then that one.
            "trials_to_find_lowest_unkilled": None if lowest is None else sum(1 for a in fixed if a <= lowest)}


def main(argv: list[str] | None = None) -> int:
    unwind_on_sigterm()   # a SIGTERM stops the cluster this bench started
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="alphas 0, 0.5, 1 and auto, 3 epochs, one repeat")
    p.add_argument("--samples", type=int, default=400_000, help=f"MLR training rows ({ROW_BYTES} bytes each)")
    p.add_argument("--rows-per-block", type=int, default=10_000)
    p.add_argument("--executor-mb", type=int, default=160)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--clock-batches", type=int, default=10)
    p.add_argument("--timeout-s", type=float, default=600)
    p.add_argument("--keep-dir", type=Path, default=None)
    p.add_argument("--repeats", type=int, default=3, help="every mode this many times, round robin; medians")
    p.add_argument("--only", nargs="*", default=None, metavar="ALPHA",
                   help="run only these modes (numbers and/or auto)")
    ns = p.parse_args(argv)
    if ns.quick:
        ns.epochs, ns.repeats = min(ns.epochs, 3), 1
    fixed = [a for a in (QUICK_FIXED if ns.quick else FIXED)
             if ns.only is None or str(a) in ns.only or f"{a:g}" in ns.only]
    settings: list[float | str] = [*fixed, *(["auto"] if ns.only is None or "auto" in ns.only else [])]
    tmp = None if ns.keep_dir else tempfile.TemporaryDirectory(prefix="harmony-spill-")
    base = ns.keep_dir or Path(tmp.name)  # type: ignore[union-attr]
    # One node: the AM (512 MB), the server and the worker.
    # Expiry well above the defaults: on a loaded shared machine an AM can take tens of seconds to
    # start, and a job lost to that says nothing about alpha.
    cluster = LocalCluster(base, nodes=1, node_memory_mb=2 * ns.executor_mb + 1024, node_vcores=4,
                           heartbeat_interval_ms=250, am_expiry_s=120, nm_expiry_s=120)
    input_mb = ns.samples * ROW_BYTES / 2**20
    log(f"one worker with {input_mb:.0f} MB of input in a {ns.executor_mb} MB container")
    runs: dict[str, list[dict[str, Any]]] = {str(a): [] for a in settings}
    try:
        cluster.start(timeout_s=60)
        info = http(f"{cluster.rm_url}/ws/v1/cluster/nodes")["nodes"]["node"]
        log(f"node: {info[0].get('id')}")
        for _ in range(max(1, ns.repeats)):
            for alpha in settings:    # round robin: a busy spell of a shared machine hits every mode
                for _attempt in range(3):
                    r = run_one(cluster, ns, alpha)
                    # A run that failed other than by its memory limit (an AM that could not start
                    # on a loaded machine) is run again: it measured nothing.
                    if r["outcome"] == "SUCCEEDED" or r["killed"]:
                        break
                runs[str(alpha)].append(r)
    finally:
        cluster.stop()
        if tmp is not None:
            tmp.cleanup()
    modes = {k: merge(v) for k, v in runs.items()}
    results: dict[str, Any] = {"modes": modes, **summary(modes, fixed), "repeats": max(1, ns.repeats)}
    # The executor's footprint beside its data: the alpha-1 run keeps one block in use and one
    # loading (plus a decompression buffer) and nothing else of its input.
    full = modes.get("1.0", {}).get("peak_cgroup_mb")
    block_mb = input_mb / math.ceil(ns.samples / ns.rows_per_block)
    footprint = None if not full else full - 3 * block_mb
    room = None if footprint is None else ns.executor_mb - footprint
    results["setup"] = {"input_mb_per_worker": round(input_mb, 1), "executor_mb": ns.executor_mb,
                        "epochs": ns.epochs, "executor_footprint_mb": None if footprint is None else round(footprint, 1),
                        "hosts_to_fit_without_spill": (math.ceil(input_mb / room) if room and room > 0 else None),
                        # The sampler finds a container cgroup only where the NM made one.
                        "enforcement": ("cgroup memory limit" if any(r["peak_cgroup_mb"] for rs in runs.values() for r in rs)
                                        else "the NM's RSS monitor (no cgroups)")}
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
