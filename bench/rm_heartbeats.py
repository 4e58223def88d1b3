"""Highest NM heartbeat rate the RM sustains on one core with p99 < 50 ms, against an aiohttp echo ceiling.

The RM runs as its own process pinned to core 0; simulated NMs run in a separate client process
pinned to core 1 (a raw asyncio HTTP/1.1 keep-alive client, so the client is not the bottleneck).
The load is open-loop: heartbeats are sent on a fixed schedule at the target rate across many
simulated nodes, each node with at most one heartbeat in flight (like a real NM). The rate steps up
until p99 exceeds the bound or the achieved rate falls below 95% of the target. The same ladder is
run against a bare aiohttp endpoint that echoes a small JSON body, in the same run: the ceiling of
an aiohttp server on this core.

Last line: {"rm_heartbeats_per_s", "rm_p99_ms", "echo_ceiling_per_s", ...}
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

P99_BOUND_MS = 50.0
RATES = [1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 10000, 12000, 15000]


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


async def _client_main(args) -> None:
    import orjson

    from protocol import tokens

    loop = asyncio.get_running_loop()
    host, port = args.host, args.port
    n_nodes = args.nodes
    conns = []
    for _ in range(args.connections):
        _, proto = await loop.create_connection(_Conn, host, port)
        conns.append(proto)
    idle = asyncio.Queue()
    for c in conns:
        idle.put_nowait(c)

    node_ids = [f"sim-{i:05d}.bench:{10000 + i}" for i in range(n_nodes)]
    node_tokens = {}
    response_ids = {}
    if args.mode == "rm":
        for nid in node_ids:
            node_tokens[nid] = tokens.sign(args.secret, tokens.NM, {"node_id": nid}, 3600)
        # Register all simulated nodes (not timed).
        sem = asyncio.Semaphore(len(conns))

        async def register(nid):
            async with sem:
                c = await idle.get()
                try:
                    body = orjson.dumps({"node_id": nid, "http_address": nid,
                                         "capability": {"memory": 8192, "vCores": 8}})
                    status, out = await c.request(_http_post(host, "/internal/v1/node/register", body, node_tokens[nid]))
                    if status != 200:
                        raise RuntimeError(f"register {nid}: {status} {out[:200]!r}")
                    response_ids[nid] = 0
                finally:
                    idle.put_nowait(c)
        await asyncio.gather(*(register(n) for n in node_ids))

    results = []
    for rate in args.rates:
        latencies: list[float] = []
        errors = 0
        duration = args.duration
        n_req = int(rate * duration)
        interval = 1.0 / rate
        in_flight: set[str] = set()
        next_node = 0
        skipped = 0

        async def one(nid: str, t_sched: float):
            nonlocal errors
            c = await idle.get()
            try:
                if args.mode == "rm":
                    body = orjson.dumps({"node_id": nid, "response_id": response_ids[nid],
                                         "used": {"memory": 0, "vCores": 0}, "container_statuses": []})
                    raw = _http_post(host, "/internal/v1/node/heartbeat", body, node_tokens[nid])
                else:
                    body = orjson.dumps({"node_id": nid, "response_id": 0})
                    raw = _http_post(host, "/echo", body, None)
                status, out = await c.request(raw)
                if status != 200:
                    errors += 1
                elif args.mode == "rm":
                    response_ids[nid] = orjson.loads(out)["response_id"]
                latencies.append(time.perf_counter() - t_sched)
            except Exception:
                errors += 1
            finally:
                idle.put_nowait(c)
                in_flight.discard(nid)

        tasks = []
        t0 = time.perf_counter()
        for k in range(n_req):
            t_sched = t0 + k * interval
            delay = t_sched - time.perf_counter()
            if delay > 0.001:
                await asyncio.sleep(delay)
            nid = node_ids[next_node % n_nodes]
            next_node += 1
            if nid in in_flight:  # a real NM never has two heartbeats in flight
                skipped += 1
                continue
            in_flight.add(nid)
            tasks.append(asyncio.ensure_future(one(nid, t_sched)))
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - t0
        latencies.sort()
        done = len(latencies)
        p50 = latencies[done // 2] * 1000 if done else float("inf")
        p99 = latencies[min(done - 1, int(done * 0.99))] * 1000 if done else float("inf")
        achieved = done / elapsed
        results.append({"target": rate, "achieved": round(achieved, 1), "p50_ms": round(p50, 2),
                        "p99_ms": round(p99, 2), "errors": errors, "skipped": skipped})
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
        if p99 > P99_BOUND_MS or achieved < 0.95 * rate or errors:
            break
    print(json.dumps(results), flush=True)


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
        port = site._server.sockets[0].getsockname()[1]
        Path(port_file + ".tmp").write_text(str(port))
        os.replace(port_file + ".tmp", port_file)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await runner.cleanup()

    asyncio.run(main())


# ----------------------------------------------------------------------------- driver

def _pin(core: int):
    def f():
        try:
            os.sched_setaffinity(0, {core % os.cpu_count()})
        except OSError:
            pass
    return f


def _wait_file(path: Path, proc: subprocess.Popen, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before becoming ready")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} not written")
        time.sleep(0.05)
    return path.read_text()


def _run_client(mode: str, port: int, secret: str, args) -> list[dict]:
    cmd = [sys.executable, __file__, "--client", mode, "--port", str(port), "--secret", secret,
           "--nodes", str(args.nodes), "--connections", str(args.connections),
           "--duration", str(args.duration), "--rates", ",".join(map(str, args.rates))]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, preexec_fn=_pin(1), text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _best(results: list[dict]) -> dict:
    ok = [r for r in results if r["p99_ms"] <= P99_BOUND_MS and r["achieved"] >= 0.95 * r["target"]
          and not r["errors"]]
    return max(ok, key=lambda r: r["achieved"]) if ok else {"achieved": 0.0, "p99_ms": float("nan")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--client", choices=["rm", "echo"])
    ap.add_argument("--echo-server")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--secret", default="")
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--duration", type=float, default=4.0)
    ap.add_argument("--rates", type=lambda s: [int(x) for x in s.split(",")], default=RATES)
    args = ap.parse_args()
    if args.echo_server:
        return _echo_main(args.echo_server)
    if args.client:
        args.mode = args.client
        from protocol.daemon import install_uvloop
        install_uvloop()
        return asyncio.run(_client_main(args))

    from protocol import tokens

    with tempfile.TemporaryDirectory(prefix="elastane-bench-hb-") as tmp:
        tmp = Path(tmp)
        secret = tokens.generate_secret()
        (tmp / "cluster.toml").write_text(f'[cluster]\nsecret = "{secret}"\nrm_address = "http://127.0.0.1:0"\n')
        env = dict(os.environ, ELASTANE_LOG_LEVEL="WARNING")
        ready = tmp / "rm.ready"
        rm = subprocess.Popen([sys.executable, "-m", "rm", "--port", "0", "--state-dir", str(tmp / "rm"),
                               "--cluster-config", str(tmp / "cluster.toml"), "--ready-file", str(ready),
                               # Nodes stay alive across the whole ladder.
                               "--nm-expiry-s", "600"],
                              cwd=ROOT, env=env, preexec_fn=_pin(0), stderr=open(tmp / "rm.log", "wb"))
        echo_port_file = tmp / "echo.port"
        echo = subprocess.Popen([sys.executable, __file__, "--echo-server", str(echo_port_file)],
                                cwd=ROOT, env=env, preexec_fn=_pin(0))
        try:
            rm_port = int(json.loads(_wait_file(ready, rm))["http_address"].rsplit(":", 1)[1])
            echo_port = int(_wait_file(echo_port_file, echo))
            echo_results = _run_client("echo", echo_port, secret, args)
            rm_results = _run_client("rm", rm_port, secret, args)
        finally:
            for p in (rm, echo):
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in (rm, echo):
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        rm_best, echo_best = _best(rm_results), _best(echo_results)
        print("rate ladder (RM):  ", rm_results)
        print("rate ladder (echo):", echo_results)
        print(f"RM sustains {rm_best['achieved']:.0f} heartbeats/s (p99 {rm_best['p99_ms']} ms); "
              f"aiohttp echo ceiling {echo_best['achieved']:.0f}/s; target 5000/s")
        print(json.dumps({"rm_heartbeats_per_s": rm_best["achieved"], "rm_p99_ms": rm_best["p99_ms"],
                          "echo_ceiling_per_s": echo_best["achieved"],
                          "ratio_to_ceiling": round(rm_best["achieved"] / echo_best["achieved"], 3)
                          if echo_best["achieved"] else None,
                          "simulated_nodes": args.nodes, "target_per_s": 5000}))


if __name__ == "__main__":
    main()
