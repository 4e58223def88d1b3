"""`make demo`: start a 3-node local cluster, train a PS job on it with a live progress bar, stop it.

The frame (`run_on_local_cluster`: start a cluster in a temp dir, run a body against it, stop the
cluster whatever happens, Ctrl-C and SIGTERM included) is separate from the bodies: `ps_demo`
(the default: multinomial logistic regression on 2 workers and 1 server, trained to convergence)
`shell_demo` (`--shell`: a distributed-shell app in 3 containers), `cruise_demo` (`--cruise`:
a job started at a bad split of 4 workers and 1 server on nodes with capped bandwidth, which the
Cruise optimizer reshapes while it trains) and `harmony_demo` (`--harmony`: four jobs on a
cluster run by the harmony policy, profiled, grouped, interleaved by the arbiters and spilling).
"""
from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, TextIO

import aiohttp

from protocol import tokens
from protocol.http_client import JsonHttpClient, RemoteError
from protocol.job_report import JobReport
from protocol.json_types import JsonObject, JsonValue, json_float, json_int, json_list, json_object
from protocol.ps_app_schemas import MLRSpec
from protocol.ps_status import PsStatus, ScaleRequest, decode_status
from protocol.yarn_views import AppView

from . import app_commands, container_logs, ps_commands, ps_reports
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
# While it trains the demo scales the job out, then back in, through the AM's POST /scale (what
# `elastane ps scale` calls; EPS: no restart): (epochs done, +workers, +servers).
PS_DEMO_SCALING: tuple[tuple[int, int, int], ...] = ((4, +1, +1), (4, -1, -1))   # epochs after the previous step
SCALE_TIMEOUT_S = 120.0


def _say(out: TextIO, text: str) -> None:
    out.write(f"[demo] {text}\n")
    out.flush()


def run_on_local_cluster(body: DemoBody, nodes: int = 3, node_memory_mb: int = 1024, node_vcores: int = 2,
                         keep_dir: Path | None = None, out: TextIO = sys.stdout,
                         node_bandwidth: str | None = None, network: str = "auto", policy: str = "static") -> int:
    """Start a LocalCluster (RM on a free port), run `body`, stop the cluster on any exit path."""
    def on_sigterm(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # unwind through the same cleanup as Ctrl-C

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    tmp: tempfile.TemporaryDirectory[str] | None = None
    if keep_dir:
        base = keep_dir
    else:
        tmp = tempfile.TemporaryDirectory(prefix="elastane-demo-")
        base = Path(tmp.name)
    cluster = LocalCluster(base, nodes=nodes, node_memory_mb=node_memory_mb, node_vcores=node_vcores,
                           rm_port=0, heartbeat_interval_ms=500, node_bandwidth=node_bandwidth,
                           network=network, policy=policy)
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
    data = spec.typed_data      # decoded once by validate_spec
    if not isinstance(data, MLRSpec):
        raise TypeError(f"PS_DEMO_JOB must be an MLR job, not {spec.app}")
    _say(out, f"submitted {app_id}: multinomial logistic regression, {data.num_samples} samples x "
              f"{data.num_features} features, {data.num_classes} classes, on {spec.workers} workers "
              f"and {spec.servers} server ({spec.executor_memory_mb} MB each), until it converges")
    scaler = asyncio.create_task(scale_while_training(client, app_id, out, PS_DEMO_SCALING, cluster.secret))
    try:
        result = await ps_commands.watch_ps_job(client, app_id, ProgressBar(out), ps_reports.max_epochs_of(spec),
                                                timeout_s=300)
    finally:
        scaler.cancel()
        await asyncio.gather(scaler, return_exceptions=True)
    out.write(render_key_values(ps_reports.final_report(result)) + "\n")
    rows = ps_reports.executor_rows(result.status or PsStatus())
    if rows:
        out.write("executors (as last reported while training):\n"
                  + render_table(ps_reports.EXECUTOR_HEADERS, rows) + "\n")
    out.flush()
    return 0 if result.app.get("finalStatus") == "SUCCEEDED" else 1


# A model that every mini-batch touches all of, on 40 mbit/s links: the one server's link carries
# all 4 workers' pulls, so 4 x 1 is a bad split; Cruise finds a better one while training. Sized to
# generalize (8 rows per weight; the preset's L2 and step decay): held-out accuracy within ~3
# points of the true model's, where 1000 rows for 20 000 x 5 weights reached 0.29 against 0.80.
CRUISE_DEMO_JOB: dict[str, Any] = {
    "app": "mlr", "data": {"num_features": 500, "nnz_per_sample": 100, "num_samples": 20_000,
                           "num_heldout": 2000, "rows_per_block": 1250},
    "workers": 4, "servers": 1, "blocks": 12, "max_epochs": 10,
    "optimizer": "cruise", "cruise": {"min_batches": 4}, "executor_memory_mb": 320,
}
CRUISE_DEMO_BANDWIDTH = "40mbit"


async def cruise_demo(cluster: LocalCluster, client: RmRestClient, out: TextIO) -> int:
    """Submit CRUISE_DEMO_JOB at a bad split and narrate Cruise's plans while it trains."""
    spec = ps_commands.validate_spec(CRUISE_DEMO_JOB)
    app_id = await ps_commands.submit_ps_job(client, spec, "demo: Cruise reshapes a bad split",
                                             am_memory=PS_DEMO_AM_MEMORY_MB)
    _say(out, f"submitted {app_id}: MLR on {spec.workers} workers and {spec.servers} server, links capped at "
              f"{CRUISE_DEMO_BANDWIDTH}; optimizer cruise")
    narrator = asyncio.create_task(narrate_cruise(client, app_id, out))
    try:
        result = await ps_commands.watch_ps_job(client, app_id, ProgressBar(out), ps_reports.max_epochs_of(spec),
                                                timeout_s=600)
    finally:
        narrator.cancel()
        await asyncio.gather(narrator, return_exceptions=True)
    out.write(render_key_values(ps_reports.final_report(result)) + "\n")
    plans = ps_reports.plan_history_rows(result.status or PsStatus())
    if plans:
        out.write("Cruise plans (epoch times: predicted by the cost model, measured on the cluster):\n"
                  + render_table(ps_reports.PLAN_HEADERS, plans) + "\n")
    out.flush()
    return 0 if result.app.get("finalStatus") == "SUCCEEDED" else 1


# The Harmony demo's jobs: four apps whose COMP / COMM balance differs, sized so an epoch takes a
# good part of a second (the policy profiles and groups them while most epochs are still to go);
# two of them keep part of their input on disk (spill, alpha tuned while they train).
HARMONY_DEMO_JOBS: tuple[dict[str, Any], ...] = (
    {"app": "mlr", "data": {"num_samples": 30_000}},
    {"app": "nmf", "data": {"num_users": 6000}, "spill_alpha": "auto"},
    {"app": "lda", "data": {"num_docs": 3000}},
    {"app": "lasso", "data": {"num_samples": 30_000}, "spill_alpha": 0.5},
)
HARMONY_DEMO_EPOCHS = 40


async def harmony_demo(cluster: LocalCluster, client: RmRestClient, out: TextIO) -> int:
    """Submit HARMONY_DEMO_JOBS to a cluster run by the `harmony` policy and narrate what it does
    with them (profiling, groups, pauses), the arbiters' interleaving and the jobs' spill."""
    apps: dict[str, str] = {}
    started = time.monotonic()
    for job in HARMONY_DEMO_JOBS:
        spec = ps_commands.validate_spec({"workers": 1, "servers": 1, "executor_memory_mb": 256,
                                          "max_epochs": HARMONY_DEMO_EPOCHS, "convergence_threshold": 1e-12,
                                          **job})
        app_id = await ps_commands.submit_ps_job(client, spec, f"demo: harmony {job['app']}", am_memory=256)
        apps[app_id] = str(job["app"])
        _say(out, f"submitted {app_id}: {job['app']}"
                  + (f", spill alpha {job['spill_alpha']}" if "spill_alpha" in job else ""))
    seen: dict[str, tuple[JsonValue, ...]] = {}
    final: dict[str, AppView] = {}
    while len(final) < len(apps):
        policy = json_object((await client.policy_state()).get("apps"))
        for app_id, name in apps.items():
            if app_id in final:
                continue
            app = await client.app(app_id)
            if app.get("state") in ("FINISHED", "FAILED", "KILLED"):
                final[app_id] = app
                _say(out, f"{name} {app_id[-4:]}: {app.get('finalStatus')} after "
                          f"{time.monotonic() - started:.0f}s: {str(app.get('diagnostics', ''))[:100]}")
                continue
            st = json_object(policy.get(app_id))
            current = (await client.app_shape(app_id)).get("current") if app.get("state") == "RUNNING" else None
            report = JobReport.decode(current) if current else None
            now = (st.get("state"), st.get("group"), st.get("runState"))
            if st and now != seen.get(app_id):
                seen[app_id] = now
                epoch = report.epoch if report is not None and report.epoch is not None else "-"
                _say(out, f"{name} {app_id[-4:]}: {st.get('state')}" + (f" in {st['group']}" if st.get("group") else "")
                          + f" ({st.get('note', '')}); epoch {epoch}"
                          + (f", spill alpha {report.alpha:.2f} ({report.spilled_mb:.1f} MB on disk)"
                             if report is not None and report.alpha is not None else ""))
        await asyncio.sleep(1.0)
    # How the nodes' arbiters interleaved the co-located jobs' subtasks.
    rows = []
    for node in await client.nodes():
        try:
            arb = await client.nm_arbiter(str(node.get("nodeHTTPAddress", "")))
        except CliError:
            continue
        cpu: dict[str, int] = {}
        for g in map(json_object, json_list(arb.get("grantLog"))):
            if g.get("role") == "cpu":
                key = apps.get(str(g.get("app_id")), str(g.get("app_id") or "?"))
                cpu[key] = cpu.get(key, 0) + 1
        rows.append([node.get("id"), ", ".join(f"{k} {v}" for k, v in sorted(cpu.items())) or "-"])
    out.write("COMP slots granted per job by each node's arbiter (one COMP at a time per node):\n"
              + render_table(["NODE", "COMP GRANTS"], rows) + "\n")
    out.flush()
    return 0 if all(a.get("finalStatus") == "SUCCEEDED" for a in final.values()) else 1


async def narrate_cruise(client: RmRestClient, app_id: str, out: TextIO) -> None:
    """Print each Cruise plan as it starts and ends (from the AM's status)."""
    while True:
        app = await client.app(app_id)
        if app.get("state") == "RUNNING" and app.get("trackingUrl"):
            break
        await asyncio.sleep(0.5)
    am = JsonHttpClient(app["trackingUrl"].rstrip("/"), timeout_s=10, user=client.user)
    seen: dict[int, bool] = {}
    try:
        while True:
            st = await _am_status(am)
            cruise = st.cruise if st is not None else None
            for i, p in enumerate(cruise.plan_history if cruise else []):
                done = p.finished is not None
                if seen.get(i) == done:
                    continue
                seen[i] = done
                if out.isatty():
                    out.write("\n")
                before, chosen = "x".join(map(str, p.shape_before)), "x".join(map(str, p.chosen_shape or []))
                if not done:
                    _say(out, f"Cruise: {before} -> {chosen}, predicted epoch {p.predicted_epoch_before_s or 0:.2f}s -> "
                              f"{p.predicted_epoch_after_s or 0:.2f}s; a plan of {p.ops} ops runs while training goes on")
                else:
                    _say(out, f"Cruise: plan done in {p.plan_s or 0:.2f}s, now "
                              f"{'x'.join(map(str, p.shape_after or []))}" + (f" (error: {p.error})" if p.error else ""))
            await asyncio.sleep(1.0)
    finally:
        await am.close()


async def _am_status(am: JsonHttpClient) -> PsStatus | None:
    """The AM's `/status`, decoded once; None while it does not answer or answers something else."""
    try:
        body = await am.get("/status")
        return decode_status(body) if isinstance(body, dict) else None
    except (RemoteError, aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError):
        return None     # msgspec.ValidationError is a ValueError


async def _epochs_reached(am: JsonHttpClient, n: int) -> PsStatus:
    while True:
        st = await _am_status(am)
        if st is not None and len(st.objective_history) >= n:
            return st
        await asyncio.sleep(0.25)


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _last_epoch_s(status: PsStatus) -> float:
    hist = status.objective_history
    return hist[-1].epoch_time_s if hist else float("nan")


def _changes(body: JsonValue) -> list[JsonObject]:
    """The records of a `/scale` answer ({"changes": [...]}): EPS operations or kill-restarts."""
    changes = body.get("changes") if isinstance(body, dict) else None
    return [c for c in changes if isinstance(c, dict)] if isinstance(changes, list) else []


async def scale_while_training(client: RmRestClient, app_id: str, out: TextIO,
                               steps: tuple[tuple[int, int, int], ...], cluster_secret: str) -> None:
    """Scale the running job by each (after N more epochs, +workers, +servers) step through its AM's
    POST /scale, printing the shape and the epoch time before and after each change. The demo owns
    the cluster, so it signs the AM-control token itself from the cluster secret (a user would go
    through the RM: `elastane ps scale`)."""
    while True:
        app = await client.app(app_id)
        if app.get("state") == "RUNNING" and app.get("trackingUrl"):
            break
        await asyncio.sleep(0.5)
    am = JsonHttpClient(app["trackingUrl"].rstrip("/"), timeout_s=SCALE_TIMEOUT_S, user=client.user)
    try:
        done = 0
        for after, workers, servers in steps:
            st = await _epochs_reached(am, done + after)
            live = st.shape.serving() if st.shape is not None else []
            w0, s0 = sum(e.role == "worker" for e in live), sum(e.role == "server" for e in live)
            word = "out" if workers + servers > 0 else "in"
            if out.isatty():
                out.write("\n")        # below the live progress line
            _say(out, f"scaling {word}: {_n(w0, 'worker')} + {_n(s0, 'server')} -> "
                      f"{_n(w0 + workers, 'worker')} + {_n(s0 + servers, 'server')} "
                      f"(epoch {len(st.objective_history)}, epoch time {_last_epoch_s(st):.2f}s)")
            attempt = st.attempt_id or ""
            token = tokens.am_control_token(tokens.job_secret(cluster_secret, attempt), attempt)
            try:
                body = await am.post("/scale", ScaleRequest(workers=workers, servers=servers), token=token)
            except (RemoteError, aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
                _say(out, f"scale {word} refused or failed: {getattr(e, 'message', None) or e}")
                return
            changes = _changes(body)
            took = sum(json_float(c.get("duration_s", 0)) for c in changes)
            waited = sum(json_float(c.get("training_time_lost_s", 0)) for c in changes)
            moved = sum(json_int(c.get("blocks_moved", 0)) for c in changes)
            after_st = await _am_status(am) or st
            done = len(after_st.objective_history)
            _say(out, f"scaled {word} with EPS in {took:.2f}s while training went on (training waited "
                      f"{waited:.3f}s, {moved} model blocks moved): "
                      + ", ".join(f"{c.get('op')}({c.get('requested')})" for c in changes))
            nxt = await _epochs_reached(am, done + 1)
            now = nxt.shape.serving() if nxt.shape is not None else []
            _say(out, f"now {_n(sum(e.role == 'worker' for e in now), 'worker')} + "
                      f"{_n(sum(e.role == 'server' for e in now), 'server')}: epoch time {_last_epoch_s(nxt):.2f}s "
                      f"(was {_last_epoch_s(st):.2f}s)")
            done = len(nxt.objective_history)
    finally:
        await am.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m elastane_cli.demo", description=__doc__.splitlines()[0])
    p.add_argument("--keep-dir", type=Path, help="use (and keep) this dir instead of a temp dir")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--shell", action="store_true", help="the distributed-shell demo instead of PS training")
    p.add_argument("--cruise", action="store_true",
                   help="start a PS job at a bad split on bandwidth-capped nodes and watch Cruise reshape it")
    p.add_argument("--harmony", action="store_true",
                   help="four PS jobs under --policy harmony: profiled, grouped, interleaved, spilling")
    ns = p.parse_args(argv)
    if ns.nodes < 1:
        p.error("--nodes must be >= 1")
    if ns.shell + ns.cruise + ns.harmony > 1:
        p.error("--shell, --cruise and --harmony are different demos: pick one")
    if ns.harmony:
        # Room for four AMs beside the groups' executors (Harmony sizes the executors to the rest).
        return run_on_local_cluster(harmony_demo, nodes=ns.nodes, node_vcores=8, node_memory_mb=3072,
                                    keep_dir=ns.keep_dir, policy="harmony")
    if ns.cruise:
        return run_on_local_cluster(cruise_demo, nodes=ns.nodes, node_vcores=4, node_memory_mb=2048,
                                    keep_dir=ns.keep_dir, node_bandwidth=CRUISE_DEMO_BANDWIDTH, network="emulated")
    return run_on_local_cluster(shell_demo if ns.shell else ps_demo, nodes=ns.nodes, keep_dir=ns.keep_dir)


if __name__ == "__main__":
    sys.exit(main())
