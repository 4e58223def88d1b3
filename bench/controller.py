"""How long one step of the PS-job controller takes, against a clock's own messaging.

The controller (appmaster/ps/controller) handles every clock's ClockDone event on the AM's event
loop, so its cost is paid once per BSP clock. Measured here: `handle` on a ClockDone event of a
16-worker, 4-server job that is training (the common case, no change running), and -- to show it
is beside the point of a clock -- the same for an EpochDone event (an epoch end, where a due
checkpoint is planned).

Baseline, measured in the same run: the floor of a clock's own cost, its messaging alone -- the
AM encodes one RunClock request per worker, sends them over loopback TCP, each is echoed back
and decoded (no compute, no pushes, no pulls: a real clock costs more). `controller_over_clock_floor`
is the controller's p50 over that floor's p50.

Output (last line, JSON): controller_event_us_p50, controller_event_us_p99, epoch_event_us_p50,
clock_floor_us_p50, clock_floor_us_p99, controller_over_clock_floor, workers, repeats, load_before.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import msgspec
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from appmaster.ps.controller import events as ev
from appmaster.ps.controller.core import handle
from appmaster.ps.controller.records import ExecutorInfo, Holdings, Role
from appmaster.ps.controller.state import Executor, ExecutorState, JobState
from appmaster.ps.controller.phases import Phase
from protocol import executor_ops as ops
from protocol import ps_job_spec


def training_job(workers: int, servers: int) -> JobState:
    spec = ps_job_spec.validate({"app": "mlr", "preset": "small", "workers": workers, "servers": servers})
    job = JobState(spec=spec, phase=Phase.TRAINING)
    for role, n in ((Role.WORKER, workers), (Role.SERVER, servers)):
        for i in range(n):
            info = ExecutorInfo(executor_id=f"{role.value}-{i}", role=role, container_id=f"c-{role.value}-{i}",
                                node=f"n{i % 4}")
            job.executors[info.executor_id] = Executor(info, ExecutorState.READY)
            job.containers[info.container_id] = info.executor_id
    job.holdings = Holdings(blocks={f"server-{i}": list(range(i, spec.num_blocks, servers)) for i in range(servers)},
                            splits={f"worker-{i}": list(range(i, 8 * workers, workers)) for i in range(workers)})
    return job


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def time_controller(workers: int, repeats: int) -> tuple[list[float], list[float]]:
    job = training_job(workers, 4)
    clocks, epochs = [], []
    for i in range(repeats):
        e = ev.ClockDone(at=float(i), clock=i, epoch=i // 100, iterations=i)
        t0 = time.perf_counter_ns()
        handle(job, e)
        clocks.append((time.perf_counter_ns() - t0) / 1e3)
    for i in range(max(1, repeats // 10)):
        e2 = ev.EpochDone(at=float(i), epoch=i, objective=1.0 / (i + 1), epoch_time_s=1.0)
        t0 = time.perf_counter_ns()
        handle(job, e2)
        epochs.append((time.perf_counter_ns() - t0) / 1e3)
    return clocks, epochs


async def time_clock_floor(workers: int, repeats: int) -> list[float]:
    """One 'clock' = every worker's RunClock encoded, sent on its own loopback connection,
    echoed, read back and decoded."""
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                n = int.from_bytes(await reader.readexactly(4), "big")
                body = await reader.readexactly(n)
                writer.write(len(body).to_bytes(4, "big") + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(workers)]
    encoder, decoder = msgspec.json.Encoder(), msgspec.json.Decoder(ops.RunClock)

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, epoch: int) -> None:
        body = encoder.encode(ops.RunClock(epoch=epoch, batches=4, num_workers=workers))
        writer.write(len(body).to_bytes(4, "big") + body)
        await writer.drain()
        n = int.from_bytes(await reader.readexactly(4), "big")
        decoder.decode(await reader.readexactly(n))

    times = []
    for i in range(repeats):
        t0 = time.perf_counter_ns()
        await asyncio.gather(*(one(r, w, i) for r, w in conns))
        times.append((time.perf_counter_ns() - t0) / 1e3)
    for _, w in conns:
        w.close()
    server.close()
    await server.wait_closed()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=20000)
    ap.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    args = ap.parse_args()
    repeats = 2000 if args.quick else args.repeats
    load = os.getloadavg()[0]
    clocks, epochs = time_controller(args.workers, repeats)
    floor = asyncio.run(time_clock_floor(args.workers, max(200, repeats // 20)))
    out = {
        "controller_event_us_p50": round(statistics.median(clocks), 3),
        "controller_event_us_p99": round(percentile(clocks, 0.99), 3),
        "epoch_event_us_p50": round(statistics.median(epochs), 3),
        "clock_floor_us_p50": round(statistics.median(floor), 1),
        "clock_floor_us_p99": round(percentile(floor, 0.99), 1),
        "controller_over_clock_floor": round(statistics.median(clocks) / statistics.median(floor), 5),
        "workers": args.workers, "repeats": repeats, "load_before": round(load, 2),
        "saturated": load > (os.cpu_count() or 1),
    }
    print(orjson.dumps(out).decode())


if __name__ == "__main__":
    main()
