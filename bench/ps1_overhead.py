"""Where one host's PS job spends its CPU against the single process (issue 38 part 2's profile).

    .venv/bin/python bench/ps1_overhead.py [--apps mlr,nmf] [--preset small] [--epochs 4]
                                           [--repeats 3] [--sync-batches 1] [--hosts 1]
                                           [--push-log] [--profile-dir DIR]

No testbed and no RM: per app, one server and one worker executor process (`python -m
psruntime.executor`, 4 model blocks as a one-server job has) driven by this process as the PS AM
drives them (app_setup, worker_setup, init_model, init_blocks, then BSP clocks of `run_clock` sized
by the AM's own ClockPacer, the job's default `clock_batches` 0), against the single-process
loop of psruntime.apps.single_process (the same mini-batch math on a dense in-memory model) run
in this process. The app's preset hyper-parameters are used unchanged (batch size, learning
rate), with convergence_threshold 1e-12 so nothing stops early.

With `--hosts N` (default 1), N servers and N workers (one of each per host of the scaling bench's
placement, 4 x N blocks, worker i training partition i of N, clocks sent to every worker still in
the epoch): the CPU figures are then per host (the sums over all executors / N) against the single
process's CPU / N, so `ps1_cpu_over_single` reads as one host's CPU over its share of the work, and
its growth with N is the per-host cost of talking to N owners (bench/scaling.py's `speedup_4`).

What it measures is CPU seconds per epoch (the median over epochs without the first, the
objective's evaluation left out): the single process's own (time.process_time), and each executor
process's run time from the scheduler (/proc/<pid>/task/*/schedstat, nanoseconds: /proc/<pid>/stat's
10 ms ticks are coarser than a server's share of an epoch) over the epoch's clocks, its system
part from /proc/<pid>/stat. On the testbed a
one-host job's worker and server share the host's CPU budget, so with the host CPU-bound its epoch
time follows their CPU sum: `ps1_cpu_over_single` = (worker + server CPU) / single CPU is the
figure issue 38 bounds (`ps1_over_single` <= 1.2 in bench/scaling.py), measured without the
budget, so it stays readable on a shared machine. Also per app: the worker's and the server's CPU
per mini-batch beyond the single process's, their system-time share, the worker's COMP seconds
per epoch (what the app's compute took inside the executor) and the clocks per epoch.

With `--push-log` the clocks are numbered as the AM numbers a BSP job's whose spec has `push_log`
(what rebuilds a lost server), so the worker keeps its push log: its cost against a run without.

Runs alternate (single, ps1, next app, then again) `--repeats` times; each figure is the median
over repeats with every run's value beside it. The machine's load over each run is measured
(elastane_cli.machine_load) and a saturated run is listed in `saturated_runs`: its CPU figures
are inflated by contention (cache, hyper-threads) for single and PS alike, so compare within a
run. The medians leave saturated runs out while an app has a quiet one (`quiet_runs`); with none
they are the saturated runs' and the app's `from_saturated_runs` is true. `--profile-dir` runs the executors under cProfile (ELASTANE_EXECUTOR_PROFILE_DIR; the
profiler's own cost inflates the small calls, so the CPU figures of such a run are not the
system's).

Last line, JSON: {"mlr": {"ps1_cpu_over_single", "single_cpu_s", "worker_cpu_s", "server_cpu_s",
"worker_overhead_us_per_batch", "server_us_per_batch", "sys_share", "comp_s", "clocks", "batches",
"failed_runs", "quiet_runs", "from_saturated_runs", "runs": [...]}, "nmf": ..., "saturated_runs": [...], ...}.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from appmaster.ps.clock_pacing import ClockPacer  # noqa: E402
from elastane_cli.machine_load import MachineMeter, SaturationLimits  # noqa: E402
from protocol import executor_ops as ops  # noqa: E402
from psruntime.apps.base import StepContext  # noqa: E402
from psruntime.apps.registry import APP_NAMES, create_app  # noqa: E402
from psruntime.apps.single_process import DenseModel  # noqa: E402
from psruntime.blas_threads import THREAD_VARS, limit_blas_threads  # noqa: E402
from psruntime.executor import PROFILE_DIR_ENV  # noqa: E402
from psruntime.store.migration_controller import MigrationController  # noqa: E402
from psruntime.store.ownership_table import OwnershipTable  # noqa: E402
from psruntime.wire.dataplane import DataPlaneClient, DataPlaneServer  # noqa: E402
from psruntime.wire.frame_codec import Frame  # noqa: E402

PY = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable
NUM_BLOCKS = 4                  # a one-server job's blocks (BLOCKS_PER_SERVER)
HPARAMS = {"convergence_threshold": 1e-12}
TICK = os.sysconf("SC_CLK_TCK")


def log(text: str) -> None:
    print(f"[ps1_overhead] {text}", file=sys.stderr, flush=True)


def proc_cpu(pid: int) -> tuple[float, float]:
    """(CPU, system) seconds of process `pid`, all its live threads: the CPU from the scheduler's
    run time (/proc/<pid>/task/*/schedstat, nanoseconds), as /proc/<pid>/stat's clock ticks (10 ms)
    are too coarse for a server's share of an epoch; the system part from those ticks."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    run_ns = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                run_ns += int(f.read().split()[0])
        except FileNotFoundError:       # a thread that ended since the listing
            pass
    return run_ns / 1e9, int(fields[12]) / TICK


def median_after_first(xs: list[float]) -> float:
    return float(statistics.median(xs[1:] if len(xs) > 1 else xs))


def single_run(app_name: str, preset: str, epochs: int) -> dict[str, Any]:
    """The single-process loop (psruntime.apps.single_process's), CPU seconds per epoch."""
    app = create_app(app_name, {}, HPARAMS, preset=preset)
    blocks = app.generate_partition(0, 1).blocks
    model = DenseModel(app)
    for block in blocks:
        model.push(app.init_block(block))
    cpu: list[float] = []
    batches = 0
    for epoch in range(epochs):
        c0 = time.process_time()
        ctx = StepContext(epoch=epoch, num_workers=1, threads=1)
        batches = 0
        for block in blocks:
            for batch in app.batches(block):
                model.push(app.compute(batch, model.pull(app.keys_for_batch(batch)), ctx))
                batches += 1
        cpu.append(time.process_time() - c0)
    return {"cpu_s": median_after_first(cpu), "cpu_epochs": [round(c, 3) for c in cpu], "batches": batches}


def spawn(name: str, role: str, am: str, tmp: Path, profile_dir: Optional[str],
          num_blocks: int = NUM_BLOCKS) -> subprocess.Popen[bytes]:
    # One BLAS thread, as on the capped host this bench stands in for (psruntime.blas_threads):
    # read when the executor's OpenBLAS loads.
    env = {**os.environ, "PYTHONPATH": str(ROOT), **{v: "1" for v in THREAD_VARS}}
    if profile_dir:
        env[PROFILE_DIR_ENV] = profile_dir
    return subprocess.Popen([PY, "-m", "psruntime.executor", "--executor-id", name, "--port", "0",
                             "--num-blocks", str(num_blocks), "--role", role, "--am", am],
                            stderr=open(tmp / f"{name}.log", "wb"), env=env, cwd=str(ROOT))


async def ps_run(app_name: str, preset: str, epochs: int, tmp: Path, profile_dir: Optional[str],
                 push_log: bool = False, sync_batches: int = 1, hosts: int = 1) -> dict[str, Any]:
    """`hosts` servers and `hosts` workers (one of each per host of the job's placement), paced in
    BSP clocks as the AM paces them; CPU figures are per host (the sums over all / hosts)."""
    announced: dict[str, str] = {}

    def am_handler(frame: Frame) -> tuple[dict[str, Any], list[Any]]:
        announced[str(frame.header["executor_id"])] = str(frame.header["address"])
        return {"op": "ok"}, []

    am = DataPlaneServer(am_handler)
    procs = {}
    dp = DataPlaneClient()
    servers = [f"s{i}" for i in range(hosts)]
    workers = [f"w{i}" for i in range(hosts)]
    num_blocks = NUM_BLOCKS * hosts         # BLOCKS_PER_SERVER per server, as the job spec sizes it
    try:
        am_address = await am.start()
        procs = {n: spawn(n, "server" if n in servers else "worker", am_address, tmp, profile_dir, num_blocks)
                 for n in servers + workers}
        deadline = time.monotonic() + 120
        while len(announced) < len(procs):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs.values()):
                raise RuntimeError(f"executors did not announce themselves (logs in {tmp})")
            await asyncio.sleep(0.05)
        ctl = MigrationController(OwnershipTable.round_robin(num_blocks, servers, dict(announced)))
        await ctl.broadcast(list(procs))
        for address in announced.values():
            await dp.request(address, {"op": "app_setup", "app": app_name, "preset": preset, "hparams": HPARAMS,
                                       "sync_batches": sync_batches})
        for i, w in enumerate(workers):
            await dp.request(announced[w], {"op": "worker_setup", "partition": i, "num_partitions": hosts})
        await dp.request(announced[workers[0]], {"op": "init_model"})
        await asyncio.gather(*(dp.request(announced[w], {"op": "init_blocks"}) for w in workers))
        pacer = ClockPacer(0)           # the job spec's default clock_batches: auto-sized clocks
        rows = []
        clocks_done = 0

        async def run_clock(w: str, clock: ops.RunClock) -> ops.RunClockReply:
            return ops.decode_reply((await dp.request(announced[w], ops.to_header(clock))).header, ops.RunClockReply)

        for epoch in range(epochs):
            before = {n: proc_cpu(p.pid) for n, p in procs.items()}
            clocks, comp, batches = 0, 0.0, 0
            running = list(workers)
            while running:
                # Numbered as the AM numbers a BSP job's clocks: the worker keeps its push log
                # (the spec's push_log, default off; --push-log measures with it).
                clock = ops.RunClock(epoch=epoch, batches=pacer.batches, num_workers=hosts,
                                     clock=clocks_done if push_log else -1)
                clocks_done += 1
                replies = await asyncio.gather(*(run_clock(w, clock) for w in running))
                clocks += 1
                comp += sum(r.compute_s for r in replies)
                batches += sum(r.batches for r in replies)
                pacer.observe(max(r.batches for r in replies), max(r.seconds for r in replies))
                running = [w for w, r in zip(running, replies) if not r.epoch_done]
            after = {n: proc_cpu(p.pid) for n, p in procs.items()}
            rows.append({n: (after[n][0] - before[n][0], after[n][1] - before[n][1]) for n in procs}
                        | {"clocks": clocks, "comp_s": comp, "batches": batches})
            for w in workers:      # outside the epoch's CPU window, as the AM's
                await dp.request(announced[w], {"op": "objective"})
        await ctl.close()

        def med(f: Any) -> float:
            return median_after_first([f(r) for r in rows])

        def per_host(names: list[str], i: int) -> Any:
            return lambda r: sum(r[n][i] for n in names) / hosts
        return {"worker_cpu_s": med(per_host(workers, 0)), "server_cpu_s": med(per_host(servers, 0)),
                "worker_sys_s": med(per_host(workers, 1)), "server_sys_s": med(per_host(servers, 1)),
                "comp_s": med(lambda r: r["comp_s"] / hosts), "clocks": med(lambda r: r["clocks"]),
                "batches": int(med(lambda r: r["batches"] / hosts))}
    finally:
        await dp.close()
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
        for p in procs.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        await am.stop()


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """An app's medians over its runs that did not fail, the saturated ones left out while a quiet
    one remains; when none does they come from the saturated runs and `from_saturated_runs` says so."""
    done = [r for r in runs if "error" not in r]
    quiet = [r for r in done if not r.get("saturated")]
    ok = quiet or done
    if not ok:
        return {"ps1_cpu_over_single": None, "failed_runs": len(runs), "quiet_runs": 0,
                "from_saturated_runs": False, "runs": runs}

    def med(key: str) -> float:
        return float(statistics.median(r[key] for r in ok))
    return {"ps1_cpu_over_single": round(med("ratio"), 3), "ratio_runs": [r["ratio"] for r in done],
            "single_cpu_s": round(med("single_cpu_s"), 3), "worker_cpu_s": round(med("worker_cpu_s"), 4),
            "server_cpu_s": round(med("server_cpu_s"), 4),
            "worker_overhead_us_per_batch": round(med("worker_overhead_us"), 1),
            "server_us_per_batch": round(med("server_us"), 1), "sys_share": round(med("sys_share"), 3),
            "comp_s": round(med("comp_s"), 3), "clocks": med("clocks"), "batches": int(med("batches")),
            "failed_runs": len(runs) - len(done), "quiet_runs": len(quiet), "from_saturated_runs": not quiet,
            "runs": runs}


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--apps", default="mlr,nmf")
    p.add_argument("--preset", default="small")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--profile-dir", default=None, help="run the executors under cProfile, stats written here")
    p.add_argument("--sync-batches", type=int, default=1,
                   help="the job's sync_batches: mini-batches per sync window (1: pull and push each)")
    p.add_argument("--hosts", type=int, default=1,
                   help="servers and workers, one of each per host: CPU figures per host against the single process's / hosts")
    p.add_argument("--push-log", action="store_true",
                   help="clocks numbered, as for a job with push_log true: the worker keeps its push log")
    ns = p.parse_args(argv)
    apps = [a for a in ns.apps.split(",") if a]
    bad = [a for a in apps if a not in APP_NAMES]
    if not apps or bad:
        p.error(f"--apps: name apps of {', '.join(APP_NAMES)}, got {ns.apps!r}")
    if ns.epochs < 2 or ns.repeats < 1:
        p.error("--epochs must be >= 2 (the first is left out) and --repeats >= 1")
    if ns.hosts < 1 or ns.sync_batches < 1:
        p.error(f"--hosts and --sync-batches must be >= 1, got {ns.hosts} and {ns.sync_batches}")
    if ns.profile_dir:
        Path(ns.profile_dir).mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in apps}
    limit_blas_threads(1)      # the single process as on a capped host (psruntime.blas_threads), as the executors
    with tempfile.TemporaryDirectory(prefix="ps1-overhead-") as tmp:
        for rep in range(ns.repeats):
            for app in apps:
                log(f"repeat {rep + 1}/{ns.repeats} {app}: single, then {ns.hosts} worker(s) + {ns.hosts} server(s)")
                meter = MachineMeter()
                meter.start()
                run: dict[str, Any] = {"repeat": rep}
                try:
                    single = single_run(app, ns.preset, ns.epochs)
                    ps = asyncio.run(ps_run(app, ns.preset, ns.epochs, Path(tmp), ns.profile_dir,
                                            push_log=ns.push_log, sync_batches=ns.sync_batches, hosts=ns.hosts))
                    n = max(ps["batches"], 1)
                    total = ps["worker_cpu_s"] + ps["server_cpu_s"]
                    share = single["cpu_s"] / ns.hosts          # one host's share of the single process's work
                    run.update(single_cpu_s=round(single["cpu_s"], 4), **{k: round(v, 4) for k, v in ps.items()},
                               ratio=round(total / share, 3),
                               worker_overhead_us=round(1e6 * (ps["worker_cpu_s"] - share) / n, 1),
                               server_us=round(1e6 * ps["server_cpu_s"] / n, 1),
                               sys_share=round((ps["worker_sys_s"] + ps["server_sys_s"]) / total, 3) if total else 0.0)
                except Exception as e:  # noqa: BLE001 - one run failing is reported, the others still run
                    run["error"] = f"{type(e).__name__}: {e}"
                load = meter.stop()
                run.update(machine=load.to_json(), saturated=SaturationLimits().refuse(load))
                runs[app].append(run)
                log(f"{app}: {json.dumps(run)}")
    out: dict[str, Any] = {a: summarise(rs) for a, rs in runs.items()}
    out["saturated_runs"] = [f"{a}/repeat{r['repeat'] + 1}: {r['saturated']}"
                             for a, rs in runs.items() for r in rs if r.get("saturated")]
    out.update(preset=ns.preset, epochs=ns.epochs, repeats=ns.repeats, cores=os.cpu_count(),
               profiled=bool(ns.profile_dir), push_log=ns.push_log, sync_batches=ns.sync_batches, hosts=ns.hosts)
    print(json.dumps(out))
    return 1 if any("error" in r for rs in runs.values() for r in rs) else 0


if __name__ == "__main__":
    sys.exit(main())
