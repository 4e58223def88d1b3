"""Container launch latency on a local cluster against a bare fork+exec of the same command.

    .venv/bin/python bench/container_launch.py [--containers 200] [--nodes 2] [--window 8] [--serial 40]
        [--container-shells 4]

Launch latency = from the moment the AM receives a container's allocation (the allocate response
is read off the wire) to the moment the container's command starts. Every container runs

    date +%s%N > "$LAUNCH_STAMP"

which records CLOCK_REALTIME (shared by every process on the machine) as its first action. The
bench starts a LocalCluster (RM on an ephemeral port, `--nodes` NMs, cgroups auto-detected) in a
temp dir and submits, over the YARN REST API, an app whose AM is bench/container_launch_am.py.
The AM asks for `--containers` containers of 64 MB / 1 vcore in a rolling window (asking again as
containers complete, so grants come in waves as capacity frees), launches each on arrival and
writes per-container timelines to the JSON file named by its environment (am-container-spec).

The baseline, in the same run and with the cluster idle, fork+execs exactly the same command the
same way the NM's container shell does (`/bin/bash -c COMMAND`) with subprocess.Popen, measured
from just before Popen to the stamp. A second reference runs the NM's own wrapper script
(nodemanager.launcher.wrapper_script, minus the cgroup join) the same way, to separate the
wrapper's cost from the NM's.

Then, on the same cluster, `--serial` more launches one at a time (window 1): the NM's own path
without the queueing that eight launches in flight add on a 2-core host (`serial_*` keys). Each NM
reports how it started every container (a pre-started shell, cold, or the executor zygote) and its
start path phase by phase; `nm_phases_p50_ms` has their p50s per path. `--container-shells 0` runs
the NMs without pre-started shells (every launch joins its cgroup on the launch path), to compare.
The launches start once every NM's executor zygote has imported its modules (node info
`executorZygote.ready`): its preload is the NM's start-up, and on few cores it took a core from the
first waves. The cluster's dirs (the NMs' local, log and recovery dirs) go in a temp dir under `--work-dir` (by
default the system temp dir); `work_dir_fs` names its filesystem, which the figures depend on: a
launch creates several files (dirs, script, logs, exit file), and on an ext4 without a journal
each create beside many recently removed inodes scans them.

Prints a summary, then one JSON object as the last line:
{"launch_p50_ms", "launch_p99_ms", "fork_exec_p50_ms", "ratio_p50", "nm_phases_p50_ms",
 "serial_launch_p50_ms", "serial_ratio_p50", "work_dir_fs", ...}.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from support.sigterm import unwind_on_sigterm  # noqa: E402  (bench/support: not a benchmark itself)

from elastane_cli.errors import CliError  # noqa: E402
from elastane_cli.local_cluster import ClusterStartError, LocalCluster  # noqa: E402
from elastane_cli.rm_rest_client import RmRestClient  # noqa: E402
from nodemanager import launcher  # noqa: E402
from nodemanager.cgroup_detect import parse_mounts  # noqa: E402
from protocol.internal_api import LaunchContext  # noqa: E402
from protocol.records import AppState  # noqa: E402

COMMAND = 'date +%s%N > "$LAUNCH_STAMP"'
SHELL = "/bin/bash"      # what the NM runs each container command with (docs/internals.md)
AM_SCRIPT = ROOT / "bench" / "container_launch_am.py"
FINAL_STATES = {s.value for s in AppState if s.is_final}
ZYGOTE_READY_TIMEOUT_S = 60.0
POLL_S = 0.2


class BenchError(RuntimeError):
    """The benchmark could not produce figures (the app failed, timed out, ...)."""


# ----- measurement helpers ----------------------------------------------------------------------

def pct(values: Sequence[float], q: float) -> float:
    """The q-th percentile (linear interpolation), rounded to microseconds in ms."""
    return round(float(np.percentile(np.asarray(values, dtype=float), q)), 3) if values else float("nan")


def read_stamp(path: Path) -> int:
    try:
        return int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def time_popen(argv: list[str], runs: int, stamp_dir: Path, cwd: Path) -> list[float]:
    """ms from just before Popen to the command's own stamp, for `runs` sequential runs."""
    stamp_dir.mkdir(parents=True, exist_ok=True)
    out: list[float] = []
    base_env = dict(os.environ)
    for i in range(runs):
        stamp = stamp_dir / f"run{i}"
        env = dict(base_env, LAUNCH_STAMP=str(stamp))   # built before the clock starts
        t0 = time.time_ns()
        p = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL)
        if p.wait() != 0:
            raise BenchError(f"{argv} exited with {p.returncode}")
        ns = read_stamp(stamp)
        if not ns:
            raise BenchError(f"{argv} wrote no stamp to {stamp}")
        out.append((ns - t0) / 1e6)
    return out


def fork_exec_baseline(runs: int, work: Path) -> list[float]:
    """The same command, started the way the NM's container shell starts it, straight from Popen."""
    return time_popen([SHELL, "-c", COMMAND], runs, work / "fork_stamps", work)


def wrapper_baseline(runs: int, work: Path) -> list[float]:
    """The NM's launch_container.sh (without cgroup join) around the same command, from Popen."""
    spec = launcher.LaunchSpec(container_id="container_0_0001_01_000001", app_id="application_0_0001",
                               attempt_id="", user="bench", memory_mb=64, vcores=1, work_dir=str(work),
                               log_dir=str(work), exit_file=str(work / "wrapper.exit"), nm_host="127.0.0.1",
                               nm_port=0)
    script = work / "launch_container.sh"
    script.write_text(launcher.wrapper_script(spec, launcher.build_command(spec, LaunchContext(commands=[COMMAND]))))
    script.chmod(0o700)
    return time_popen([SHELL, str(script)], runs, work / "wrapper_stamps", work)


@dataclass
class LaunchFigures:
    """Per-phase latencies (ms) of the containers the AM measured."""

    launch: list[float]           # alloc -> command started
    am_dispatch: list[float]      # alloc -> NM start call issued (AM side)
    start_rpc: list[float]        # NM start call issued -> answered
    call_to_start: list[float]    # NM start call issued -> command started
    return_to_start: list[float]  # NM answered -> command started (negative: started before the answer)
    per_node: dict[str, list[float]]

    @classmethod
    def from_result(cls, result: dict[str, Any]) -> "LaunchFigures":
        ok = [c for c in result["containers"]
              if c["exit_status"] == 0 and c["started_ns"] and c["call_ns"] and c["return_ns"]]
        ms = lambda a, b: [(c[b] - c[a]) / 1e6 for c in ok]   # noqa: E731
        per_node: dict[str, list[float]] = {}
        for c in ok:
            per_node.setdefault(c["node_id"], []).append((c["started_ns"] - c["alloc_ns"]) / 1e6)
        return cls(ms("alloc_ns", "started_ns"), ms("alloc_ns", "call_ns"), ms("call_ns", "return_ns"),
                   ms("call_ns", "started_ns"), ms("return_ns", "started_ns"), per_node)


# ----- the cluster run --------------------------------------------------------------------------

def am_submission(app_id: str, args: argparse.Namespace, result_file: Path, stamp_dir: Path,
                  containers: int, window: int) -> dict[str, Any]:
    """YARN REST application-submission-context whose AM is the bench AM."""
    cmd = ["python", str(AM_SCRIPT), "--containers", str(containers), "--memory", str(args.memory),
           "--vcores", "1", "--window", str(window), "--command", COMMAND,
           "--deadline-s", str(args.timeout_s)]
    env = {"PYTHONUNBUFFERED": "1", "BENCH_LAUNCH_RESULT": str(result_file),
           "BENCH_LAUNCH_STAMP_DIR": str(stamp_dir), "PYTHONPATH": str(ROOT)}
    return {
        "application-id": app_id,
        "application-name": "container-launch-bench",
        "application-type": "BENCH",
        "queue": "default",
        "am-container-spec": {
            "commands": {"command": shlex.join(cmd)},
            "environment": {"entry": [{"key": k, "value": v} for k, v in env.items()]},
        },
        "max-app-attempts": 1,
        "resource": {"memory": args.am_memory, "vCores": 1},
    }


async def submit_and_wait(rm_url: str, sub_for: Any, timeout_s: float) -> dict[str, Any]:
    """new-application, submit, then poll the app until it reaches a final state."""
    async with RmRestClient(rm_url, user="bench") as rm:
        new = await rm.new_application()
        app_id = new.get("application-id")
        if not app_id:
            raise BenchError(f"new-application answered without an application-id: {new}")
        await rm.submit(sub_for(app_id))
        deadline = time.monotonic() + timeout_s
        while True:
            app = await rm.app(app_id)
            if app.get("state") in FINAL_STATES:
                return app
            if time.monotonic() > deadline:
                await rm.kill(app_id)
                raise BenchError(f"{app_id} still {app.get('state')} after {timeout_s:.0f}s; killed it")
            await asyncio.sleep(POLL_S)


def nm_get(http_address: str, path: str, field: str) -> Any:
    """`field` of the JSON an NM serves at `path`, or None when unreadable."""
    try:
        with urllib.request.urlopen(f"http://{http_address}{path}", timeout=10) as r:
            return json.loads(r.read())[field]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def node_info(http_address: str) -> dict[str, Any]:
    """An NM's /ws/v1/node/info ({} when unreadable)."""
    return dict(nm_get(http_address, "/ws/v1/node/info", "nodeInfo") or {})


def enforcement_mode(cluster: LocalCluster) -> str:
    """What the first NM enforces limits with (v1 / v2 / rss-monitor)."""
    return str(node_info(cluster.nodes[0].http_address).get("enforcement", "unknown"))


def wait_for_zygotes(cluster: LocalCluster, timeout_s: float = ZYGOTE_READY_TIMEOUT_S) -> float:
    """Wait until every NM's executor zygote has imported its modules (or the NM runs none) and
    return the longest preload: a zygote still importing takes a core from the first waves of
    launches (0.4-0.5 s of CPU each on the 2-core VM), which is the NM's start-up, not its launch path."""
    deadline = time.monotonic() + timeout_s
    while True:
        zygotes = [node_info(n.http_address).get("executorZygote") for n in cluster.nodes]
        if all(z is None or z.get("ready") for z in zygotes):
            return max((float(z.get("preloadS") or 0) for z in zygotes if z), default=0.0)
        if time.monotonic() > deadline:
            raise BenchError(f"the NMs' executor zygotes were not ready after {timeout_s:.0f}s: {zygotes}")
        time.sleep(POLL_S)


def shell_launches(cluster: LocalCluster) -> dict[str, int]:
    """Launches that took a pre-started shell (nodemanager.container_shell_pool) and that found
    none ready, summed over the NMs."""
    out = {"served": 0, "missed": 0}
    for node in cluster.nodes:
        shells = node_info(node.http_address).get("containerShells", {})
        for k in out:
            out[k] += int(shells.get(k, 0))
    return out


def am_log_tail(cluster: LocalCluster, app_id: str, lines: int = 30) -> str:
    """The AM container's stderr (the app's first container), for a failed run."""
    for node in cluster.nodes:
        for f in sorted((node.log_dir / app_id).glob("container_*_000001/stderr")):
            return "\n".join(f.read_text(errors="replace").splitlines()[-lines:])
    return "(no AM log found)"


def nm_launch_phases(cluster: LocalCluster, app_id: str) -> list[dict[str, Any]]:
    """Each of the app's containers as its NM reports it: how it started (launchPath) and the NM's
    start path, phase by phase (launchPhasesMs), from /ws/v1/node/containers."""
    out = []
    for node in cluster.nodes:
        listed = (nm_get(node.http_address, "/ws/v1/node/containers", "containers") or {}).get("container", [])
        out += [c for c in listed if c.get("appId") == app_id and c.get("launchPhasesMs")]
    return out


def run_app(cluster: LocalCluster, args: argparse.Namespace, work: Path, tag: str, containers: int,
            window: int) -> dict[str, Any]:
    """One bench AM run of `containers` launches `window` at a time; its timelines plus the NMs'."""
    result_file, stamp_dir = work / f"am_result_{tag}.json", work / f"stamps_{tag}"
    stamp_dir.mkdir(parents=True, exist_ok=True)
    before = shell_launches(cluster)
    app = asyncio.run(submit_and_wait(
        cluster.rm_url, lambda app_id: am_submission(app_id, args, result_file, stamp_dir, containers, window),
        args.timeout_s + 30))
    if app.get("finalStatus") != "SUCCEEDED" or not result_file.exists():
        raise BenchError(f"{app.get('id')} ended {app.get('state')}/{app.get('finalStatus')}: "
                         f"{app.get('diagnostics')}\nAM stderr:\n{am_log_tail(cluster, app.get('id', ''))}")
    result = json.loads(result_file.read_text())
    after = shell_launches(cluster)
    result["shells"] = {k: after[k] - before[k] for k in after}
    result["nm"] = nm_launch_phases(cluster, str(app.get("id")))
    return result


def run_cluster(args: argparse.Namespace, work: Path
                ) -> tuple[dict[str, Any], dict[str, Any] | None, str, list[float], list[float]]:
    """Start the cluster, run the AM (windowed, then serial), measure the baselines; always stop
    the cluster."""
    cluster = LocalCluster(work / "cluster", nodes=args.nodes, node_memory_mb=args.node_memory_mb,
                           node_vcores=args.node_vcores, rm_port=0, heartbeat_interval_ms=args.heartbeat_ms,
                           cgroups=args.cgroups, env={"ELASTANE_LOG_LEVEL": "WARNING"},
                           extra_nm_args=["--container-shells", str(args.container_shells)])
    try:
        cluster.start()
        mode = enforcement_mode(cluster)
        wait_for_zygotes(cluster)
        result = run_app(cluster, args, work, "window", args.containers, args.window)
        # One launch at a time: the NM's own path, without the queueing a window adds on few cores.
        serial = run_app(cluster, args, work, "serial", args.serial, 1) if args.serial else None
        # Same run, cluster up but idle: the machine in the same state the containers saw.
        fork = fork_exec_baseline(args.containers, work)
        wrapper = wrapper_baseline(args.containers, work)
        return result, serial, mode, fork, wrapper
    finally:
        cluster.stop()


# ----- report -----------------------------------------------------------------------------------

def nm_phase_p50(result: dict[str, Any]) -> dict[str, dict[str, float]]:
    """The NM's start path per launch path (shell / cold / zygote): p50 ms of each phase it
    reported -- handoff (to the worker thread), cgroup, dirs, spawn (the wrapper started or the
    script handed to a shell), stat, return (back on the event loop) -- and of their sum."""
    by_path: dict[str, list[dict[str, float]]] = {}
    for c in result.get("nm", []):
        by_path.setdefault(str(c.get("launchPath") or "?"), []).append(c["launchPhasesMs"])
    out: dict[str, dict[str, float]] = {}
    for path, rows in sorted(by_path.items()):
        names = sorted({k for r in rows for k in r})
        out[path] = {k: pct([r[k] for r in rows if k in r], 50) for k in names}
        out[path]["total"] = pct([sum(r.values()) for r in rows], 50)
        out[path]["containers"] = len(rows)
    return out


def summarise(args: argparse.Namespace, result: dict[str, Any], serial: dict[str, Any] | None, mode: str,
              fork: list[float], wrapper: list[float], wall_s: float) -> dict[str, Any]:
    f = LaunchFigures.from_result(result)
    if not f.launch:
        raise BenchError("the AM measured no container")
    launch_p50, fork_p50 = pct(f.launch, 50), pct(fork, 50)
    print(f"container launch latency over {len(f.launch)} containers "
          f"({args.memory} MB / 1 vcore, {args.nodes} NMs x {args.node_vcores} vcores, window {args.window}, "
          f"enforcement {mode}, NM heartbeat {args.heartbeat_ms} ms)")
    print(f"  command: {COMMAND}  (run as {SHELL} -c COMMAND)")
    rows = [("alloc -> command started", f.launch),
            ("  alloc -> NM start call (AM)", f.am_dispatch),
            ("  NM start call round trip", f.start_rpc),
            ("  NM start call -> command started", f.call_to_start),
            ("  NM answered -> command started", f.return_to_start),
            ("fork+exec baseline (Popen)", fork),
            ("NM wrapper script via Popen", wrapper)]
    print(f"  {'phase':<38}{'p50 ms':>10}{'p90 ms':>10}{'p99 ms':>10}{'max ms':>10}")
    for name, vals in rows:
        print(f"  {name:<38}{pct(vals, 50):>10.3f}{pct(vals, 90):>10.3f}{pct(vals, 99):>10.3f}"
              f"{max(vals):>10.3f}")
    for node, vals in sorted(f.per_node.items()):
        print(f"  on {node}: {len(vals)} containers, p50 {pct(vals, 50):.3f} ms")
    ratio = round(launch_p50 / fork_p50, 1) if fork_p50 > 0 else None
    phases = nm_phase_p50(result)
    for path, ph in phases.items():
        print(f"  NM start path, {path} ({int(ph['containers'])} containers), p50 ms: "
              + ", ".join(f"{k} {v:.3f}" for k, v in ph.items() if k != "containers"))
    print(f"  launch p50 is {ratio}x a bare fork+exec; {result['failures']} failed containers; "
          f"{result['shells']['served']} launched in pre-started shells")
    extra: dict[str, Any] = {}
    if serial is not None:
        g = LaunchFigures.from_result(serial)
        if g.launch:
            sp50 = pct(g.launch, 50)
            extra = {"serial_launch_p50_ms": sp50, "serial_ratio_p50": round(sp50 / fork_p50, 1) if fork_p50 > 0 else None,
                     "serial_nm_start_rpc_p50_ms": pct(g.start_rpc, 50),
                     "serial_nm_call_to_start_p50_ms": pct(g.call_to_start, 50), "serial_containers": len(g.launch),
                     "serial_shell_launches": serial["shells"]["served"], "serial_nm_phases_p50_ms": nm_phase_p50(serial)}
            print(f"  one at a time ({len(g.launch)} containers): launch p50 {sp50:.3f} ms, "
                  f"{extra['serial_ratio_p50']}x a bare fork+exec; NM call -> started p50 "
                  f"{extra['serial_nm_call_to_start_p50_ms']:.3f} ms")
    print(f"  run took {wall_s:.1f} s")
    return {
        "launch_p50_ms": launch_p50, "launch_p99_ms": pct(f.launch, 99), "fork_exec_p50_ms": fork_p50,
        "fork_exec_p99_ms": pct(fork, 99), "ratio_p50": ratio, "containers": len(f.launch),
        "failed_containers": result["failures"], "cgroups": mode,
        "am_dispatch_p50_ms": pct(f.am_dispatch, 50), "nm_start_rpc_p50_ms": pct(f.start_rpc, 50),
        "nm_call_to_start_p50_ms": pct(f.call_to_start, 50), "nm_wrapper_exec_p50_ms": pct(wrapper, 50),
        "container_shells": args.container_shells, "shell_launches": result["shells"]["served"],
        "cold_launches": result["shells"]["missed"], "nm_phases_p50_ms": phases, **extra,
        "nodes": args.nodes, "window": args.window, "container_memory_mb": args.memory,
        "wall_s": round(wall_s, 1),
    }


def filesystem_of(path: Path) -> str:
    """The type of the filesystem `path` is on (the mount with the longest matching mount point):
    the NM creates and removes several files per launch, so the launch figures depend on it -- on
    an ext4 without a journal, each file created beside many recently removed ones scans them."""
    try:
        mounts = parse_mounts(Path("/proc/mounts").read_text())
    except OSError:
        return "unknown"
    real = str(path.resolve())
    best = max((m for m in mounts if real == m.mount_point or real.startswith(m.mount_point.rstrip("/") + "/")),
               key=lambda m: len(m.mount_point), default=None)
    return best.fstype if best is not None else "unknown"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--containers", type=int, default=200, help="containers to measure (and baseline runs)")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--node-vcores", type=int, default=4, help="vcores each NM declares")
    p.add_argument("--node-memory-mb", type=int, default=1024)
    p.add_argument("--memory", type=int, default=64, help="MB per container")
    p.add_argument("--am-memory", type=int, default=256, help="MB for the bench AM")
    p.add_argument("--window", type=int, default=8, help="max containers asked-for or running at once")
    p.add_argument("--heartbeat-ms", type=int, default=250, help="NM heartbeat interval")
    p.add_argument("--cgroups", choices=["auto", "v1", "v2", "off"], default="auto")
    p.add_argument("--container-shells", type=int, default=4,
                   help="pre-started shells per NM (its container_shells setting; 0 = every launch cold)")
    p.add_argument("--serial", type=int, default=40,
                   help="then this many launches one at a time (window 1; 0 = skip)")
    p.add_argument("--timeout-s", type=float, default=150.0, help="give up on the app after this long")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs, stamps, AM result)")
    p.add_argument("--work-dir", help="make the temp dir (the NMs' local, log and recovery dirs) here; "
                                      "default: the system temp dir")
    ns = p.parse_args(list(argv))
    for label in ("containers", "nodes", "node_vcores", "node_memory_mb", "memory", "am_memory", "window",
                  "heartbeat_ms", "timeout_s"):
        if getattr(ns, label) <= 0:
            p.error(f"--{label.replace('_', '-')} must be positive, got {getattr(ns, label)}")
    for label in ("serial", "container_shells"):
        if getattr(ns, label) < 0:
            p.error(f"--{label.replace('_', '-')} must be >= 0, got {getattr(ns, label)}")
    return ns


def main(argv: Sequence[str] | None = None) -> int:
    unwind_on_sigterm()   # a SIGTERM stops the cluster this bench started
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        work = Path(tempfile.mkdtemp(prefix="elastane-bench-launch-", dir=args.work_dir))
    except OSError as e:
        print(f"container_launch: --work-dir {args.work_dir}: {e}", file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        result, serial, mode, fork, wrapper = run_cluster(args, work)
        figures = summarise(args, result, serial, mode, fork, wrapper, time.monotonic() - started)
        figures["work_dir_fs"] = filesystem_of(work)
        print(f"  the NMs' dirs were on {figures['work_dir_fs']} ({work.parent})")
    except (BenchError, CliError, ClusterStartError) as e:
        print(f"container_launch: {type(e).__name__}: {e}", file=sys.stderr)
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
