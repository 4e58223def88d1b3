"""`make demo`: start a 3-node local cluster, train a PS job on it with a live progress bar, stop it.

The frame (`run_on_local_cluster`: start a cluster in a temp dir, run a body against it, stop the
cluster whatever happens, Ctrl-C and SIGTERM included) is separate from the bodies: `ps_demo`
(the default: multinomial logistic regression on 2 workers and 1 server, trained to convergence)
and `shell_demo` (`--shell`: a distributed-shell app in 3 containers).
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

from . import app_commands, container_logs, ps_commands
from .context import default_user
from .errors import CliError
from .local_cluster import LocalCluster
from .rm_rest_client import RmRestClient
from .progress_bar import ProgressBar
from .status_line import StatusLine
from .tables import render_key_values, render_table

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


# The PS demo's job: MLR on 20k synthetic samples (200 features, 5 classes) that converges in
# ~25 epochs of ~0.1 s of compute each, to a held-out accuracy near the true model's.
PS_DEMO_JOB: dict = {
    "app": "mlr", "preset": "tiny", "workers": 2, "servers": 1, "executor_memory_mb": 384,
    "data": {"num_samples": 20_000, "num_features": 200, "num_classes": 5, "nnz_per_sample": 20,
             "num_heldout": 2000, "rows_per_block": 2000},
    "hparams": {"learning_rate": 0.5, "max_epochs": 40},
}
PS_DEMO_AM_MEMORY_MB = 384


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


async def ps_demo(cluster: LocalCluster, client: RmRestClient, out: TextIO) -> int:
    """Submit PS_DEMO_JOB, show its progress bar until it ends, then its result and executors."""
    spec = ps_commands.validate_spec(PS_DEMO_JOB)
    app_id = await ps_commands.submit_ps_job(client, spec, "demo: MLR on a parameter server",
                                             am_memory=PS_DEMO_AM_MEMORY_MB)
    data = spec.app_data()
    _say(out, f"submitted {app_id}: multinomial logistic regression, {data['num_samples']} samples x "
              f"{data['num_features']} features, {data['num_classes']} classes, on {spec.workers} workers "
              f"and {spec.servers} server ({spec.executor_memory_mb} MB each), until it converges")
    result = await ps_commands.watch_ps_job(client, app_id, ProgressBar(out), ps_commands.max_epochs_of(spec),
                                            timeout_s=300)
    out.write(render_key_values(ps_commands.final_report(result)) + "\n")
    rows = ps_commands.executor_rows(result.status or {})
    if rows:
        out.write("executors (as last reported while training):\n"
                  + render_table(ps_commands.EXECUTOR_HEADERS, rows) + "\n")
    out.flush()
    return 0 if result.app.get("finalStatus") == "SUCCEEDED" else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m elastane_cli.demo", description=__doc__.splitlines()[0])
    p.add_argument("--keep-dir", type=Path, help="use (and keep) this dir instead of a temp dir")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--shell", action="store_true", help="the distributed-shell demo instead of PS training")
    ns = p.parse_args(argv)
    if ns.nodes < 1:
        p.error("--nodes must be >= 1")
    return run_on_local_cluster(shell_demo if ns.shell else ps_demo, nodes=ns.nodes, keep_dir=ns.keep_dir)


if __name__ == "__main__":
    sys.exit(main())
