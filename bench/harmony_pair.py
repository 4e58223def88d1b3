"""Harmony's 2-job group against eq. 4.1: a COMP-heavy (70:30) and a COMM-heavy (30:70) job on the
same emulated hosts under one node arbiter, measured alone and together.

    python bench/harmony_pair.py [--quick] [--repeats 3] [--seconds 15] [--bandwidth 100mbit] [--host-cpus 0.5]

Two testbed hosts (elastane_cli/testbed_hosts.py, docs/testbed.md), each with its own address, a
link capped at `--bandwidth` (tc on both directions of its veth) and a CPU budget of `--host-cpus`
cores (a cgroup quota): `wk` runs both jobs' workers, `ps` both jobs' servers (one server executor
per job, `python -m psruntime.executor`), so every pull and push crosses `wk`'s link. Each worker
is a process on `wk` running the real training pipeline (psruntime/training_pipeline.py) on MLR
with the Harmony runner, which takes `wk`'s arbiter's slots around every COMP / COMM subtask; the
arbiter (nodemanager/arbiter_server.py) has a CPU pool of the budget's cores rounded up (1 for
0.5 core: one COMP at a time, the paper's case). The RM and AMs are left out on purpose: they
would choose where the workers and servers go, and this bench needs both workers on one host and
both servers on the other, as in one Harmony group of one machine.

The two jobs are MLR with models of about 0.8 and 1.9 MB (num_features x num_classes float32, all
pulled and pushed every mini-batch); their batch sizes are calibrated first, on this machine, so
that measured alone the COMP:COMM split is about 70:30 and 30:70 (COMP time grows with the batch,
COMM does not). Then, `--repeats` times, interleaved: A alone, B alone, A and B together, each for
`--seconds` from a common start (throughput counts the mini-batches each job finished inside the
window where both ran).

eq. 4.1 from the alone measurements (per mini-batch, the times each subtask held its slot):

    Tg = max(T_cpu_A + T_cpu_B, T_net_A + T_net_B, max(T_cpu_A + T_net_A, T_cpu_B + T_net_B))

and in a group every job does one iteration per Tg, so the pair's predicted throughput is 2 / Tg
iterations per second. Measured: the two jobs' iterations per second summed.

Two readings of eq. 4.1 with the interference it leaves out, measured alone: the COMMs' own CPU
work (encode, decode, the data plane: wk's cgroup CPU-seconds per iteration alone) must fit the
host's CPU too, so a group iteration lasts at least the two jobs' CPU-seconds over the budget
(`pair_over_model_with_cpu_work`) or over the cores the host actually got alone, which on a
loaded machine is less than its budget (`pair_over_model_with_cpu_got`).

Last line, JSON: {"pair_throughput_over_model" (median over repeats; target 0.9-1.1),
"pair_throughput", "model_throughput", "model_group_iteration_s", "alone": {A: {...}, B: {...}}
(per-mini-batch compute_s / comm_s held, iterations_per_s, comp_share), "pair": {...},
"pair_over_sequential" (the pair's throughput over the two jobs run one after the other on the
same hosts: 2 / (T_itr_A + T_itr_B)), "wk_cpu_utilization" (alone / pair, over the budget),
"host_cpu_budget", "bandwidth_bps", "repeats", "seconds"}.
If the testbed cannot be built (no root, no network namespaces, no cgroups) it says why and exits 1.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from support.sigterm import unwind_on_sigterm  # noqa: E402  (bench/support: not a benchmark itself)
from support.harmony_workloads import WORKLOADS, batch_sizes  # noqa: E402

from models.harmony import group_iteration_time  # noqa: E402
from psruntime.wire.bandwidth import parse_rate  # noqa: E402

NUM_BLOCKS = 8
TARGET = {"A": 0.7, "B": 0.3}          # the COMP share of an iteration measured alone
# A's model 2000 x 100 float32 = 0.8 MB, B's 9000 x 100 = 3.6 MB (bench/support/harmony_workloads.py),
# so that with B's COMM about 0.7 and A's about 0.3 of an iteration their iterations last about as
# long (eq. 4.1's group then needs no job to wait for another: the paper's complementary pair).
PAIR = {"A": "mlr_0.8mb", "B": "mlr_3.6mb"}
# Blocks of 12 000 rows (two per job), so the calibration has batch sizes up to 12 000 that cut a
# block evenly (batch_sizes).
PAIR_ROWS_PER_BLOCK = 12_000
JOBS: dict[str, tuple[dict[str, Any], int]] = {
    j: ({**WORKLOADS[w].data, "rows_per_block": PAIR_ROWS_PER_BLOCK}, int(WORKLOADS[w].hparams["batch_size"]))
    for j, w in PAIR.items()}


def log(text: str) -> None:
    print(f"[harmony_pair] {text}", file=sys.stderr, flush=True)


# ----- the worker: a process on the `wk` host ------------------------------------------------------
async def worker(ns: argparse.Namespace) -> None:
    """Set up one job's model and input against its server, then answer commands on stdin:
    `run SECONDS BATCH` trains mini-batches for about SECONDS and prints one JSON line; `quit`."""
    import msgspec  # noqa: PLC0415 (the worker's imports stay out of the parent's start-up)

    from psruntime.apps.base import StepContext  # noqa: PLC0415
    from psruntime.apps.registry import create_app  # noqa: PLC0415
    from psruntime.arbiter_client import ArbiterClient  # noqa: PLC0415
    from psruntime.harmony_runner import HarmonyRunner  # noqa: PLC0415
    from psruntime.store.migration_controller import MigrationController  # noqa: PLC0415
    from psruntime.store.ownership_table import OwnershipTable  # noqa: PLC0415
    from psruntime.store.store_client import StoreClient  # noqa: PLC0415
    from psruntime.training_pipeline import Resource, TrainingPipeline, init_blocks, init_model  # noqa: PLC0415
    from psruntime.wire.dataplane import DataPlaneClient  # noqa: PLC0415

    data = json.loads(ns.data)
    app = create_app("mlr", data, {"batch_size": ns.batch})
    ctl = MigrationController(OwnershipTable.round_robin(NUM_BLOCKS, ["s"], {"s": ns.server}))
    await ctl.broadcast()
    dp = DataPlaneClient()
    store = StoreClient(ctl.table, dp)
    await init_model(store, app)
    blocks = app.generate_partition(0, 1).blocks
    await init_blocks(store, app, blocks)
    client = ArbiterClient(ns.arbiter, f"job-{ns.job}", f"worker-{ns.job}")
    await client.connect()
    runner = HarmonyRunner(client)
    pipeline = TrainingPipeline(runner)
    pipeline.set_comp_threads(ns.threads)
    epoch = 0
    loop = asyncio.get_running_loop()
    print(json.dumps({"ready": True, "model_mb": round(app.spec.num_features * app.spec.num_classes * 4 / 1e6, 3)}),
          flush=True)
    while True:
        line = (await loop.run_in_executor(None, sys.stdin.readline)).split()
        if not line or line[0] == "quit":
            break
        seconds, batch = float(line[1]), int(line[2])
        app.hparams = msgspec.structs.replace(app.hparams, batch_size=batch)
        w0, h0, g0 = dict(runner.wait_s), dict(runner.held_s), dict(runner.grants)
        compute, comm, done = 0.0, 0.0, []
        t0 = time.time()
        while time.time() - t0 < seconds:
            # One mini-batch per step, so the window's end cuts at most one; the step's flush
            # (a PUSH that waits for the servers' replies) makes each iteration complete.
            times = await pipeline.run_batches(app, store, blocks, StepContext(epoch, 1, threads=ns.threads), limit=1)
            if times.batches == 0:
                epoch += 1
                continue
            done.append(time.time())
            compute += sum(times.compute)
            comm += sum(times.comm)
        n = max(1, len(done))
        wait = {r: runner.wait_s[r] - w0[r] for r in Resource}
        held = {r: runner.held_s[r] - h0[r] for r in Resource}
        grants = {r: runner.grants[r] - g0[r] for r in Resource}
        print(json.dumps({"start": t0, "done": done, "batches": len(done), "compute_s": compute / n, "comm_s": comm / n,
                          "compute_wait_s": wait[Resource.CPU] / n, "comm_wait_s": wait[Resource.COMM] / n,
                          "compute_held_s": (compute - wait[Resource.CPU]) / n,
                          "comm_held_s": (comm - wait[Resource.COMM]) / n,
                          "runner_cpu_held_s": held[Resource.CPU] / n,
                          "cpu_grants_per_batch": grants[Resource.CPU] / n,
                          "comm_grants_per_batch": grants[Resource.COMM] / n}), flush=True)
    await runner.close()
    await dp.close()
    await ctl.close()
    pipeline.close()


# ----- the bench -----------------------------------------------------------------------------------
class Proc:
    """A process on a testbed host, talked to by lines on stdin / stdout."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process) -> None:
        self.name = name
        self.proc = proc

    async def line(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        async with asyncio.timeout(timeout):
            raw = await self.proc.stdout.readline()
        if not raw:
            raise RuntimeError(f"{self.name} exited ({await self.proc.wait()}) before answering")
        out: dict[str, Any] = json.loads(raw)
        return out

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((text + "\n").encode())

    async def stop(self) -> None:
        if self.proc.returncode is None:
            try:
                self.send("quit")
                async with asyncio.timeout(10):
                    await self.proc.wait()
            except (asyncio.TimeoutError, ConnectionError, RuntimeError):
                self.proc.kill()
                await self.proc.wait()


async def start_on(host: Any, cmd: list[str], log_path: Path, pipes: bool) -> asyncio.subprocess.Process:
    with open(log_path, "ab") as err:      # the child has its own copy of the descriptor
        return await asyncio.create_subprocess_exec(
            *host.exec_prefix(), *cmd, cwd=str(ROOT), stderr=err,
            stdin=asyncio.subprocess.PIPE if pipes else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE if pipes else asyncio.subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": str(ROOT)})


async def wait_file(path: Path, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file():
            out: dict[str, Any] = json.loads(path.read_text())
            return out
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{path} did not appear within {timeout:.0f}s")


async def run_jobs(workers: dict[str, Proc], batch: dict[str, int], seconds: float) -> dict[str, dict[str, Any]]:
    for j, w in workers.items():
        w.send(f"run {seconds} {batch[j]}")
    replies = dict(zip(workers, await asyncio.gather(*(w.line(seconds + 300) for w in workers.values()))))
    # Throughput inside the window where every job of this phase ran.
    t0 = max(r["start"] for r in replies.values())
    t1 = min(r["done"][-1] if r["done"] else r["start"] for r in replies.values())
    for r in replies.values():
        inside = sum(1 for t in r["done"] if t0 < t <= t1)
        r["iterations_per_s"] = inside / (t1 - t0) if t1 > t0 else 0.0
        r["window_s"] = t1 - t0
        del r["done"]
    return replies


async def calibrate(w: Proc, job: str, start: int, seconds: float) -> int:
    """The batch size that gives `job` its target COMP share alone: COMP time is about a + b x batch,
    COMM about constant (the whole model is pulled and pushed every mini-batch). Only sizes that
    divide a block (`batch_sizes`), so every mini-batch is alike."""
    sizes = batch_sizes(PAIR_ROWS_PER_BLOCK)
    lo = min(sizes, key=lambda b: abs(b - start))
    hi = next((b for b in sizes if b >= 2 * lo), sizes[-1])
    r_lo = (await run_jobs({job: w}, {job: lo}, seconds))[job]
    r_hi = (await run_jobs({job: w}, {job: hi}, seconds))[job]
    b = (r_hi["compute_held_s"] - r_lo["compute_held_s"]) / (hi - lo)
    a = r_lo["compute_held_s"] - b * lo
    comm = (r_lo["comm_held_s"] + r_hi["comm_held_s"]) / 2
    want = TARGET[job] / (1 - TARGET[job]) * comm
    size = min(sizes, key=lambda s: abs(s - ((want - a) / b if b > 0 else lo)))
    log(f"calibrate {job}: batch {lo}: comp {r_lo['compute_held_s'] * 1e3:.0f} ms comm {r_lo['comm_held_s'] * 1e3:.0f} ms; "
        f"batch {hi}: comp {r_hi['compute_held_s'] * 1e3:.0f} ms comm {r_hi['comm_held_s'] * 1e3:.0f} ms -> batch {size}")
    return size


def cpu_util(tb: Any, host: str, before: Optional[float], seconds: float, budget: float) -> Optional[float]:
    after = tb.cpu_seconds(host)
    return None if before is None or after is None or seconds <= 0 else round((after - before) / seconds / budget, 3)


class Testbed2:
    """The two hosts (`wk`: workers, `ps`: servers), the arbiter of `wk`, and the jobs started on them."""

    def __init__(self, ns: argparse.Namespace, base: Path) -> None:
        from elastane_cli.testbed_hosts import Testbed  # noqa: PLC0415
        from nodemanager.arbiter_server import ArbiterServer  # noqa: PLC0415

        self.ns = ns
        self.bandwidth = parse_rate(ns.bandwidth)
        self.pool = max(1, math.ceil(ns.host_cpus - 1e-9))
        self.run = base / "run"          # sockets, ready files and logs: seen at this path on every host
        self.run.mkdir()
        self.tb = Testbed(base / "testbed", 2, names=["wk", "ps"], cpus=[ns.host_cpus, ns.host_cpus],
                          bandwidth_bps=self.bandwidth, shared=[self.run])
        self.arbiter = ArbiterServer(str(self.run / "arbiter.sock"), cpu_pool=self.pool)
        self.procs: list[asyncio.subprocess.Process] = []
        self.workers: list[Proc] = []

    async def __aenter__(self) -> "Testbed2":
        self.tb.create()
        await self.arbiter.start()
        return self

    async def start_job(self, name: str, data: dict[str, Any], batch: int) -> tuple[Proc, float]:
        """A server executor on `ps` and a worker on `wk` for one job; returns the worker, once its
        model and input are set up, and the model's size (MB)."""
        wk, ps = self.tb.host("wk"), self.tb.host("ps")
        ready = self.run / f"server-{name}.json"
        self.procs.append(await start_on(ps, [sys.executable, "-m", "psruntime.executor", "--executor-id", "s",
                                              "--host", ps.ip, "--num-blocks", str(NUM_BLOCKS), "--role", "server",
                                              "--ready-file", str(ready)], self.run / f"server-{name}.log", pipes=False))
        server = (await wait_file(ready, 60))["address"]
        p = await start_on(wk, [sys.executable, str(Path(__file__).resolve()), "--worker", "--job", name,
                                "--data", json.dumps(data), "--batch", str(batch), "--server", server,
                                "--arbiter", self.arbiter.path, "--threads", str(self.ns.threads)],
                           self.run / f"worker-{name}.log", pipes=True)
        self.procs.append(p)
        w = Proc(f"worker {name}", p)
        self.workers.append(w)
        return w, float((await w.line(300))["model_mb"])

    async def stop_all(self) -> None:
        for w in self.workers:
            await w.stop()
        for p in self.procs:
            if p.returncode is None:
                p.terminate()
                try:
                    async with asyncio.timeout(10):
                        await p.wait()
                except asyncio.TimeoutError:
                    p.kill()
                    await p.wait()
        self.workers, self.procs = [], []

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc is not None:
            for f in sorted(self.run.glob("*.log")):
                log(f"{f.name} (last lines):\n" + "\n".join(f.read_text(errors="replace").splitlines()[-15:]))
        try:
            await self.stop_all()
            await self.arbiter.stop()
        finally:
            errors = self.tb.remove()
            if errors or self.tb.leftover_pids:
                log(f"testbed removal: errors {errors}, had to kill {self.tb.leftover_pids}")


async def bench(ns: argparse.Namespace, base: Path) -> dict[str, Any]:
    async with Testbed2(ns, base) as h:
        workers, models = {}, {}
        for j, (data, first_batch) in JOBS.items():
            workers[j], models[j] = await h.start_job(j, data, first_batch)
        log(f"hosts wk / ps: {ns.host_cpus} core(s) each, links {ns.bandwidth}; arbiter pool {h.pool}; "
            f"models {models} MB")
        batch = {j: await calibrate(w, j, JOBS[j][1], ns.calibrate_s) for j, w in workers.items()}
        rows: list[dict[str, Any]] = []
        for rep in range(ns.repeats):
            row: dict[str, Any] = {}
            for phase, who in (("A", ["A"]), ("B", ["B"]), ("pair", ["A", "B"])):
                c0, p0 = h.tb.cpu_seconds("wk"), h.tb.cpu_seconds("ps")
                t = time.time()
                row[phase] = await run_jobs({j: workers[j] for j in who}, batch, ns.seconds)
                c1 = h.tb.cpu_seconds("wk")
                row[phase]["_wk_cpu"] = cpu_util(h.tb, "wk", c0, time.time() - t, ns.host_cpus)
                row[phase]["_ps_cpu"] = cpu_util(h.tb, "ps", p0, time.time() - t, ns.host_cpus)
                if phase != "pair" and c0 is not None and c1 is not None:
                    # wk's CPU-seconds per iteration of the job alone: its COMP and its COMM's
                    # own CPU work (encode, decode, the data plane), which a partner's COMP meets
                    row[phase][phase]["cpu_s_per_iteration"] = (c1 - c0) / max(1, row[phase][phase]["batches"])
            rows.append(row)
            log(f"repeat {rep + 1}: " + json.dumps(summary(row, ns.host_cpus)))
        return result(rows, batch, models, ns, h.pool, h.bandwidth)


async def profile(ns: argparse.Namespace, base: Path) -> dict[str, Any]:
    """Each named workload (bench/support/harmony_workloads.py) alone on the same hosts: its
    per-mini-batch COMP and COMM held times and COMP share, median over the repeats."""
    table: dict[str, Any] = {}
    async with Testbed2(ns, base) as h:
        for name, w in WORKLOADS.items():
            if w.app != "mlr":
                continue        # the worker role runs MLR
            proc, model_mb = await h.start_job(name, w.data, int(w.hparams["batch_size"]))
            runs = [(await run_jobs({name: proc}, {name: int(w.hparams["batch_size"])}, ns.seconds))[name]
                    for _ in range(ns.repeats)]
            await h.stop_all()
            comp = statistics.median(r["compute_held_s"] for r in runs)
            comm = statistics.median(r["comm_held_s"] for r in runs)
            table[name] = {"model_mb": round(model_mb, 2), "batch_size": w.hparams["batch_size"],
                           "compute_s": round(comp, 4), "comm_s": round(comm, 4),
                           "comp_share": round(comp / (comp + comm), 3),
                           "iterations_per_s": round(statistics.median(r["iterations_per_s"] for r in runs), 3)}
            log(f"{name}: {json.dumps(table[name])}")
        pool, bandwidth = h.pool, h.bandwidth
    return {"profile": table, "host_cpu_budget": ns.host_cpus, "arbiter_cpu_pool": pool,
            "bandwidth_bps": bandwidth, "repeats": ns.repeats, "seconds": ns.seconds,
            "load_average": os.getloadavg()[0]}


def summary(row: dict[str, Any], budget: float) -> dict[str, Any]:
    """One repeat's figures: the alone profiles, eq. 4.1's prediction and the measured pair."""
    a, b = row["A"]["A"], row["B"]["B"]
    t_cpu = [a["compute_held_s"], b["compute_held_s"]]
    t_net = [a["comm_held_s"], b["comm_held_s"]]
    import numpy as np  # noqa: PLC0415
    tg = group_iteration_time(np.array(t_cpu), np.array(t_net))
    model = 2.0 / tg
    # eq. 4.1 counts only COMP as CPU; the host's budget must also carry each COMM's own CPU work.
    # With the CPU-seconds per iteration measured alone, a group iteration lasts at least their sum
    # over the budget: the interference eq. 4.1 leaves out, measured.
    cpu_s = [a.get("cpu_s_per_iteration"), b.get("cpu_s_per_iteration")]
    tg_cpu = max(tg, (cpu_s[0] + cpu_s[1]) / budget) if None not in cpu_s else None
    # The same with the CPU the host actually got alone (the most of its budget a job used alone):
    # on a loaded machine a host gets less than its budget, which the budget's bound cannot see.
    got = [row[j]["_wk_cpu"] for j in ("A", "B") if row[j]["_wk_cpu"] is not None]
    cores = max(got) * budget if got else None
    tg_got = max(tg, (cpu_s[0] + cpu_s[1]) / cores) if cores and None not in cpu_s else None
    pair = row["pair"]["A"]["iterations_per_s"] + row["pair"]["B"]["iterations_per_s"]
    return {"comp_share_A": round(t_cpu[0] / (t_cpu[0] + t_net[0]), 3),
            "comp_share_B": round(t_cpu[1] / (t_cpu[1] + t_net[1]), 3),
            "model_group_iteration_s": round(tg, 4), "model_throughput": round(model, 3),
            "pair_throughput": round(pair, 3), "pair_throughput_over_model": round(pair / model, 3),
            "model_with_cpu_work_throughput": None if tg_cpu is None else round(2.0 / tg_cpu, 3),
            "pair_over_model_with_cpu_work": None if tg_cpu is None else round(pair * tg_cpu / 2.0, 3),
            "host_cores_got_alone": None if cores is None else round(cores, 3),
            "pair_over_model_with_cpu_got": None if tg_got is None else round(pair * tg_got / 2.0, 3),
            "sequential_throughput": round(2.0 / (sum(t_cpu) + sum(t_net)), 3),
            "alone_A_iterations_per_s": round(a["iterations_per_s"], 3),
            "alone_B_iterations_per_s": round(b["iterations_per_s"], 3)}


def result(rows: list[dict[str, Any]], batch: dict[str, int], models: dict[str, float], ns: argparse.Namespace,
           pool: int, bandwidth: int) -> dict[str, Any]:
    sums = [summary(r, ns.host_cpus) for r in rows]

    def med(key: str) -> Optional[float]:
        vals = [s[key] for s in sums if s[key] is not None]
        return round(statistics.median(vals), 3) if vals else None

    def med_job(phase: str, job: str, key: str) -> float:
        return round(statistics.median(r[phase][job][key] for r in rows), 4)

    fields = ("compute_held_s", "comm_held_s", "compute_wait_s", "comm_wait_s", "iterations_per_s",
              "cpu_grants_per_batch", "comm_grants_per_batch")
    alone: dict[str, dict[str, Any]] = {
        j: {"batch_size": batch[j], "model_mb": models[j], **{k: med_job(j, j, k) for k in fields}} for j in ("A", "B")}
    for j in alone:
        vals = [r[j][j]["cpu_s_per_iteration"] for r in rows if "cpu_s_per_iteration" in r[j][j]]
        alone[j]["cpu_s_per_iteration"] = round(statistics.median(vals), 4) if vals else None
        # What a grant costs alone (no partner to wait for: the wait is the round trip), per subtask.
        a = alone[j]
        a["grant_wait_over_subtask"] = round(
            (a["compute_wait_s"] + a["comm_wait_s"]) / max(1e-9, a["compute_held_s"] + a["comm_held_s"]), 4)
    for j in alone:
        alone[j]["comp_share"] = round(alone[j]["compute_held_s"] / (alone[j]["compute_held_s"] + alone[j]["comm_held_s"]), 3)
    pair = {j: {k: med_job("pair", j, k) for k in fields} for j in ("A", "B")}

    def util(phase: str, host: str = "wk") -> Optional[float]:
        vals = [r[phase][f"_{host}_cpu"] for r in rows if r[phase][f"_{host}_cpu"] is not None]
        return round(statistics.median(vals), 3) if vals else None

    pair_t, seq_t = med("pair_throughput"), med("sequential_throughput")
    return {"pair_throughput_over_model": med("pair_throughput_over_model"),
            "pair_throughput": pair_t, "model_throughput": med("model_throughput"),
            "model_group_iteration_s": med("model_group_iteration_s"),
            "pair_over_model_with_cpu_work": med("pair_over_model_with_cpu_work"),
            "model_with_cpu_work_throughput": med("model_with_cpu_work_throughput"),
            "pair_over_model_with_cpu_got": med("pair_over_model_with_cpu_got"),
            "host_cores_got_alone": med("host_cores_got_alone"),
            "pair_over_sequential": round(pair_t / seq_t, 3) if pair_t and seq_t else None,
            "alone": alone, "pair": pair,
            "wk_cpu_utilization": {"A": util("A"), "B": util("B"), "pair": util("pair")},
            "ps_cpu_utilization": {"A": util("A", "ps"), "B": util("B", "ps"), "pair": util("pair", "ps")},
            "per_repeat": sums, "host_cpu_budget": ns.host_cpus, "arbiter_cpu_pool": pool, "comp_threads": ns.threads,
            "bandwidth_bps": bandwidth, "repeats": ns.repeats, "seconds": ns.seconds}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="one repeat of short phases")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seconds", type=float, default=15.0, help="each phase's measuring window")
    p.add_argument("--calibrate-s", type=float, default=5.0)
    p.add_argument("--bandwidth", default="100mbit", help="each host's link cap")
    p.add_argument("--host-cpus", type=float, default=0.5, help="each host's CPU budget (cores)")
    p.add_argument("--threads", type=int, default=1, help="threads of one COMP (comp_threads)")
    p.add_argument("--profile", action="store_true",
                   help="instead: each workload of bench/support/harmony_workloads.py alone, its COMP:COMM")
    # the worker role (run on the `wk` host by the bench itself)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--job", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    p.add_argument("--server", help=argparse.SUPPRESS)
    p.add_argument("--arbiter", help=argparse.SUPPRESS)
    ns = p.parse_args()
    if ns.worker:
        asyncio.run(worker(ns))
        return 0
    unwind_on_sigterm()   # a SIGTERM still removes the testbed
    if ns.quick:
        ns.repeats, ns.seconds, ns.calibrate_s = 1, 6.0, 3.0
    if ns.repeats < 1 or ns.seconds <= 0 or ns.calibrate_s <= 0 or ns.threads < 1:
        p.error("--repeats and --threads must be >= 1, --seconds and --calibrate-s > 0")
    if not 0 < ns.host_cpus <= (os.cpu_count() or 1):
        p.error(f"--host-cpus must be in (0, {os.cpu_count()}], got {ns.host_cpus}")
    try:
        parse_rate(ns.bandwidth)
    except ValueError as e:
        p.error(f"--bandwidth: {e}")
    from elastane_cli.testbed_hosts import unavailable_reason  # noqa: PLC0415
    reason = unavailable_reason()
    if reason:
        print(f"harmony_pair: cannot build the testbed's emulated hosts here: {reason}", file=sys.stderr)
        print(json.dumps({"error": f"no testbed: {reason}"}))
        return 1
    with tempfile.TemporaryDirectory(prefix="harmony-pair-") as tmp:
        out = asyncio.run((profile if ns.profile else bench)(ns, Path(tmp)))
    out.setdefault("load_average", os.getloadavg()[0])
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
