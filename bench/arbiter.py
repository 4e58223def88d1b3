"""Harmony arbiter benchmark: slot grant round trip against a bare round trip on the same channel.

    .venv/bin/python bench/arbiter.py [--samples 20000] [--rounds 5]

The arbiter (`nodemanager.arbiter_server.ArbiterServer`) runs in a second process, as in an NM, on
a unix socket; this process is the executor side (`psruntime.arbiter_client.ArbiterClient`), both
on uvloop as the daemons are. Per sample, one at a time on one connection:
- ping: PING -> PONG, the channel's bare round trip (the server decodes the frame and answers; no
  arbiter rule runs);
- grant cpu / grant comm: ACQUIRE -> GRANT of the CPU / the primary network slot, then RELEASE
  (no reply: it goes out with the next request), i.e. what a Harmony subtask pays per subtask
  when its slot is free;
- handoff: two connections of two jobs; A holds the CPU slot and B waits for it; the time from A's
  RELEASE to B's GRANT (what the next job's COMP waits beyond the previous one's end).
Rounds alternate the kinds, each kind's samples pooled over the rounds. Prints a summary, then one
JSON object as the last line (latencies in microseconds; `grant_over_ping_p50` = grant cpu p50 /
ping p50).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nodemanager.arbiter_server import ArbiterServer
from protocol.arbiter_wire import SlotKind
from protocol.daemon import install_uvloop
from psruntime.arbiter_client import ArbiterClient

KINDS = ("ping", "grant_cpu", "grant_comm", "handoff")


async def serve(path: str) -> None:
    server = ArbiterServer(path)
    await server.start()
    try:
        await asyncio.Event().wait()
    finally:
        await server.stop()


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


async def measure(kind: str, a: ArbiterClient, b: ArbiterClient, n: int) -> list[float]:
    out: list[float] = []
    clock = time.perf_counter
    if kind == "ping":
        for _ in range(n):
            t0 = clock()
            await a.ping()
            out.append(clock() - t0)
    elif kind in ("grant_cpu", "grant_comm"):
        slot = SlotKind.CPU if kind == "grant_cpu" else SlotKind.COMM
        for _ in range(n):
            t0 = clock()
            g = await a.acquire(slot)
            out.append(clock() - t0)
            a.release(g)
    else:
        held = await a.acquire(SlotKind.CPU)
        for _ in range(n):
            waiting = asyncio.ensure_future(b.acquire(SlotKind.CPU))
            await b.ping()          # B's request has reached the arbiter and waits
            t0 = clock()
            a.release(held)
            got = await waiting
            out.append(clock() - t0)
            held_next = asyncio.ensure_future(a.acquire(SlotKind.CPU))
            await a.ping()
            b.release(got)
            held = await held_next
        a.release(held)
    return out


async def bench(path: str, samples: int, rounds: int) -> dict[str, float]:
    a = ArbiterClient(path, "application_1_0001", "container_1_0001_01_000002")
    b = ArbiterClient(path, "application_1_0002", "container_1_0002_01_000002")
    for c in (a, b):
        for _ in range(200):
            try:
                await c.connect()
                break
            except ConnectionError:
                await asyncio.sleep(0.05)
        else:
            raise SystemExit(f"arbiter at {path} never came up")
    per_round = max(1, samples // rounds)
    got: dict[str, list[float]] = {k: [] for k in KINDS}
    for k in KINDS:                     # warm-up
        await measure(k, a, b, min(500, per_round))
    for _ in range(rounds):
        for k in KINDS:
            got[k] += await measure(k, a, b, per_round if k != "handoff" else max(1, per_round // 4))
    await a.close()
    await b.close()
    res: dict[str, float] = {}
    for k in KINDS:
        res[f"{k}_p50_us"] = round(percentile(got[k], 0.5) * 1e6, 2)
        res[f"{k}_p99_us"] = round(percentile(got[k], 0.99) * 1e6, 2)
    res["grant_over_ping_p50"] = round(res["grant_cpu_p50_us"] / res["ping_p50_us"], 3)
    res["grant_overhead_p50_us"] = round(res["grant_cpu_p50_us"] - res["ping_p50_us"], 2)
    res["samples"] = per_round * rounds
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=20000, help="per kind, over all rounds")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--serve", help=argparse.SUPPRESS)     # the arbiter process
    args = p.parse_args()
    install_uvloop()
    if args.serve:
        asyncio.run(serve(args.serve))
        return
    with tempfile.TemporaryDirectory(prefix="arb-") as d:
        path = os.path.join(d, "arbiter.sock")
        proc = subprocess.Popen([sys.executable, __file__, "--serve", path])
        try:
            res = asyncio.run(bench(path, args.samples, args.rounds))
        finally:
            proc.terminate()
            proc.wait(10)
    for k in KINDS:
        print(f"{k:11s} p50 {res[f'{k}_p50_us']:8.1f} us   p99 {res[f'{k}_p99_us']:8.1f} us")
    print(f"grant / ping p50: {res['grant_over_ping_p50']:.2f} (+{res['grant_overhead_p50_us']:.1f} us)")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
