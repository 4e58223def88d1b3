"""`make demo`: start a 3-node local cluster, run a distributed-shell app on it, show it, stop it.

The frame (`run_on_local_cluster`: start a cluster in a temp dir, run a body against it, stop the
cluster whatever happens, Ctrl-C and SIGTERM included) is separate from the body (`shell_demo`),
so a later demo (PS training) only swaps the body.
"""
from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Awaitable, Callable, TextIO

from . import app_commands, container_logs
from .context import default_user
from .errors import CliError
from .local_cluster import LocalCluster
from .rm_rest_client import RmRestClient
from .status_line import StatusLine

DemoBody = Callable[[LocalCluster, RmRestClient, TextIO], Awaitable[int]]

# What each container runs: who and where it is, and a small computation to show real work.
CONTAINER_SCRIPT = (
    "import os, socket, time\n"
    "t = time.perf_counter()\n"
    "n = 2_000_000\n"
    "s = sum(i * i for i in range(1, n + 1))\n"
    "assert s == n * (n + 1) * (2 * n + 1) // 6\n"
    "print(f\"container {os.environ['CONTAINER_ID']} on {socket.gethostname()} \"\n"
    "      f\"(NM {os.environ.get('NM_HTTP_ADDRESS', '?')}, {os.environ.get('CONTAINER_MEMORY_MB', '?')} MB, \"\n"
    "      f\"{os.environ.get('CONTAINER_VCORES', '?')} vcores): sum of squares 1..{n} = {s} \"\n"
    "      f\"in {time.perf_counter() - t:.2f}s\")\n"
)


def _say(out: TextIO, text: str) -> None:
    out.write(f"[demo] {text}\n")
    out.flush()


def run_on_local_cluster(body: DemoBody, nodes: int = 3, node_memory_mb: int = 1024, node_vcores: int = 2,
                         keep_dir: Path | None = None, out: TextIO = sys.stdout) -> int:
    """Start a LocalCluster (RM on a free port), run `body`, stop the cluster on any exit path."""
    def on_sigterm(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # unwind through the same cleanup as Ctrl-C

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    tmp = None if keep_dir else tempfile.TemporaryDirectory(prefix="elastane-demo-")
    base = keep_dir or Path(tmp.name)  # type: ignore[union-attr]
    cluster = LocalCluster(base, nodes=nodes, node_memory_mb=node_memory_mb, node_vcores=node_vcores,
                           rm_port=0, heartbeat_interval_ms=500)
    try:
        _say(out, f"starting a ResourceManager and {nodes} NodeManagers under {base} ...")
        t = time.monotonic()
        cluster.start()
        _say(out, f"cluster up in {time.monotonic() - t:.1f}s: RM at {cluster.rm_url} "
                  f"(web UI {cluster.rm_url}/cluster), nodes: "
                  + ", ".join(f"{n.node_id}" for n in cluster.nodes))

        async def go() -> int:
            async with RmRestClient(cluster.rm_url, default_user()) as client:
                return await body(cluster, client, out)
        return asyncio.run(go())
    except KeyboardInterrupt:
        _say(out, "interrupted")
        return 130
    except CliError as e:
        _say(out, f"error: {e.message}")
        return e.exit_code
    finally:
        _say(out, "stopping the cluster ...")
        cluster.stop()
        signal.signal(signal.SIGTERM, previous)
        if tmp is not None:
            tmp.cleanup()
        _say(out, "cluster stopped")


async def shell_demo(cluster: LocalCluster, client: RmRestClient, out: TextIO) -> int:
    """Run CONTAINER_SCRIPT in 3 containers, watch it live, print the verdict and every stdout."""
    command = ["python", "-c", CONTAINER_SCRIPT]
    app_id = await app_commands.submit_shell(client, command, num_containers=3, memory=128, vcores=1,
                                             name="demo: sum of squares")
    _say(out, f"submitted {app_id} (distributed shell, 3 containers of 128 MB / 1 vcore)")
    app = await app_commands.watch_app(client, app_id, StatusLine(out), timeout_s=120)
    _say(out, app_commands.final_summary(app))
    refs = await container_logs.find_containers(client, app_id)
    for ref in refs:
        text = (await container_logs.fetch_log(client, ref, "stdout")).strip()
        _say(out, f"{ref.container_id} stdout: {text or '(empty: this is the ApplicationMaster)'}")
    return 0 if app.get("finalStatus") == "SUCCEEDED" else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m elastane_cli.demo", description=__doc__.splitlines()[0])
    p.add_argument("--keep-dir", type=Path, help="use (and keep) this dir instead of a temp dir")
    p.add_argument("--nodes", type=int, default=3)
    ns = p.parse_args(argv)
    if ns.nodes < 1:
        p.error("--nodes must be >= 1")
    return run_on_local_cluster(shell_demo, nodes=ns.nodes, keep_dir=ns.keep_dir)


if __name__ == "__main__":
    sys.exit(main())
