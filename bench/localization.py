"""Container launch latency with a 50 MB archive as a local resource: cold, cached, and without.

    .venv/bin/python bench/localization.py [--runs 15] [--cold-runs 8] [--archive-mb 50] [--cgroups off]

A real NodeManager process (`python -m nodemanager`, registered with a minimal in-bench RM that
only answers registration and heartbeats) gets containers started straight through its container
API with container tokens signed by the cluster secret -- the NM's launch path, without an RM's
scheduling or an AM in front of it. Every container runs

    date +%s%N > "$LAUNCH_STAMP"

as its first action (as bench/container_launch.py does), and a launch's latency is from just before
the start request is sent to that stamp (CLOCK_REALTIME, shared by the bench and the container).
Launches go one at a time, each after the previous container completed, in three series on the
same NM in the same run:

  none    no local resource;
  cold    the archive as an APPLICATION resource of a new app each time: never cached, so each
          launch fetches (copies from the local path) and unpacks it;
  cached  the archive as a PUBLIC resource already on the node (one launch before the series
          fetched it): the launch only links it.

The archive is a tar.gz of `--archive-mb` MB of random bytes (incompressible, in 5 MB files).
Prints a summary, then one JSON object as the last line: {"launch_p50_none_ms",
"launch_p50_cold_ms", "launch_p50_cached_ms", "cached_over_none", ...}.
"""
from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import secrets
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from support.sigterm import unwind_on_sigterm  # noqa: E402  (bench/support: not a benchmark itself)

from protocol import internal_api as api, tokens  # noqa: E402
from protocol.http_server import json_response, make_app, read_json  # noqa: E402
from protocol.local_resources import LocalResource  # noqa: E402
from protocol.nm_client import NMClient, container_token_payload  # noqa: E402
from protocol.records import Resource  # noqa: E402

COMMAND = 'date +%s%N > "$LAUNCH_STAMP"'
RM_START_MS = 1700000000000
NM_READY_TIMEOUT_S = 60.0
LAUNCH_TIMEOUT_S = 60.0
POLL_S = 0.01


class BenchError(RuntimeError):
    """The benchmark could not produce figures."""


class MiniRM:
    """Registration and heartbeats, nothing else: the NM needs an RM to start serving."""

    def __init__(self) -> None:
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = make_app()
        app.router.add_post(api.NODE_REGISTER, self._register)
        app.router.add_post(api.NODE_HEARTBEAT, self._heartbeat)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]    # the bound port (port 0 asked for any)
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def _register(self, request: web.Request) -> web.Response:
        req = await read_json(request, api.NodeRegisterRequest)
        return json_response(api.NodeRegisterResponse(node_id=req.node_id, heartbeat_interval_ms=1000,
                                                      rm_start_ms=RM_START_MS))

    async def _heartbeat(self, request: web.Request) -> web.Response:
        req = await read_json(request, api.NodeHeartbeatRequest)
        return json_response(api.NodeHeartbeatResponse(response_id=req.response_id + 1))


def make_archive(path: Path, mb: int) -> None:
    """A tar.gz of `mb` MB of random bytes in 5 MB files (gzip level 1: random data does not shrink)."""
    rng = np.random.default_rng(0)
    with tarfile.open(path, "w:gz", compresslevel=1) as tf:
        left, i = mb * 1024 * 1024, 0
        while left > 0:
            n = min(left, 5 * 1024 * 1024)
            info = tarfile.TarInfo(f"model/part{i:03d}.bin")
            info.size = n
            tf.addfile(info, io.BytesIO(rng.bytes(n)))
            left, i = left - n, i + 1


def pct(values: Sequence[float], q: float) -> float:
    return round(float(np.percentile(np.asarray(values, dtype=float), q)), 3) if values else float("nan")


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        self.secret = secrets.token_hex(32)
        self.rm = MiniRM()
        self.nm: subprocess.Popen[bytes] | None = None
        self.node_id = self.address = ""
        self.client = NMClient(timeout_s=LAUNCH_TIMEOUT_S)
        self.apps = 0

    async def start_nm(self) -> None:
        await self.rm.start()
        base = self.work / "nm"
        base.mkdir()
        (base / "cluster.toml").write_text(f'[cluster]\nsecret = "{self.secret}"\n')
        (base / "nm.toml").write_text("[nm]\nwarm_modules = []\n")
        ready = base / "ready.json"
        cmd = [sys.executable, "-m", "nodemanager", "--config", str(base / "nm.toml"),
               "--cluster-config", str(base / "cluster.toml"), "--rm-address", self.rm.url, "--host", "127.0.0.1",
               "--port", "0", "--memory-mb", "4096", "--vcores", "2", "--local-dir", str(base / "local"),
               "--log-dir", str(base / "logs"), "--recovery-dir", str(base / "recovery"),
               "--cgroups", self.args.cgroups, "--ready-file", str(ready)]
        with open(base / "nm.stderr", "ab") as err:
            self.nm = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err,
                                       env=dict(os.environ, ELASTANE_LOG_LEVEL="WARNING"))
        deadline = time.monotonic() + NM_READY_TIMEOUT_S
        while not ready.exists():
            if self.nm.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"the NM did not start: {(base / 'nm.stderr').read_text()[-2000:]}")
            await asyncio.sleep(0.05)
        info = json.loads(ready.read_text())
        self.node_id, self.address = info["node_id"], info["http_address"]

    async def stop(self) -> None:
        await self.client.close()
        if self.nm is not None and self.nm.poll() is None:
            self.nm.terminate()
            try:
                await asyncio.to_thread(self.nm.wait, 30)
            except subprocess.TimeoutExpired:
                self.nm.kill()
        await self.rm.stop()

    async def launch(self, resources: dict[str, LocalResource], tag: str) -> float:
        """One container, start to its stamp (ms); waits for it to complete."""
        self.apps += 1
        app = f"application_{RM_START_MS}_{self.apps:04d}"
        attempt = f"appattempt_{RM_START_MS}_{self.apps:04d}_000001"
        cid = f"container_{RM_START_MS}_{self.apps:04d}_01_000001"
        stamp = self.work / "stamps" / f"{tag}-{self.apps}"
        stamp.parent.mkdir(exist_ok=True)
        payload = container_token_payload(cid, self.node_id, app, attempt, "bench", Resource(64, 1))
        tok = tokens.sign(self.secret, tokens.CONTAINER, payload, 3600)
        ctx = api.LaunchContext(commands=[COMMAND], environment={"LAUNCH_STAMP": str(stamp)},
                                local_resources=resources)
        t0 = time.time_ns()
        await self.client.start_container(self.address, tok, ctx)
        deadline = time.monotonic() + LAUNCH_TIMEOUT_S
        while True:
            st = await self.client.container_status(self.address, cid, tok)
            if st.state == "COMPLETE":
                break
            if time.monotonic() > deadline:
                raise BenchError(f"{cid} did not complete within {LAUNCH_TIMEOUT_S} s")
            await asyncio.sleep(POLL_S)
        if st.exit_status != 0:
            raise BenchError(f"{tag} container {cid} exited {st.exit_status}: {st.diagnostics}")
        ns = int(stamp.read_text().strip())
        return (ns - t0) / 1e6

    async def run(self) -> dict[str, Any]:
        archive = self.work / "shared" / "model.tgz"
        archive.parent.mkdir()
        t = time.monotonic()
        make_archive(archive, self.args.archive_mb)
        print(f"archive: {archive.stat().st_size / 2**20:.1f} MB tar.gz made in {time.monotonic() - t:.1f} s")
        st = archive.stat()
        app_res = LocalResource(str(archive), type="ARCHIVE", visibility="APPLICATION", size=st.st_size,
                                timestamp=st.st_mtime_ns // 1_000_000)
        pub_res = LocalResource(str(archive), type="ARCHIVE", visibility="PUBLIC", size=st.st_size,
                                timestamp=st.st_mtime_ns // 1_000_000)
        await self.start_nm()
        await self.launch({}, "warmup")
        none, cold, cached = [], [], []
        for _ in range(self.args.runs):
            none.append(await self.launch({}, "none"))
        for _ in range(self.args.cold_runs):
            cold.append(await self.launch({"model": app_res}, "cold"))
        await self.launch({"model": pub_res}, "fill")       # puts it in the node's PUBLIC cache
        for _ in range(self.args.runs):
            cached.append(await self.launch({"model": pub_res}, "cached"))
        # The same series again, interleaved, so a drift in the machine's state shows in both.
        for _ in range(self.args.runs):
            none.append(await self.launch({}, "none"))
            cached.append(await self.launch({"model": pub_res}, "cached"))
        return {"none": none, "cold": cold, "cached": cached}


def summarise(series: dict[str, list[float]], args: argparse.Namespace, elapsed: float) -> dict[str, Any]:
    p50 = {k: pct(v, 50) for k, v in series.items()}
    out: dict[str, Any] = {
        "launch_p50_none_ms": p50["none"], "launch_p50_cold_ms": p50["cold"], "launch_p50_cached_ms": p50["cached"],
        "cached_over_none": round(p50["cached"] / p50["none"], 3) if p50["none"] else None,
        "launch_p90_none_ms": pct(series["none"], 90), "launch_p90_cold_ms": pct(series["cold"], 90),
        "launch_p90_cached_ms": pct(series["cached"], 90),
        "runs": {k: len(v) for k, v in series.items()}, "archive_mb": args.archive_mb, "cgroups": args.cgroups,
        "elapsed_s": round(elapsed, 1),
    }
    print(f"launch to the command's first action, one at a time, {args.archive_mb} MB tar.gz archive:")
    for k in ("none", "cold", "cached"):
        print(f"  {k:7s} p50 {p50[k]:9.2f} ms   p90 {pct(series[k], 90):9.2f} ms   ({len(series[k])} launches)")
    print(f"  cached / none = {out['cached_over_none']}   (elapsed {elapsed:.1f} s)")
    return out


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=15, help="launches per none / cached series (each run twice)")
    p.add_argument("--cold-runs", type=int, default=8, help="cold launches (each fetches and unpacks)")
    p.add_argument("--archive-mb", type=int, default=50)
    p.add_argument("--cgroups", default="off", choices=["auto", "v1", "v2", "off"])
    p.add_argument("--work-dir", default=None, help="where the temp dir goes (default: the system's)")
    p.add_argument("--keep", action="store_true", help="keep the temp dir")
    args = p.parse_args(argv)
    if args.runs < 1 or args.cold_runs < 1 or args.archive_mb < 1:
        p.error("--runs, --cold-runs and --archive-mb must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    unwind_on_sigterm()   # a SIGTERM stops the NM this bench started
    args = parse_args(sys.argv[1:] if argv is None else argv)
    work = Path(tempfile.mkdtemp(prefix="elastane-bench-localization-", dir=args.work_dir))
    started = time.monotonic()

    async def go() -> dict[str, list[float]]:
        bench = Bench(args, work)
        try:
            return await bench.run()
        finally:
            await bench.stop()
    try:
        series = asyncio.run(go())
        figures = summarise(series, args, time.monotonic() - started)
    except BenchError as e:
        print(f"localization: {e}", file=sys.stderr)
        return 1
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
