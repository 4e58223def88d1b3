"""Data-plane benchmark: push+pull throughput and pull latency vs a raw-socket ceiling.

    .venv/bin/python bench/dataplane.py [--seconds 2.0]

For 8 KiB, 1 MiB and 8 MiB float32 blocks, a client (this process) pushes a delta to a server
executor (a separate `python -m psruntime.executor` process, which applies it with update "add")
and pulls the block back, in a loop. The baseline, in the same run, moves the same bytes with plain
blocking sockets between this process and a second process (sendall / recv_into, no framing, no
store): the machine's ceiling for one round trip of N bytes each way. Raw and store rounds
alternate and each side's best round counts, so load from other processes hits both alike.
Throughput counts bytes both ways.

Authentication, in the same run: a second server executor with a job secret (ELASTANE_JOB_SECRET,
as a PS AM starts them) against the unauthenticated one, at 8 MiB blocks, alternating rounds;
each round opens a fresh connection inside its timed window, so the authenticated side pays its
handshake (one round trip) in every round. Also the median time to open a connection with and
without the handshake. `auth_throughput_ratio` = authenticated / unauthenticated best round
(target >= 0.98).
Prints a summary, then one JSON object as the last line.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SIZES = {"8kib": 8 << 10, "1mib": 1 << 20, "8mib": 8 << 20}
NUM_BLOCKS = 16


def raw_server(port_file: str) -> None:
    """Echo N bytes back for each 8-byte length header, using preallocated buffers."""
    srv = socket.create_server(("127.0.0.1", 0))
    Path(port_file + ".tmp").write_text(str(srv.getsockname()[1]))
    os.replace(port_file + ".tmp", port_file)
    buf = bytearray(max(SIZES.values()))
    hdr = bytearray(8)
    while True:  # one connection per measured size, served one after the other
        conn, _ = srv.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while _recv_exactly(conn, memoryview(hdr)):
            n = int.from_bytes(hdr, "little")
            _recv_exactly(conn, memoryview(buf)[:n])
            conn.sendall(memoryview(buf)[:n])
        conn.close()


def _recv_exactly(conn: socket.socket, view: memoryview) -> bool:
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:])
        if n == 0:
            return False
        got += n
    return True


def _wait_file(path: Path, proc: subprocess.Popen[bytes], what: str) -> str:
    deadline = time.monotonic() + 30
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{what} did not start")
        time.sleep(0.02)
    return path.read_text()


class RawSide:
    """Blocking-socket round trips of N bytes each way (the ceiling), on one reused connection."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.back = bytearray(max(SIZES.values()))

    def run(self, nbytes: int, seconds: float) -> tuple[float, list[float]]:
        out = np.ones(nbytes // 4, np.float32)
        view = memoryview(self.back)[:nbytes]
        lat = []
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            t = time.perf_counter()
            self.sock.sendall(nbytes.to_bytes(8, "little"))
            self.sock.sendall(memoryview(out).cast("B"))
            _recv_exactly(self.sock, view)
            lat.append(time.perf_counter() - t)
        return 2 * nbytes * len(lat) / (time.perf_counter() - t0) / 1e9, lat


class StoreSide:
    """push(delta) + pull(block) pairs through the StoreClient against the server executor."""

    def __init__(self, address: str) -> None:
        from psruntime.ownership_table import OwnershipTable  # noqa: PLC0415
        from psruntime.store_client import StoreClient  # noqa: PLC0415

        self.client = StoreClient(OwnershipTable(NUM_BLOCKS, ["srv"] * NUM_BLOCKS, {"srv": address}, 1))
        self.pushes: dict[int, int] = {}

    async def run(self, nbytes: int, seconds: float, key: int) -> tuple[float, list[float]]:
        delta = np.ones(nbytes // 4, np.float32)
        if key not in self.pushes:
            await self.client.put([key], [np.zeros_like(delta)])
            self.pushes[key] = 0
        lat = []
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            await self.client.push([key], [delta])
            t = time.perf_counter()
            got = await self.client.pull([key])
            lat.append(time.perf_counter() - t)
        elapsed = time.perf_counter() - t0
        await self.client.flush()
        assert got[key].nbytes == nbytes
        self.pushes[key] += len(lat)
        return 2 * nbytes * len(lat) / elapsed / 1e9, lat

    async def check_exactly_once(self) -> None:
        """Every push was applied exactly once: each key's value counts its pushes."""
        for key, n in self.pushes.items():
            value = (await self.client.pull([key]))[key]
            assert float(value[0]) == n, (key, float(value[0]), n)
        await self.client.close()


AUTH_SECRET = "bench-job-secret-0123456789abcdef0123456789abcdef"


async def auth_round(address: str, secret: bytes | None, nbytes: int, seconds: float, key: int) -> float:
    """push+pull GB/s over a connection opened inside the timed window (handshake included)."""
    from psruntime.dataplane import DataPlaneClient  # noqa: PLC0415
    from psruntime.ownership_table import OwnershipTable  # noqa: PLC0415
    from psruntime.store_client import StoreClient  # noqa: PLC0415

    table = OwnershipTable(NUM_BLOCKS, ["srv"] * NUM_BLOCKS, {"srv": address}, 1)
    client = StoreClient(table, DataPlaneClient(secret=secret))
    delta = np.ones(nbytes // 4, np.float32)
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        await client.push([key], [delta])
        await client.pull([key])
        n += 1
    elapsed = time.perf_counter() - t0
    await client.flush()
    await client.close()
    return 2 * nbytes * n / elapsed / 1e9


async def open_us(address: str, secret: bytes | None, n: int = 200) -> float:
    """Median microseconds to open a data-plane connection (TCP connect + handshake if any)."""
    from psruntime.dataplane import DataPlaneConnection  # noqa: PLC0415

    times = []
    for _ in range(n):
        t = time.perf_counter()
        conn = await DataPlaneConnection.open(address, secret=secret)
        times.append(time.perf_counter() - t)
        await conn.close()
    return statistics.median(times) * 1e6


async def measure_auth(plain: str, authed: str, seconds: float, rounds: int) -> dict[str, float]:
    key = AUTH_SECRET.encode()
    nbytes = SIZES["8mib"]
    best = {"plain": 0.0, "auth": 0.0}
    for _ in range(rounds):
        best["plain"] = max(best["plain"], await auth_round(plain, None, nbytes, seconds / rounds, 7))
        best["auth"] = max(best["auth"], await auth_round(authed, key, nbytes, seconds / rounds, 7))
    return {"plain_gbps": best["plain"], "auth_gbps": best["auth"], "ratio": best["auth"] / best["plain"],
            "open_us": await open_us(plain, None), "open_auth_us": await open_us(authed, key)}


async def measure(address: str, raw_port: int, seconds: float, rounds: int) -> dict[str, dict[str, float]]:
    """Alternate short raw and store rounds per size so both see the same machine load, and keep
    each side's best round (the capability, not the noise of other processes)."""
    raw, store = RawSide(raw_port), StoreSide(address)
    results: dict[str, dict[str, float]] = {}
    for i, (name, nbytes) in enumerate(SIZES.items()):
        raw_best, store_best, raw_lat, store_lat = 0.0, 0.0, [], []
        for _ in range(rounds):
            g, lat = raw.run(nbytes, seconds / rounds)
            raw_best, raw_lat = max(raw_best, g), raw_lat + lat
            g, lat = await store.run(nbytes, seconds / rounds, key=i)
            store_best, store_lat = max(store_best, g), store_lat + lat
        results[name] = {"gbps": store_best, "raw_gbps": raw_best, "ratio": store_best / raw_best,
                         "p50_pull_us": statistics.median(store_lat) * 1e6,
                         "p99_pull_us": float(np.percentile(store_lat, 99)) * 1e6,
                         "raw_p50_rtt_us": statistics.median(raw_lat) * 1e6, "iterations": len(store_lat)}
    await store.check_exactly_once()
    raw.sock.close()
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=4.0, help="measuring time per size and side")
    p.add_argument("--rounds", type=int, default=8, help="alternating raw/store rounds per size")
    p.add_argument("--raw-server", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.raw_server:
        raw_server(args.raw_server)
        return
    repo = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(repo))
    from protocol.daemon import install_uvloop  # noqa: PLC0415
    install_uvloop()
    tmp = Path(tempfile.mkdtemp(prefix="elastane-bench-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        env = {k: v for k, v in os.environ.items() if k != "ELASTANE_JOB_SECRET"}
        ex = subprocess.Popen([sys.executable, "-m", "psruntime.executor", "--executor-id", "srv", "--port", "0",
                               "--num-blocks", str(NUM_BLOCKS), "--ready-file", str(tmp / "ex.ready"),
                               "--log-level", "WARNING"], cwd=repo, env=env)
        procs.append(ex)
        ex_auth = subprocess.Popen([sys.executable, "-m", "psruntime.executor", "--executor-id", "srv", "--port",
                                    "0", "--num-blocks", str(NUM_BLOCKS), "--ready-file", str(tmp / "auth.ready"),
                                    "--log-level", "WARNING"], cwd=repo,
                                   env={**env, "ELASTANE_JOB_SECRET": AUTH_SECRET})
        procs.append(ex_auth)
        raw = subprocess.Popen([sys.executable, __file__, "--raw-server", str(tmp / "raw.port")])
        procs.append(raw)
        address = json.loads(_wait_file(tmp / "ex.ready", ex, "executor"))["address"]
        raw_port = int(_wait_file(tmp / "raw.port", raw, "raw server"))
        auth_address = json.loads(_wait_file(tmp / "auth.ready", ex_auth, "authenticated executor"))["address"]
        # The executor must own every block: hand it the table as the AM would.
        from psruntime.dataplane import DataPlaneClient  # noqa: PLC0415
        from psruntime.ownership_table import OwnershipTable  # noqa: PLC0415

        async def setup() -> None:
            for addr, secret in ((address, None), (auth_address, AUTH_SECRET.encode())):
                dp = DataPlaneClient(secret=secret)
                table = OwnershipTable(NUM_BLOCKS, ["srv"] * NUM_BLOCKS, {"srv": addr}, 1)
                await dp.request(addr, {"op": "set_ownership", "table": table.to_wire()})
                await dp.close()
        asyncio.run(setup())

        results = asyncio.run(measure(address, raw_port, args.seconds, args.rounds))
        auth = asyncio.run(measure_auth(address, auth_address, args.seconds, args.rounds))
        for name, r in results.items():
            print(f"{name:>5}: push+pull {r['gbps']:6.2f} GB/s  raw {r['raw_gbps']:6.2f} GB/s  "
                  f"ratio {r['ratio']:.2f}  pull p50 {r['p50_pull_us']:8.0f} us  p99 {r['p99_pull_us']:8.0f} us  "
                  f"raw rtt p50 {r['raw_p50_rtt_us']:8.0f} us  ({int(r['iterations'])} iterations)")
        print(f" auth: 8 MiB push+pull {auth['auth_gbps']:6.2f} GB/s with the handshake, "
              f"{auth['plain_gbps']:6.2f} GB/s without (ratio {auth['ratio']:.3f}); connection open "
              f"{auth['open_auth_us']:.0f} us with, {auth['open_us']:.0f} us without")
        summary = {"push_pull_gbps_8mib": round(results["8mib"]["gbps"], 3),
                   "raw_socket_gbps": round(results["8mib"]["raw_gbps"], 3),
                   "ratio_8mib": round(results["8mib"]["ratio"], 3),
                   "p50_us_8kib": round(results["8kib"]["p50_pull_us"], 1),
                   "push_pull_gbps_1mib": round(results["1mib"]["gbps"], 3),
                   "ratio_1mib": round(results["1mib"]["ratio"], 3),
                   "p50_us_1mib": round(results["1mib"]["p50_pull_us"], 1),
                   "p50_us_8mib": round(results["8mib"]["p50_pull_us"], 1),
                   "auth_gbps_8mib": round(auth["auth_gbps"], 3), "noauth_gbps_8mib": round(auth["plain_gbps"], 3),
                   "auth_throughput_ratio": round(auth["ratio"], 3),
                   "open_us_auth": round(auth["open_auth_us"], 1), "open_us_noauth": round(auth["open_us"], 1)}
        print(json.dumps(summary))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


if __name__ == "__main__":
    main()
