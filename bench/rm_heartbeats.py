"""Highest NM heartbeat rate a real RM process sustains on one core with p99 < 50 ms, against the
ceiling of a bare aiohttp endpoint on that core under the same load, in the same run.

The server under test (the RM, then a bare aiohttp endpoint that echoes a small JSON body) runs as its
own process pinned to the first core this process may use. The load comes from --clients client
processes (default: one per remaining core, at least 2, at most 8), pinned round-robin to the other
cores, each with its own event loop, its own keep-alive connections (a raw asyncio HTTP/1.1 client)
and its own slice of the simulated nodes. The load is open-loop: every client sends its share of the
target rate on a fixed schedule that starts at the same instant in every client, each node with at
most one heartbeat in flight (like a real NM); heartbeats are sent when due, in batches at most 1 ms
apart (the event loop's timer resolution), never early, and latency is measured from the scheduled
send time, so queueing in the generator counts against the server, never in its favour. The rate steps up until
p99 exceeds the bound, the achieved rate falls below 95% of the target, or a request fails; the best
step that passed is the figure (a step that fails without errors is tried once more, so one noisy
step on a shared host does not end the ladder). After the ladder one flat-out step sends on every
connection as soon as its reply is in (closed loop): the most the server takes at any latency. Both
servers get the same generator, the same ladder and the same core, so the ratios compare the RM with
what aiohttp itself can do there.

Whether the generator was the limit is measured, not assumed: each step records the CPU the client
processes used (per generator core: 1.0 = that core was busy all the time) and the CPU of the server
process (all its threads). `*_limited_by` names what ran out at the step where a ladder stopped:
"generator" (a generator core was >= 85% busy), "server" (the server's core was), or "unclear". The
ratio is the RM's ceiling against the bare endpoint's only when the echo ladder was server-bound
(`ceiling_is_server_bound`).

On a 2-core machine the server gets one core and the whole generator the other, so the generator has
no more CPU than the server (the steps' CPU figures say whether it ran out), and the two share the
machine (the loopback network stack, other processes), which shows as p99 spikes well below either
core's limit: the output says so (`shared_host_note`). There the flat-out figures, taken with the
server's core busy, are the steadier comparison. On a many-core host the generator has several cores
to itself.

The RM's ladder runs twice over, interleaved on the same RM process and generator: at each rate a
step of plain heartbeats and one whose heartbeats each carry a utilization report (--util-containers
containers, listed in every LIST_EVERY-th report as an NM does, the sums in every one), in
alternating order; the flat-out step likewise, three times each
(ABBAAB), the median counting. `utilization_payload_ratio` is the sustained rate with reports
against without (target >= 0.9), `utilization_flat_out_ratio` the same for the flat-out medians (the
steadier figure on a 2-core host) and `utilization_cpu_ratio` heartbeats per second of the server's
CPU with reports against without (what a heartbeat costs, which holds where other processes take
the server's core part of the time); `rm_*` figures are the plain side's.

Last line: {"rm_heartbeats_per_s", "rm_p99_ms", "echo_ceiling_per_s", "ratio_to_ceiling", ...,
"meets_target", "meets_target_reason", "with_utilization_rate", "utilization_payload_ratio",
"utilization_flat_out_ratio", ...}. `meets_target` (>= 5000/s at p99 < 50 ms and >= 0.6 of the
ceiling) is null, inconclusive, when the echo ladder was not server-bound or the generator ran out
during the RM's (`heartbeat_verdict`). A step in which no heartbeat completed has `completed` 0 and
null latencies (it fails); a ladder with no passing step gives 0/s and null latencies.

`--policy dorm` measures something else: heartbeat latency while a policy decides (issue 25: the
policy's `decide` runs in a worker thread, rm/server.py). An RM process (bench/support/policy_rm.py:
the real server and HTTP API, a seeded Dorm Table II workload on Dorm-shaped nodes, one job killed
and one submitted every --dorm-churn-s so Dorm solves its MILP round after round, its time limit
--dorm-time-limit-s) takes heartbeats at a fixed --hb-rate from the generator's nodes (which join
the cluster, so the MILP covers them too) for --duration s; the same with `static`, same workload
and churn; --repeats times each, alternating, medians counting. With --on-loop-reference one more
dorm run decides on the loop (the old way), for reference. The RM process may use a second core
for the policy thread (the loop stays pinned with it; the generator shares that core on a 2-core
host). Last line: {"p99_ratio_dorm_vs_static", "p99_ms_dorm", "p99_ms_static", "dorm_solve_s",
"runs_without_replies" (per policy: runs in which no heartbeat completed, left out of the
medians), ...}: target ratio <= 1.2; the solve (the median Dorm decide that solved P2) must take > 1 s to mean anything.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

P99_BOUND_MS = 50.0
RATES = [1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 10000, 12000, 15000, 20000, 25000, 30000, 40000]
BUSY = 0.85            # a core this busy during a step is taken to be the limit
START_LEAD_S = 0.3     # the clients start each step this long after the driver sends it
DRAIN_S = 10.0         # a step's last replies must arrive this long after its last send
READY_TIMEOUT_S = 120.0
MAX_CLIENTS = 64
UTIL_TARGET_RATIO = 0.9
FLAT_OUT_ORDER = (False, True, True, False, False, True)   # with utilization? ABBAAB cancels drift


# An NM sends its per-container list with every LIST_EVERY-th report (every 5 s at the default 1 s
# heartbeat: nodemanager/utilization_monitor.py), the sums with every one.
LIST_EVERY = 5


def utilization_report(i: int, n_containers: int, with_list: bool = True) -> dict[str, Any]:
    """A node's utilization report as an NM sends it (protocol NodeUtilization) with `n_containers`
    containers (listed only `with_list`), figures varied per node so nothing is a constant the
    server could skip."""
    app = f"application_1700000000000_{i % 97 + 1:04d}"
    containers = [{"container_id": f"container_1700000000000_{i % 97 + 1:04d}_01_{i * 16 + k:06d}",
                   "app_id": app, "cpu_cores": 0.5 + k * 0.125, "memory_mb": 512.0 + k,
                   "spill_bytes": 4096, "role": "worker" if k else "server"} for k in range(n_containers)]
    out: dict[str, Any] = {
        "sampled_ms": 1_700_000_000_000 + i, "cpu_cores": 1.25 + i % 7, "host_cores": 16,
        "memory_mb": 20480.5 + i, "memory_total_mb": 65536.0, "net_rx_bytes_per_s": 1.5e7 + i,
        "net_tx_bytes_per_s": 9.1e6 + i, "spill_bytes": 4096 * n_containers,
        "containers_cpu_cores": sum(c["cpu_cores"] for c in containers),
        "containers_memory_mb": sum(c["memory_mb"] for c in containers)}
    if with_list:
        out["containers"] = containers
    return out


# ----------------------------------------------------------------------------- client side

class _Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection with at most one request in flight."""

    def __init__(self):
        self.transport = None
        self.buf = bytearray()
        self.waiter: asyncio.Future | None = None

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.buf += data
        head_end = self.buf.find(b"\r\n\r\n")
        if head_end < 0:
            return
        head = bytes(self.buf[:head_end]).lower()
        i = head.find(b"content-length:")
        length = int(head[i + 15:head.find(b"\r\n", i) if head.find(b"\r\n", i) > 0 else None]) if i >= 0 else 0
        total = head_end + 4 + length
        if len(self.buf) < total:
            return
        status = int(head[9:12])
        body = bytes(self.buf[head_end + 4:total])
        del self.buf[:total]
        if self.waiter and not self.waiter.done():
            self.waiter.set_result((status, body))

    def connection_lost(self, exc):
        if self.waiter and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("connection lost"))

    async def request(self, raw: bytes):
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(raw)
        return await self.waiter


def _http_post(host: str, path: str, body: bytes, token: str | None) -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{auth}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


class _LoadClient:
    """One client process's part of the load: its connections and its slice of the simulated nodes."""

    def __init__(self, args, node_ids: list[str]):
        self.args = args
        self.node_ids = node_ids
        self.idle: asyncio.Queue[_Conn] = asyncio.Queue()
        self.node_tokens: dict[str, str] = {}
        self.response_ids: dict[str, int] = {}
        self.utilization = {nid: (utilization_report(i, args.util_containers),
                                  utilization_report(i, args.util_containers, with_list=False))
                            for i, nid in enumerate(node_ids)}
        self.reports_sent: dict[str, int] = {nid: 0 for nid in node_ids}

    async def connect(self, n: int) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(n):
            _, proto = await loop.create_connection(_Conn, self.args.host, self.args.port)
            self.idle.put_nowait(proto)

    async def register(self) -> None:
        """Register this client's nodes with the RM (not timed)."""
        import orjson

        from protocol import tokens

        for nid in self.node_ids:
            self.node_tokens[nid] = tokens.sign(self.args.secret, tokens.NM, {"node_id": nid}, 3600)

        async def one(nid: str) -> None:
            c = await self.idle.get()
            try:
                body = orjson.dumps({"node_id": nid, "http_address": nid,
                                     "capability": {"memory": 8192, "vCores": 8}})
                status, out = await c.request(_http_post(self.args.host, "/internal/v1/node/register", body,
                                                         self.node_tokens[nid]))
                if status != 200:
                    raise RuntimeError(f"register {nid}: {status} {out[:200]!r}")
                self.response_ids[nid] = 0
            finally:
                self.idle.put_nowait(c)
        async with asyncio.timeout(READY_TIMEOUT_S):
            await asyncio.gather(*(one(n) for n in self.node_ids))

    async def step(self, rate: float, start_at: float, duration: float, utilization: bool = False) -> dict[str, Any]:
        """From wall-clock time `start_at` (shared by all clients), for `duration` s: send `rate`
        heartbeats/s on a fixed schedule (open loop), or, with `rate` 0, send on every connection as
        soon as its previous reply is in (closed loop: the most the server can take, whatever the latency).
        With `utilization` every RM heartbeat carries its node's utilization report."""
        import orjson

        args, host, idle = self.args, self.args.host, self.idle
        n_nodes = len(self.node_ids)
        latencies: list[float] = []
        errors = 0
        skipped = 0
        in_flight: set[str] = set()

        async def send(c: _Conn, nid: str, t_from: float) -> None:
            nonlocal errors
            try:
                if args.mode == "rm":
                    hb = {"node_id": nid, "response_id": self.response_ids[nid],
                          "used": {"memory": 0, "vCores": 0}, "container_statuses": []}
                    if utilization:
                        n = self.reports_sent[nid]
                        self.reports_sent[nid] = n + 1
                        hb["utilization"] = self.utilization[nid][0 if n % LIST_EVERY == 0 else 1]
                    body = orjson.dumps(hb)
                    raw = _http_post(host, "/internal/v1/node/heartbeat", body, self.node_tokens[nid])
                else:
                    body = orjson.dumps({"node_id": nid, "response_id": 0})
                    raw = _http_post(host, "/echo", body, None)
                status, out = await c.request(raw)
                if status != 200:
                    errors += 1
                elif args.mode == "rm":
                    self.response_ids[nid] = orjson.loads(out)["response_id"]
                latencies.append(time.perf_counter() - t_from)
            except Exception:
                errors += 1
            finally:
                in_flight.discard(nid)

        async def scheduled(nid: str, t_sched: float) -> None:
            c = await idle.get()
            try:
                await send(c, nid, t_sched)
            finally:
                idle.put_nowait(c)

        async def flat_out(c: _Conn, stop_at: float) -> None:
            nonlocal k
            while time.perf_counter() < stop_at:
                for _ in range(n_nodes):  # the next node without a heartbeat in flight
                    nid = self.node_ids[k % n_nodes]
                    k += 1
                    if nid not in in_flight:
                        break
                else:
                    return
                in_flight.add(nid)
                await send(c, nid, time.perf_counter())

        delay = start_at - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks = []
        k = 0
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        if rate > 0:
            n_req = int(rate * duration)
            interval = 1.0 / rate
            while k < n_req:
                # Send every heartbeat that is due, never one early, then sleep to the next one;
                # latency counts from the scheduled time, so a late send counts against the server.
                now = time.perf_counter()
                while k < n_req and t0 + k * interval <= now:
                    nid = self.node_ids[k % n_nodes]
                    if nid in in_flight:  # a real NM never has two heartbeats in flight
                        skipped += 1
                    else:
                        in_flight.add(nid)
                        tasks.append(asyncio.ensure_future(scheduled(nid, t0 + k * interval)))
                    k += 1
                if k < n_req:
                    # At least 1 ms: the loop's timers have ms resolution, and a shorter sleep returns
                    # at once, so the generator would spin and look saturated; sends go in <= 1 ms batches.
                    await asyncio.sleep(max(0.001, t0 + k * interval - time.perf_counter()))
        else:
            conns = [idle.get_nowait() for _ in range(idle.qsize())]
            tasks = [asyncio.ensure_future(flat_out(c, t0 + duration)) for c in conns]
            for c in conns:
                idle.put_nowait(c)  # each worker keeps using its own connection until it stops
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=duration + DRAIN_S)
            for t in pending:  # counted as errors, so the ladder stops at this step
                t.cancel()
            errors += len(pending)
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        return {"latencies_ms": sorted(round(x * 1000, 3) for x in latencies), "errors": errors,
                "skipped": skipped, "elapsed_s": elapsed, "cpu_s": cpu}


async def _client_main(args) -> None:
    """A client process: connect (and register its nodes with the RM), say ready, then run the steps
    the driver sends on stdin, one JSON line each, answering each with one JSON line on stdout."""
    all_nodes = [f"sim-{i:05d}.bench:{10000 + i}" for i in range(args.nodes)]
    client = _LoadClient(args, all_nodes[args.client_index::args.clients])
    await client.connect(args.connections)
    if args.mode == "rm":
        await client.register()
    print(json.dumps({"ready": True}), flush=True)
    loop = asyncio.get_running_loop()
    # Each ladder step at most twice, with and without utilization, the flat-out steps, stop.
    for _ in range(4 * len(args.rates) + len(FLAT_OUT_ORDER) + 2):
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line.strip():
            break
        cmd = json.loads(line)
        if cmd.get("stop"):
            break
        result = await client.step(cmd["rate"], cmd["start_at"], cmd["duration"], cmd.get("utilization", False))
        print(json.dumps(result), flush=True)


# ----------------------------------------------------------------------------- echo server

def _echo_main(port_file: str) -> None:
    from aiohttp import web

    from protocol.daemon import install_uvloop

    install_uvloop()

    async def echo(request):
        body = await request.read()
        return web.Response(body=body, content_type="application/json")

    async def main():
        app = web.Application()
        app.router.add_post("/echo", echo)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]      # the bound port (port 0: ephemeral)
        Path(port_file + ".tmp").write_text(str(port))
        os.replace(port_file + ".tmp", port_file)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await runner.cleanup()

    asyncio.run(main())


# ----------------------------------------------------------------------------- driver

def _cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def _pin(core: int):
    def f():
        try:
            os.sched_setaffinity(0, {core})
        except (AttributeError, OSError):
            pass
    return f


def _layout(n_clients: int) -> tuple[int, list[int]]:
    """The server's core and each client's core: the server alone on the first core, the clients
    round-robin on the others (on the server's core only when there is no other)."""
    cores = _cores()
    gen_cores = cores[1:] or cores[:1]
    return cores[0], [gen_cores[i % len(gen_cores)] for i in range(n_clients)]


def _cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process, all its threads (Linux /proc; None elsewhere: a NaN
    would make the last line invalid JSON)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _wait_file(path: Path, proc: subprocess.Popen, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before becoming ready")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} not written")
        time.sleep(0.05)
    return path.read_text()


class _Generator:
    """The load generator's client processes for one server: started together, stepped together,
    stopped by pid."""

    def __init__(self, mode: str, port: int, secret: str, args, client_cores: list[int]):
        self.client_cores = client_cores
        n = len(client_cores)
        per_client_conns = max(1, math.ceil(args.connections / n))
        self.procs: list[subprocess.Popen] = []
        self.bufs: dict[int, bytearray] = {}
        for i, core in enumerate(client_cores):
            cmd = [sys.executable, __file__, "--client", mode, "--client-index", str(i), "--clients", str(n),
                   "--port", str(port), "--secret", secret, "--nodes", str(args.nodes),
                   "--connections", str(per_client_conns), "--rates", ",".join(map(str, args.rates)),
                   "--util-containers", str(args.util_containers)]
            p = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
                                 preexec_fn=_pin(core))
            self.procs.append(p)
            self.bufs[p.pid] = bytearray()

    def _read_lines(self, timeout_s: float) -> list[dict]:
        """One JSON line from every client, within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        lines: dict[int, dict] = {}
        with selectors.DefaultSelector() as sel:
            for p in self.procs:
                assert p.stdout is not None
                sel.register(p.stdout, selectors.EVENT_READ, p)
            while len(lines) < len(self.procs):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{len(self.procs) - len(lines)} load clients did not answer in {timeout_s:g} s")
                for key, _ in sel.select(min(left, 1.0)):
                    p = key.data
                    chunk = os.read(key.fd, 1 << 20)
                    if not chunk:
                        raise RuntimeError(f"load client {p.pid} exited with {p.wait(timeout=5)}")
                    buf = self.bufs[p.pid]
                    buf += chunk
                    nl = buf.find(b"\n")
                    if nl >= 0:
                        lines[p.pid] = json.loads(bytes(buf[:nl]))
                        del buf[:nl + 1]
                        sel.unregister(p.stdout)
        return [lines[p.pid] for p in self.procs]

    def wait_ready(self) -> None:
        self._read_lines(READY_TIMEOUT_S)

    def step(self, rate: int, duration: float, server_pid: int, utilization: bool = False) -> dict[str, Any]:
        """Run one ladder step on all clients at once and merge what they measured."""
        n = len(self.procs)
        start_at = time.time() + START_LEAD_S
        cmd = json.dumps({"rate": rate / n, "start_at": start_at, "duration": duration,
                          "utilization": utilization}).encode() + b"\n"
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write(cmd)
        time.sleep(max(0.0, start_at - time.time()))
        cpu0, t0 = _cpu_s(server_pid), time.perf_counter()
        parts = self._read_lines(duration + DRAIN_S + 30.0)
        cpu1, wall = _cpu_s(server_pid), time.perf_counter() - t0
        server_cpu = None if cpu0 is None or cpu1 is None else (cpu1 - cpu0) / wall
        return merge_step(rate, parts, self.client_cores, server_cpu)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None and p.stdin is not None:
                try:
                    p.stdin.write(json.dumps({"stop": True}).encode() + b"\n")
                    p.stdin.close()
                except OSError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def merge_step(rate: int, parts: list[dict], client_cores: list[int], server_cpu: float | None) -> dict[str, Any]:
    """One step's figures from what every client measured. A step in which no heartbeat completed
    has no latency: p50/p99 None (never inf, which is no JSON) and `completed` 0, so it fails."""
    latencies = sorted(x for r in parts for x in r["latencies_ms"])
    done = len(latencies)
    elapsed = max(r["elapsed_s"] for r in parts)
    busy_by_core: dict[int, float] = {}
    for core, r in zip(client_cores, parts):
        busy_by_core[core] = busy_by_core.get(core, 0.0) + r["cpu_s"] / r["elapsed_s"]
    return {"target": rate, "achieved": round(done / elapsed, 1), "completed": done,
            "p50_ms": round(latencies[done // 2], 2) if done else None,
            "p99_ms": round(latencies[min(done - 1, int(done * 0.99))], 2) if done else None,
            "errors": sum(r["errors"] for r in parts), "skipped": sum(r["skipped"] for r in parts),
            "server_cpu": None if server_cpu is None else round(server_cpu, 3),
            "generator_cpu": round(sum(busy_by_core.values()), 3),
            "generator_core_busy_max": round(max(busy_by_core.values()), 3)}


def _passed(r: dict) -> bool:
    return (r["p99_ms"] is not None and r["p99_ms"] <= P99_BOUND_MS and r["achieved"] >= 0.95 * r["target"]
            and not r["errors"])


def _ladder(mode: str, port: int, server_pid: int, secret: str, args,
            client_cores: list[int]) -> tuple[list[dict], dict | None]:
    """The rate ladder's steps, then one flat-out (closed-loop) step: the most the server takes."""
    gen = _Generator(mode, port, secret, args, client_cores)
    results: list[dict] = []
    flat_out = None
    try:
        gen.wait_ready()
        for rate in args.rates:
            r = gen.step(rate, args.duration, server_pid)
            if not _passed(r) and not r["errors"]:
                # One more try: on a shared host one noisy step should not end the ladder.
                print(f"{mode}: {json.dumps(r)} (trying again)", file=sys.stderr, flush=True)
                r = gen.step(rate, args.duration, server_pid)
                r["tries"] = 2
            results.append(r)
            print(f"{mode}: {json.dumps(r)}", file=sys.stderr, flush=True)
            if not _passed(r):
                break
        if not results[-1]["errors"]:  # after errors the connections may hold stale replies
            flat_out = gen.step(0, args.duration, server_pid)
            print(f"{mode} flat out: {json.dumps(flat_out)}", file=sys.stderr, flush=True)
    finally:
        gen.stop()
    return results, flat_out


def _paired_ladder(port: int, server_pid: int, secret: str, args,
                   client_cores: list[int]) -> tuple[list[dict], list[dict], list[dict], list[dict]]:
    """The RM's ladder without and with utilization reports, interleaved on one generator: at each
    rate both (in alternating order, so drift of a shared host hits both alike), each side until it
    fails; then flat-out steps in the order FLAT_OUT_ORDER, each side's median the figure."""
    gen = _Generator("rm", port, secret, args, client_cores)
    results: dict[bool, list[dict]] = {False: [], True: []}
    flat: dict[bool, list[dict]] = {False: [], True: []}
    name = {False: "rm", True: "rm+utilization"}
    try:
        gen.wait_ready()
        live = {False: True, True: True}
        for i, rate in enumerate(args.rates):
            for util in ((False, True) if i % 2 == 0 else (True, False)):
                if not live[util]:
                    continue
                r = gen.step(rate, args.duration, server_pid, util)
                if not _passed(r) and not r["errors"]:
                    print(f"{name[util]}: {json.dumps(r)} (trying again)", file=sys.stderr, flush=True)
                    r = gen.step(rate, args.duration, server_pid, util)
                    r["tries"] = 2
                results[util].append(r)
                print(f"{name[util]}: {json.dumps(r)}", file=sys.stderr, flush=True)
                live[util] = _passed(r)
            if not any(live.values()):
                break
        if not any(rs and rs[-1]["errors"] for rs in results.values()):
            for util in FLAT_OUT_ORDER:
                r = gen.step(0, args.duration, server_pid, util)
                flat[util].append(r)
                print(f"{name[util]} flat out: {json.dumps(r)}", file=sys.stderr, flush=True)
    finally:
        gen.stop()

    return results[False], flat[False], results[True], flat[True]


def _median_step(steps: list[dict]) -> dict | None:
    return sorted(steps, key=lambda r: r["achieved"])[len(steps) // 2] if steps else None


def _per_cpu_s(steps: list[dict]) -> float | None:
    """Median heartbeats per second of server CPU over flat-out steps: what one heartbeat costs the
    server, which holds on a host where other processes take the server's core part of the time."""
    rates = sorted(r["achieved"] / r["server_cpu"] for r in steps if r["server_cpu"] is not None and r["server_cpu"] > 0)
    return round(rates[len(rates) // 2], 1) if rates else None


def _best(results: list[dict]) -> dict:
    """The passing step with the highest rate; with none, 0/s and no latency (None, not NaN)."""
    ok = [r for r in results if _passed(r)]
    return max(ok, key=lambda r: r["achieved"]) if ok else {"achieved": 0.0, "p50_ms": None, "p99_ms": None}


def _ran_out(step: dict | None) -> str:
    """What was busy during a step: "generator" (a generator core), "server" (its core), or "unclear"."""
    if step is None:
        return "unclear"
    if step["generator_core_busy_max"] >= BUSY:
        return "generator"
    if step["server_cpu"] is not None and step["server_cpu"] >= BUSY:
        return "server"
    return "unclear"


def _limited_by(results: list[dict]) -> str:
    """What ran out at the step where the ladder stopped, or "not reached" when the top rate passed."""
    if not results or _passed(results[-1]):
        return "not reached"
    return _ran_out(results[-1])


TARGET_PER_S = 5000
TARGET_RATIO = 0.6


def heartbeat_verdict(rm_best: dict, ratio: float | None, echo_limit: str, rm_limit: str) -> tuple[bool | None, str]:
    """`meets_target` and why: the RM sustains TARGET_PER_S at p99 under the bound and TARGET_RATIO
    of the bare endpoint's ceiling. None (inconclusive) when the figures cannot say: the echo ladder
    did not stop on the server (then the ratio is not against aiohttp's ceiling) or the generator
    ran out (then the RM's rate may be the generator's)."""
    if echo_limit != "server":
        return None, f"the echo ceiling is not server-bound (limited by: {echo_limit})"
    if rm_limit == "generator":
        return None, "the load generator saturated during the RM's ladder"
    ok = (rm_best["achieved"] >= TARGET_PER_S and rm_best["p99_ms"] is not None and rm_best["p99_ms"] < P99_BOUND_MS
          and ratio is not None and ratio >= TARGET_RATIO)
    return ok, (f"{rm_best['achieved']:.0f}/s at p99 {rm_best['p99_ms']} ms, {ratio} of the ceiling "
                f"(target {TARGET_PER_S}/s, p99 < {P99_BOUND_MS:g} ms, >= {TARGET_RATIO})")


def median_of_runs(runs: list[dict], key: str) -> float | None:
    """The median of the runs' `key` over the runs that have one (a run in which no heartbeat
    completed has no latency); None when none has."""
    xs = [r[key] for r in runs if r.get(key) is not None]
    return _median(xs) if xs else None


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


# ----------------------------------------------------------------------------- --policy

def _policy_run(policy: str, on_loop: bool, args, tmp: Path, secret: str, server_cores: set[int],
                client_cores: list[int]) -> dict[str, Any]:
    """One RM process deciding with `policy` under the seeded churn: the heartbeat step's figures and
    the policy rounds' and Dorm's solves' times."""
    port_file = tmp / f"{policy}-{time.monotonic_ns()}.port"
    env = dict(os.environ, ELASTANE_LOG_LEVEL="WARNING")

    def pin() -> None:
        try:
            os.sched_setaffinity(0, server_cores)
        except (AttributeError, OSError):
            pass

    cmd = [sys.executable, __file__, "--policy-server", str(port_file), "--server-policy", policy,
           "--secret", secret, "--dorm-jobs", str(args.dorm_jobs), "--dorm-seed-nodes", str(args.dorm_seed_nodes),
           "--dorm-time-limit-s", str(args.dorm_time_limit_s), "--dorm-mip-gap", str(args.dorm_mip_gap),
           "--dorm-churn-s", str(args.dorm_churn_s)
           ] + (["--on-loop"] if on_loop else [])
    server = subprocess.Popen(cmd, cwd=ROOT, env=env, preexec_fn=pin)
    try:
        port = int(_wait_file(port_file, server, READY_TIMEOUT_S))
        gen = _Generator("rm", port, secret, args, client_cores)
        try:
            gen.wait_ready()
            step = gen.step(args.hb_rate, args.duration, server.pid)
        finally:
            gen.stop()
    finally:
        _stop([server])
    result_file = Path(str(port_file) + ".result")
    rounds = json.loads(result_file.read_text()) if result_file.exists() else {"round_s": [], "solve_s": []}
    times, solves = sorted(rounds["round_s"]), sorted(rounds.get("solve_s", []))
    step.update(policy=policy + ("-on-loop" if on_loop else ""), rounds=len(times),
                round_median_s=round(times[len(times) // 2], 3) if times else None,
                round_max_s=round(times[-1], 3) if times else None, solves=len(solves),
                solve_median_s=round(solves[len(solves) // 2], 3) if solves else None,
                applied=rounds.get("applied"), dropped=rounds.get("dropped"))
    print(f"policy run: {json.dumps(step)}", file=sys.stderr, flush=True)
    return step


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def _policy_main(args) -> None:
    from protocol import tokens

    cores = _cores()
    server_core, client_cores = _layout(args.clients)
    # The policy thread's core: one the generator does not use if there is one, else the generator's.
    spare = [c for c in cores if c != server_core and c not in client_cores]
    server_cores = {server_core, (spare or client_cores)[0]}
    secret = tokens.generate_secret()
    runs: dict[str, list[dict]] = {"static": [], "dorm": []}
    reference = None
    with tempfile.TemporaryDirectory(prefix="elastane-bench-hb-policy-") as tmp_dir:
        tmp = Path(tmp_dir)
        for i in range(args.repeats):
            for policy in (("static", "dorm") if i % 2 == 0 else ("dorm", "static")):
                runs[policy].append(_policy_run(policy, False, args, tmp, secret, server_cores, client_cores))
        if args.on_loop_reference:
            reference = _policy_run("dorm", True, args, tmp, secret, server_cores, client_cores)
    p99 = {p: median_of_runs(rs, "p99_ms") for p, rs in runs.items()}
    p50 = {p: median_of_runs(rs, "p50_ms") for p, rs in runs.items()}
    # Counted apart: a run in which nothing completed gives no latency to take a median of.
    no_replies = {p: sum(1 for r in rs if r.get("p99_ms") is None) for p, rs in runs.items()}
    solve = _median([r["solve_median_s"] for r in runs["dorm"] if r["solve_median_s"] is not None] or [0.0])
    p99_dorm, p99_static = p99["dorm"], p99["static"]
    ratio = (round(p99_dorm / p99_static, 3) if p99_dorm is not None and p99_static is not None and p99_static > 0
             else None)
    print(f"heartbeat p99 at {args.hb_rate}/s: dorm {p99['dorm']} ms (solving {solve:.2f} s a round), "
          f"static {p99['static']} ms: ratio {ratio} (target <= 1.2)")
    print(json.dumps({
        "p99_ratio_dorm_vs_static": ratio, "p99_ms_dorm": p99["dorm"], "p99_ms_static": p99["static"],
        "p50_ms_dorm": p50["dorm"], "p50_ms_static": p50["static"],
        "dorm_solve_s": round(solve, 3), "solve_long_enough": solve > 1.0, "target_ratio": 1.2,
        "meets_target": ratio is not None and ratio <= 1.2 and solve > 1.0,
        "runs_without_replies": no_replies,
        "dorm_rounds_applied": sum(r["applied"] or 0 for r in runs["dorm"]),
        "dorm_rounds_dropped": sum(r["dropped"] or 0 for r in runs["dorm"]),
        "p99_ms_dorm_on_loop": reference["p99_ms"] if reference else None,
        "hb_rate": args.hb_rate, "duration_s": args.duration, "repeats": args.repeats,
        "dorm_jobs": args.dorm_jobs, "dorm_churn_s": args.dorm_churn_s, "seed_nodes": args.dorm_seed_nodes, "generator_nodes": args.nodes,
        "dorm_time_limit_s": args.dorm_time_limit_s, "dorm_mip_gap": args.dorm_mip_gap, "cores": len(cores), "server_cores": sorted(server_cores),
        "runs": runs, "on_loop_run": reference,
    }, allow_nan=False))


def main() -> None:
    cores = _cores()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=min(8, max(2, len(cores) - 1)),
                    help="load-generator client processes (default: one per core apart from the server's, 2..8)")
    ap.add_argument("--nodes", type=int, default=None,
                    help="simulated NMs, split across the clients (default 5000; with --policy 200)")
    ap.add_argument("--connections", type=int, default=256, help="keep-alive connections, split across the clients")
    ap.add_argument("--duration", type=float, default=4.0, help="seconds per ladder step")
    ap.add_argument("--rates", type=lambda s: [int(x) for x in s.split(",")], default=RATES)
    ap.add_argument("--util-containers", type=int, default=8,
                    help="containers in each simulated node's utilization report (the with-utilization ladder)")
    # Internal: the load clients and the echo server are this script run again.
    ap.add_argument("--client", choices=["rm", "echo"], help=argparse.SUPPRESS)
    ap.add_argument("--client-index", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--echo-server", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--secret", default="", help=argparse.SUPPRESS)
    ap.add_argument("--policy", choices=["dorm"], help="measure heartbeat p99 while this policy decides, "
                    "against static (see the module doc)")
    ap.add_argument("--hb-rate", type=int, default=300, help="--policy: heartbeats/s sent")
    ap.add_argument("--repeats", type=int, default=3, help="--policy: runs per policy (medians count)")
    ap.add_argument("--dorm-jobs", type=int, default=90, help="--policy: running PS jobs seeded")
    ap.add_argument("--dorm-seed-nodes", type=int, default=40, help="--policy: Dorm-shaped nodes seeded")
    ap.add_argument("--dorm-churn-s", type=float, default=1.0, help="--policy: a job ends and one starts this often")
    ap.add_argument("--dorm-time-limit-s", type=float, default=2.0, help="--policy: the MILP's time limit")
    ap.add_argument("--dorm-mip-gap", type=float, default=1e-9,
                    help="--policy: the MILP's relative gap (~0: every solve runs to the time limit; Dorm's is 0.01)")
    ap.add_argument("--on-loop-reference", action="store_true",
                    help="--policy: one more dorm run deciding on the event loop (the old way)")
    ap.add_argument("--policy-server", help=argparse.SUPPRESS)
    ap.add_argument("--server-policy", default="static", help=argparse.SUPPRESS)
    ap.add_argument("--on-loop", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.host = "127.0.0.1"  # traffic stays on this host
    if args.nodes is None:
        args.nodes = 200 if args.policy else 5000
    if args.echo_server:
        return _echo_main(args.echo_server)
    if args.policy_server:
        from support.policy_rm import PolicyRmSettings, serve
        return asyncio.run(serve(PolicyRmSettings(
            policy=args.server_policy, port_file=args.policy_server, result_file=args.policy_server + ".result",
            secret=args.secret, jobs=args.dorm_jobs, seed_nodes=args.dorm_seed_nodes, churn_s=args.dorm_churn_s,
            dorm_time_limit_s=args.dorm_time_limit_s, dorm_mip_gap=args.dorm_mip_gap, on_loop=args.on_loop)))
    if args.client:
        args.mode = args.client
        from protocol.daemon import install_uvloop
        install_uvloop()
        return asyncio.run(_client_main(args))
    if not 1 <= args.clients <= MAX_CLIENTS:
        ap.error(f"--clients must be 1..{MAX_CLIENTS}")
    if args.policy:
        if args.repeats < 1 or args.hb_rate < 1 or args.dorm_jobs < 1:
            ap.error("--repeats, --hb-rate and --dorm-jobs must be >= 1")
        return _policy_main(args)

    from protocol import tokens

    server_core, client_cores = _layout(args.clients)
    gen_cores = sorted(set(client_cores))
    with tempfile.TemporaryDirectory(prefix="elastane-bench-hb-") as tmp_dir:
        tmp = Path(tmp_dir)
        secret = tokens.generate_secret()
        (tmp / "cluster.toml").write_text(f'[cluster]\nsecret = "{secret}"\nrm_address = "http://127.0.0.1:0"\n')
        env = dict(os.environ, ELASTANE_LOG_LEVEL="WARNING")
        ready = tmp / "rm.ready"
        procs: list[subprocess.Popen] = []
        with open(tmp / "rm.log", "wb") as rm_log:
            try:
                rm = subprocess.Popen([sys.executable, "-m", "rm", "--port", "0", "--state-dir", str(tmp / "rm"),
                                       "--cluster-config", str(tmp / "cluster.toml"), "--ready-file", str(ready),
                                       # Nodes stay alive across the whole ladder.
                                       "--nm-expiry-s", "600"],
                                      cwd=ROOT, env=env, preexec_fn=_pin(server_core), stderr=rm_log)
                procs.append(rm)
                echo_port_file = tmp / "echo.port"
                echo = subprocess.Popen([sys.executable, __file__, "--echo-server", str(echo_port_file)],
                                        cwd=ROOT, env=env, preexec_fn=_pin(server_core))
                procs.append(echo)
                rm_port = int(json.loads(_wait_file(ready, rm))["http_address"].rsplit(":", 1)[1])
                echo_port = int(_wait_file(echo_port_file, echo))
                echo_results, echo_flat = _ladder("echo", echo_port, echo.pid, secret, args, client_cores)
                rm_results, rm_flats, util_results, util_flats = _paired_ladder(rm_port, rm.pid, secret, args,
                                                                                client_cores)
                rm_flat, util_flat = _median_step(rm_flats), _median_step(util_flats)
            finally:
                _stop(procs)
    rm_best, echo_best, util_best = _best(rm_results), _best(echo_results), _best(util_results)
    echo_limit, rm_limit = _limited_by(echo_results), _limited_by(rm_results)
    shared_note = None
    if len(cores) - 1 < args.clients:
        shared_note = (f"{len(cores)} core(s): the server has core {server_core}, the {args.clients} load clients "
                       f"share core(s) {gen_cores}" + (" with it" if server_core in gen_cores else "")
                       + "; generator and server share this host, so the generator may be the limit "
                       "(see echo_limited_by and the steps' generator_core_busy_max)")
    print("rate ladder (echo):", echo_results)
    print("rate ladder (RM):  ", rm_results)
    print(f"RM sustains {rm_best['achieved']:.0f} heartbeats/s (p50 {rm_best['p50_ms']} ms, "
          f"p99 {rm_best['p99_ms']} ms; limited by: {rm_limit}); bare aiohttp endpoint "
          f"{echo_best['achieved']:.0f}/s (limited by: {echo_limit}); target 5000/s and >= 0.6 of the endpoint")
    rm_max = rm_flat["achieved"] if rm_flat else None
    echo_max = echo_flat["achieved"] if echo_flat else None
    print(f"flat out (closed loop, any latency): RM {rm_max}/s (busy: {_ran_out(rm_flat)}), "
          f"bare endpoint {echo_max}/s (busy: {_ran_out(echo_flat)})")
    util_max = util_flat["achieved"] if util_flat else None
    util_ratio = round(util_best["achieved"] / rm_best["achieved"], 3) if rm_best["achieved"] else None
    util_flat_ratio = round(util_max / rm_max, 3) if util_max and rm_max else None
    rm_per_cpu, util_per_cpu = _per_cpu_s(rm_flats), _per_cpu_s(util_flats)
    util_cpu_ratio = round(util_per_cpu / rm_per_cpu, 3) if util_per_cpu and rm_per_cpu else None
    bare = {"node_id": "sim-00000.bench:10000", "response_id": 0, "used": {"memory": 0, "vCores": 0},
            "container_statuses": []}
    bare_bytes = len(json.dumps(bare, separators=(",", ":")))
    util_bytes = len(json.dumps(dict(bare, utilization=utilization_report(0, args.util_containers)),
                                separators=(",", ":")))
    sums_bytes = len(json.dumps(dict(bare, utilization=utilization_report(0, args.util_containers, False)),
                                separators=(",", ":")))
    print(f"with utilization reports ({args.util_containers} containers listed every {LIST_EVERY}th, "
          f"{util_bytes} B / {sums_bytes} B against {bare_bytes} B): "
          f"{util_best['achieved']:.0f}/s sustained ({util_ratio} of without; target >= {UTIL_TARGET_RATIO}), "
          f"flat out {util_max}/s ({util_flat_ratio} of without); per server CPU-second {util_per_cpu} against "
          f"{rm_per_cpu} ({util_cpu_ratio})")
    if shared_note:
        print("note:", shared_note)
    ratio = round(rm_best["achieved"] / echo_best["achieved"], 3) if echo_best["achieved"] else None
    meets, meets_why = heartbeat_verdict(rm_best, ratio, echo_limit, rm_limit)
    print(json.dumps({
        "rm_heartbeats_per_s": rm_best["achieved"], "rm_p50_ms": rm_best["p50_ms"], "rm_p99_ms": rm_best["p99_ms"],
        "echo_ceiling_per_s": echo_best["achieved"], "echo_p50_ms": echo_best["p50_ms"],
        "echo_p99_ms": echo_best["p99_ms"],
        "ratio_to_ceiling": ratio,
        # The ratio is the RM against aiohttp's own ceiling only when the server, not the generator, stopped the echo.
        "ceiling_is_server_bound": echo_limit == "server",
        "echo_limited_by": echo_limit, "rm_limited_by": rm_limit,
        "generator_saturated": "generator" in (echo_limit, rm_limit),
        "echo_stop_step": echo_results[-1] if echo_results else None,
        "rm_stop_step": rm_results[-1] if rm_results else None,
        # Closed loop on every connection: the most each server takes whatever the latency, and what was busy.
        "echo_flat_out_per_s": echo_max, "rm_flat_out_per_s": rm_max,
        "flat_out_ratio": round(rm_max / echo_max, 3) if rm_max and echo_max else None,
        "echo_flat_out_busy": _ran_out(echo_flat), "rm_flat_out_busy": _ran_out(rm_flat),
        "echo_flat_out_step": echo_flat, "rm_flat_out_step": rm_flat,
        "clients": args.clients, "connections": args.connections, "cores": len(cores),
        "server_core": server_core, "generator_cores": gen_cores, "shared_host_note": shared_note,
        "simulated_nodes": args.nodes, "target_per_s": TARGET_PER_S, "target_ratio": TARGET_RATIO,
        # None when the ceiling was not server-bound or the generator ran out (heartbeat_verdict).
        "meets_target": meets, "meets_target_reason": meets_why,
        # The same RM, the same ladder, every heartbeat carrying a utilization report: its cost.
        "with_utilization_rate": util_best["achieved"], "with_utilization_p99_ms": util_best["p99_ms"],
        "utilization_payload_ratio": util_ratio, "utilization_target_ratio": UTIL_TARGET_RATIO,
        "with_utilization_limited_by": _limited_by(util_results),
        "with_utilization_stop_step": util_results[-1] if util_results else None,
        "with_utilization_flat_out_per_s": util_max, "utilization_flat_out_ratio": util_flat_ratio,
        # Flat out, per second of the server's CPU (medians): the payload's cost where the host is shared.
        "rm_heartbeats_per_cpu_s": rm_per_cpu, "with_utilization_heartbeats_per_cpu_s": util_per_cpu,
        "utilization_cpu_ratio": util_cpu_ratio,
        "utilization_containers_per_report": args.util_containers,
        "heartbeat_bytes": bare_bytes, "heartbeat_with_utilization_bytes": util_bytes,
        "heartbeat_with_utilization_sums_bytes": sums_bytes, "utilization_list_every": LIST_EVERY,
        "meets_utilization_target": bool(util_ratio is not None and util_ratio >= UTIL_TARGET_RATIO),
    }, allow_nan=False))


if __name__ == "__main__":
    main()
