"""Multi-host benchmark: cluster start, the cross-host data plane and AM host loss, on the testbed.

    .venv/bin/python bench/multihost.py [--quick] [--parts start,dataplane,am] [--keep-dir D]

Every figure runs on emulated hosts (elastane_cli.testbed_hosts: a network namespace with its own
address on a bridge, its own /tmp, hostname and sshd per host) and has its baseline measured in the
same run; varying figures are the median of repetitions.

1. start: wall time of the real `bin/start-cluster HOSTSFILE` on the `master` host (the RM there,
   then an NM on every node host over ssh, all at once) until all N nodes are RUNNING at the RM,
   for N = 3 and 6 node hosts (`start_cluster_s_n3`, `start_cluster_s_n6`). Baseline: the same RM
   and N NMs started one host at a time -- `bin/start-rm`, then `bin/start-nm` over ssh from the
   master on each host in turn (`serial_start_s_n6`), and in it the median time one host's NM takes
   (`start_one_nm_s`). `start_parallel_speedup_n6` = serial / parallel. `bin/stop-cluster` between
   repetitions.
2. dataplane: push+pull of float32 blocks (1 MiB, the headline, and 8 MiB) from a client on node1
   to a server executor (`python -m psruntime.executor`) on node2, against a raw TCP socket between
   the same two hosts over the same veths (bench/dataplane.py's ceiling: the better of a serial
   echo and a pipelined stream; the store's figure is the better of serial and pipelined pairs).
   Raw and store rounds alternate; each figure is the median over rounds, each ratio the median of
   the rounds' ratios (a store round against the raw round next to it). Run twice: on uncapped
   links (`crosshost_*`: both sides CPU-bound on this machine) and with every link capped by tc at
   `link_cap_bps` (`capped_*`: both bound by the link; bytes count both ways, so the ceiling is
   near 2 x the cap).
3. am: a PS job (mlr, 2 workers 2 servers, a checkpoint every epoch, two AM attempts) on a cluster
   of 4 node hosts. At epoch k the host running its AM dies (testbed.kill_host: link cut, every
   process SIGKILLed); `am_host_loss_recovery_s` is from the kill until attempt 2 (on another host,
   resumed from the checkpoint on shared storage) has trained the epoch the job was in when its host
   died, i.e. its AM's objective history is longer than at the kill. Baseline, on the same cluster
   (the hosts that are left): `restart_from_scratch_s`, from the submission of a fresh copy of the
   job until it has trained as many epochs. Also `resumed_from_epoch` (the checkpoint attempt 2
   resumed from), `am_resumed_s` (kill -> attempt 2 resumed, by the AM's own clock, same machine)
   and `am_attempt2_s` (kill -> the RM lists attempt 2).

Nothing is left behind: every part stops its cluster with `bin/stop-cluster` and removes its hosts
(processes, namespaces, cgroups) in a `finally`; `left_behind` in the JSON lists anything found.
Prints a summary, then one JSON object as the last line.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from appmaster.ps.submission import build_ps_submission  # noqa: E402
from elastane_cli import node_network  # noqa: E402
from elastane_cli.testbed_cluster import MASTER, PROJECT, TestbedCluster  # noqa: E402
from elastane_cli.testbed_hosts import Testbed, unavailable_reason  # noqa: E402
from protocol.ps_status import PsStatus, decode_status  # noqa: E402
from support.http_json import http_json  # noqa: E402
from support.sigterm import unwind_on_sigterm  # noqa: E402
from support.watched_job import wait_for  # noqa: E402

# bench/dataplane.py: its raw ceiling (server loop, echo and stream rounds) and its store loops.
# Imported by name so that mypy, checking this file, does not check that one too.
dataplane: Any = importlib.import_module("dataplane")

PY = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable
PARTS = ("start", "dataplane", "am")
LINK_CAP_BPS = 1_000_000_000
DP_SIZES = {"1mib": 1 << 20, "8mib": 8 << 20}
FINAL = ("FINISHED", "FAILED", "KILLED")
JOB: dict[str, Any] = {"app": "mlr", "workers": 2, "servers": 2, "max_epochs": 100_000,
                       "convergence_threshold": 1e-12, "checkpoint_every_epochs": 1,
                       "hparams": {"learning_rate": 0.5}, "executor_memory_mb": 320}


def log(text: str) -> None:
    print(f"[multihost] {text}", file=sys.stderr, flush=True)


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def testbed_leftovers(tb: Testbed) -> list[str]:
    """What of a removed testbed is still there: its namespaces / links, its cgroup dirs, and the
    processes `remove` had to kill or could not remove."""
    tag = node_network.cluster_tag(tb.base_dir)
    out = [f"net {n}" for n in node_network.leftovers(tag)]
    out += [f"cgroup {d}" for h in tb.hosts if h.budget for d in h.budget.dirs.values() if Path(d).exists()]
    out += [f"pid {p} (killed by remove)" for p in tb.leftover_pids]
    out += [f"error {e}" for e in tb.errors]
    return out


def cluster_leftovers(c: TestbedCluster) -> list[str]:
    out = [f"{h}: {x}" for h, xs in c.leftovers.items() for x in xs]
    if c.stop_returncode not in (None, 0):
        out.append(f"bin/stop-cluster exited {c.stop_returncode}: {c.stop_output.strip()[-300:]}")
    return out + testbed_leftovers(c.testbed)


# ----- 1. cluster start ---------------------------------------------------------------------------

def _run_master(c: TestbedCluster, argv: list[str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    r = c.testbed.run(MASTER, argv, env=c.env(), timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} on {MASTER} exited {r.returncode}:\n{r.stdout}{r.stderr}\n{c.logs()}")
    return r


def _hosts_file(c: TestbedCluster, n: int) -> Path:
    path = c.conf_dir / f"workers-{n}"
    path.write_text("".join(f"{name}\n" for name in c.node_names[:n]))
    return path


def _wait_running(c: TestbedCluster, n: int) -> None:
    c.await_nodes_running(c.node_names[:n], time.monotonic() + 120)


def time_parallel_start(c: TestbedCluster, n: int) -> float:
    """bin/start-cluster on the master until every one of the first n nodes is RUNNING."""
    hosts = _hosts_file(c, n)
    t0 = time.monotonic()
    _run_master(c, [str(PROJECT / "bin" / "start-cluster"), str(hosts)])
    _wait_running(c, n)
    elapsed = time.monotonic() - t0
    _run_master(c, [str(PROJECT / "bin" / "stop-cluster"), str(hosts)])
    return elapsed


SERIAL_SCRIPT = r"""
set -euo pipefail
bin=$1; shift
read -r -a ssh_opts <<<"${ELASTANE_SSH_OPTS:-}"
echo "t rm $(date +%s.%N)"
"$bin/start-rm" >/dev/null
echo "t rm-up $(date +%s.%N)"
for host in "$@"; do
  ssh -o BatchMode=yes "${ssh_opts[@]}" "$host" \
    "ELASTANE_CONF_DIR=$(printf '%q' "$ELASTANE_CONF_DIR") ELASTANE_HOSTNAME=$host $(printf '%q' "$bin/start-nm")" \
    </dev/null >/dev/null
  echo "t $host $(date +%s.%N)"
done
"""


def time_serial_start(c: TestbedCluster, n: int) -> dict[str, Any]:
    """The baseline: the RM, then the first n NMs one host at a time (start-nm over ssh from the
    master, each waited for as start-cluster waits for all), until all n are RUNNING."""
    hosts = _hosts_file(c, n)
    t0 = time.monotonic()
    r = _run_master(c, ["bash", "-c", SERIAL_SCRIPT, "serial-start", str(PROJECT / "bin"), *c.node_names[:n]])
    _wait_running(c, n)
    elapsed = time.monotonic() - t0
    marks = [float(line.split()[2]) for line in r.stdout.splitlines() if line.startswith("t ")]
    _run_master(c, [str(PROJECT / "bin" / "stop-cluster"), str(hosts)])
    per_nm = [b - a for a, b in zip(marks[1:], marks[2:])]
    return {"total_s": elapsed, "rm_s": marks[1] - marks[0], "per_nm_s": per_nm}


def part_start(base: Path, reps: int, sizes: tuple[int, ...] = (3, 6)) -> tuple[dict[str, Any], list[str]]:
    c = TestbedCluster(base, workers=max(sizes))
    par: dict[int, list[float]] = {n: [] for n in sizes}
    serial: list[dict[str, Any]] = []
    try:
        log(f"start: building {max(sizes) + 1} hosts")
        c.testbed.create()
        c.write_conf()
        # Warm-up, not timed: the first start on fresh hosts pays for cold caches (ssh, Python's
        # imports) that every later one finds warm, the baseline's included.
        time_parallel_start(c, max(sizes))
        for rep in range(reps):
            # Alternate the three so load from other work on the machine hits all alike.
            for n in sizes:
                par[n].append(time_parallel_start(c, n))
                log(f"start: rep {rep + 1}/{reps}: start-cluster with {n} nodes {par[n][-1]:.2f}s")
            serial.append(time_serial_start(c, max(sizes)))
            log(f"start: rep {rep + 1}/{reps}: serial start of {max(sizes)} NMs {serial[-1]['total_s']:.2f}s "
                f"(RM {serial[-1]['rm_s']:.2f}s, NMs {', '.join(f'{x:.2f}' for x in serial[-1]['per_nm_s'])})")
    finally:
        try:
            # Whatever a failed repetition left running, as an operator would stop it.
            c.testbed.run(MASTER, [str(PROJECT / "bin" / "stop-cluster"), str(c.hosts_file)], env=c.env(), timeout=120)
        except Exception as e:  # noqa: BLE001 - the hosts are removed next in any case
            log(f"start: final stop-cluster: {e}")
        left = [f"pid {p}" for h in c.testbed.hosts if h.anchor_pid for p in c.testbed.service_pids(h.name)]
        c.testbed.remove()
        left += testbed_leftovers(c.testbed)
    nmax = max(sizes)
    serial_s = median([s["total_s"] for s in serial])
    out: dict[str, Any] = {f"start_cluster_s_n{n}": median(par[n]) for n in sizes}
    out |= {f"serial_start_s_n{nmax}": serial_s,
            "start_one_nm_s": median([x for s in serial for x in s["per_nm_s"]]),
            "start_rm_s": median([s["rm_s"] for s in serial]),
            f"start_parallel_speedup_n{nmax}": serial_s / median(par[nmax]),
            "start_reps": reps}
    return out, left


# ----- 2. cross-host data plane -------------------------------------------------------------------

class RemoteRaw(dataplane.RawSide):
    """bench/dataplane.py's raw side, connected to a raw server on another host."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        super().__init__(port)

    def _connect(self, port: int, mode: bytes) -> socket.socket:
        sock = socket.create_connection((self.host, port), timeout=dataplane.RAW_IDLE_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(mode)
        return sock


async def client_measure(address: str, raw_host: str, raw_port: int, seconds: float,
                         rounds: int) -> dict[str, Any]:
    """On the client host: alternate raw and store rounds per size; per round the raw ceiling
    (better of echo and stream) and the store (better of serial and pipelined); medians."""
    from psruntime.wire.dataplane import DataPlaneClient  # noqa: PLC0415
    from psruntime.store.ownership_table import OwnershipTable  # noqa: PLC0415

    dp = DataPlaneClient()
    table = OwnershipTable(dataplane.NUM_BLOCKS, ["srv"] * dataplane.NUM_BLOCKS, {"srv": address}, 1)
    await dp.request(address, {"op": "set_ownership", "table": table.to_wire()})
    await dp.close()
    raw, store = RemoteRaw(raw_host, raw_port), dataplane.StoreSide(address)
    per_round = seconds / rounds
    out: dict[str, Any] = {}
    for i, (name, nbytes) in enumerate(DP_SIZES.items()):
        windows = dataplane.store_windows(nbytes)
        rows: list[dict[str, float]] = []
        for _ in range(rounds):
            echo, _ = raw.round_trips(nbytes, nbytes, per_round)
            stream = raw.pipelined(nbytes, per_round, dataplane.stream_window(nbytes))
            serial, _ = await store.run(nbytes, per_round, keys=[100 * i])
            piped = [(await store.run(nbytes, per_round, keys=dataplane.keys_in_distinct_blocks(w, 100 * i + 1000 * w)))[0]
                     for w in windows]
            rows.append({"echo": echo, "stream": stream, "raw": max(echo, stream), "serial": serial,
                         "pipelined": max(piped), "store": max(serial, *piped)})
        med = {k: median([r[k] for r in rows]) for k in rows[0]}
        ratios = [r["store"] / r["raw"] for r in rows]   # paired rounds: load drift hits both alike
        out[name] = {**med, "ratio": median(ratios), "ratios": ratios}
    await store.check_exactly_once()
    raw.close()
    return out


def _wait_file(path: Path, proc: subprocess.Popen[bytes], what: str) -> str:
    deadline = time.monotonic() + 60
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start (exit {proc.poll()})")
        time.sleep(0.02)
    return path.read_text()


def dataplane_on_testbed(base: Path, cap_bps: int | None, seconds: float, rounds: int) -> tuple[dict[str, Any], list[str]]:
    """node1 (client) -> node2 (executor and raw server) on a two-host testbed."""
    tb = Testbed(base, 2, names=["node1", "node2"], bandwidth_bps=cap_bps)
    procs: list[subprocess.Popen[bytes]] = []
    run_dir = tb.base_dir / "run"
    try:
        tb.create()
        run_dir.mkdir()
        server, client = tb.host("node2"), tb.host("node1")
        env = {k: v for k, v in os.environ.items() if k != "ELASTANE_JOB_SECRET"} | {"PYTHONPATH": str(ROOT)}
        ex = subprocess.Popen([*server.exec_prefix(), PY, "-m", "psruntime.executor", "--executor-id", "srv",
                               "--host", server.ip, "--port", "0", "--num-blocks", str(dataplane.NUM_BLOCKS),
                               "--ready-file", str(run_dir / "ex.ready"), "--log-level", "WARNING"],
                              env=env, stdin=subprocess.DEVNULL)
        procs.append(ex)
        raw = subprocess.Popen([*server.exec_prefix(), PY, str(Path(__file__).resolve()), "--raw-server",
                                str(run_dir / "raw.port"), "--bind", server.ip,
                                "--raw-idle", str(dataplane.RAW_IDLE_S + 4 * seconds)],
                               env=env, stdin=subprocess.DEVNULL)
        procs.append(raw)
        address = json.loads(_wait_file(run_dir / "ex.ready", ex, "the executor on node2"))["address"]
        raw_port = int(_wait_file(run_dir / "raw.port", raw, "the raw server on node2"))
        if address.rsplit(":", 1)[0] != server.ip:
            raise RuntimeError(f"the executor serves on {address}, not on node2's address {server.ip}")
        args = json.dumps({"address": address, "raw_host": server.ip, "raw_port": raw_port,
                           "seconds": seconds, "rounds": rounds})
        r = tb.run("node1", [PY, str(Path(__file__).resolve()), "--client", args], env=env,
                   timeout=120 + 4 * seconds)
        if r.returncode != 0:
            raise RuntimeError(f"the client on node1 exited {r.returncode}: {r.stderr.strip()[-2000:]}")
        result: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
        result["client_ip"], result["server_ip"] = client.ip, server.ip
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        tb.remove()
    return result, testbed_leftovers(tb)


def part_dataplane(base: Path, seconds: float, rounds: int) -> tuple[dict[str, Any], list[str]]:
    out: dict[str, Any] = {}
    left: list[str] = []
    for label, cap in (("crosshost", None), ("capped", LINK_CAP_BPS)):
        log(f"dataplane: node1 -> node2, {'uncapped links' if cap is None else f'links capped at {cap / 1e9:g} Gbit/s'}")
        res, lft = dataplane_on_testbed(base / label, cap, seconds, rounds)
        left += lft
        for size in DP_SIZES:
            r = res[size]
            suffix = "" if size == "1mib" else f"_{size}"
            out |= {f"{label}_pushpull_gbps{suffix}": r["store"], f"{label}_raw_gbps{suffix}": r["raw"],
                    f"{label}_ratio{suffix}": r["ratio"]}
            out[f"_{label}_{size}"] = r
    out["link_cap_bps"] = LINK_CAP_BPS
    out["dataplane_rounds"] = rounds
    return out, left


# ----- 3. AM host loss ----------------------------------------------------------------------------

class WatchedApp:
    """One PS job on the testbed cluster, watched through the RM and its AM's /status."""

    def __init__(self, c: TestbedCluster, spec: dict[str, Any], name: str) -> None:
        self.rm = c.rm_url
        self.submitted = time.monotonic()
        new = http_json(f"{self.rm}/ws/v1/cluster/apps/new-application", "POST", user="bench")
        self.app_id: str = new["application-id"]
        sub = build_ps_submission(spec, name=name, am_memory=384, app_id=self.app_id, max_app_attempts=2)
        http_json(f"{self.rm}/ws/v1/cluster/apps", "POST", sub, user="bench")

    def app(self) -> dict[str, Any]:
        return http_json(f"{self.rm}/ws/v1/cluster/apps/{self.app_id}", timeout_s=5)["app"]

    def attempts(self) -> list[dict[str, Any]]:
        return http_json(f"{self.rm}/ws/v1/cluster/apps/{self.app_id}/appattempts",
                         timeout_s=5)["appAttempts"]["appAttempt"]

    def status(self) -> PsStatus | None:
        """The AM's /status (None while there is no AM to ask); the app ending is an error."""
        app = self.app()
        if app["state"] in FINAL:
            raise RuntimeError(f"{self.app_id} ended {app['state']}/{app.get('finalStatus')}: {app.get('diagnostics')}")
        if app["state"] != "RUNNING" or not app.get("trackingUrl"):
            return None
        try:
            return decode_status(http_json(app["trackingUrl"].rstrip("/") + "/status", timeout_s=2))
        except (urllib.error.URLError, OSError, RuntimeError, ValueError):   # ValueError: a bad answer too
            return None   # the AM's host is gone, or the new AM is not serving yet

    def epochs(self, attempt: int | None = None) -> int:
        st = self.status()
        if not st or (attempt is not None and not (st.attempt_id or "").endswith(f"_{attempt:06d}")):
            return 0
        return len(st.objective_history)

    def kill(self) -> None:
        try:
            http_json(f"{self.rm}/ws/v1/cluster/apps/{self.app_id}/state", "PUT", {"state": "KILLED"}, timeout_s=10,
                      user="bench")
            wait_for(lambda: self.app()["state"] in FINAL, 60, f"{self.app_id} to end", 0.25)
        except Exception as e:  # noqa: BLE001 - stop-cluster ends what is left
            log(f"am: could not kill {self.app_id}: {e}")


def am_post_mortem(c: TestbedCluster, app_id: str) -> str:
    return "\n".join(c.am_logs(app_id, lines=25))


def am_loss_once(base: Path, job_spec: dict[str, Any], kill_epoch: int, rep: int) -> tuple[dict[str, Any], list[str]]:
    c = TestbedCluster(base, workers=4)
    dead: str | None = None
    apps: list[WatchedApp] = []
    try:
        log(f"am: rep {rep}: starting a cluster of 4 node hosts")
        c.start(timeout_s=180)
        job = WatchedApp(c, job_spec, f"am-host-loss-{rep}")
        apps.append(job)
        wait_for(lambda: job.epochs() >= kill_epoch, 300, f"{job.app_id} to train {kill_epoch} epochs", 0.1)
        st = job.status() or PsStatus()
        at_kill = len(st.objective_history)
        dead = c.host_of(job.attempts()[0]["nodeId"])
        ckpts = list((c.shared_dir / "checkpoints" / job.app_id).glob("*"))
        t_kill, wall_kill = time.monotonic(), time.time()
        c.testbed.kill_host(dead)
        log(f"am: rep {rep}: killed {dead} (the AM's host) after {at_kill} epochs ({len(ckpts)} entries on shared "
            "storage); waiting for attempt 2")
        try:
            wait_for(lambda: len(job.attempts()) >= 2, 120, "a second attempt", 0.1)
            t_attempt2 = time.monotonic()
            st2: PsStatus = wait_for(lambda: (s := job.status()) and (s.attempt_id or "").endswith("_000002")
                                     and len(s.objective_history) > at_kill and s, 300,
                           f"attempt 2 to train past {at_kill} epochs", 0.1)
        except BaseException:
            log("am: the AM logs:\n" + am_post_mortem(c, job.app_id))
            raise
        t_done = time.monotonic()
        resumed = st2.resumed_from
        second_host = c.host_of(job.attempts()[1]["nodeId"])
        job.kill()
        log(f"am: rep {rep}: attempt 2 on {second_host} resumed from epoch {resumed and resumed.epoch} and trained past "
            f"{at_kill} epochs {t_done - t_kill:.2f}s after the kill; now the same job from scratch")
        fresh = WatchedApp(c, job_spec, f"from-scratch-{rep}")
        apps.append(fresh)
        wait_for(lambda: fresh.epochs() > 0, 300, "a fresh job's first epoch", 0.1)
        t_first = time.monotonic() - fresh.submitted
        wait_for(lambda: fresh.epochs() > at_kill, 300, f"a fresh job to train {at_kill + 1} epochs", 0.1)
        t_fresh = time.monotonic() - fresh.submitted
        fresh.kill()
        res = {"recovery_s": t_done - t_kill, "scratch_s": t_fresh, "attempt2_s": t_attempt2 - t_kill,
               "resumed_s": resumed.time - wall_kill if resumed and resumed.time else None,
               "resumed_from_epoch": resumed.epoch if resumed else None, "epochs_at_kill": at_kill,
               "am_host": dead, "attempt2_host": second_host, "scratch_first_epoch_s": t_first,
               "epoch_time_s": median([h.epoch_time_s for h in st2.objective_history])}
        log(f"am: rep {rep}: from scratch {t_fresh:.2f}s")
    finally:
        for a in apps:
            try:
                if a.app()["state"] not in FINAL:
                    a.kill()
            except Exception:  # noqa: BLE001 - the RM may be what failed; stop-cluster ends the rest
                pass
        if dead is not None:
            c.testbed.restore_link(dead)   # its sshd is dead: stop-cluster's ssh is refused at once
        c.stop()
    left = cluster_leftovers(c)
    if dead is not None and re.search(rf"failed on: {dead}\s*$", c.stop_output, re.M):
        # bin/stop-cluster names the dead host (nothing of it runs to stop) and no other: as it should.
        left = [x for x in left if not x.startswith("bin/stop-cluster exited")]
    return res, left


def part_am(base: Path, samples: int, kill_epoch: int, reps: int) -> tuple[dict[str, Any], list[str]]:
    job_spec = {**JOB, "data": {"num_samples": samples}}
    runs: list[dict[str, Any]] = []
    left: list[str] = []
    for rep in range(1, reps + 1):
        res, lft = am_loss_once(base / f"rep{rep}", job_spec, kill_epoch, rep)
        runs.append(res)
        left += lft
    resumed = [r["resumed_s"] for r in runs if r["resumed_s"] is not None]
    rec, scratch = median([r["recovery_s"] for r in runs]), median([r["scratch_s"] for r in runs])
    return {"am_host_loss_recovery_s": rec, "restart_from_scratch_s": scratch,
            "recovery_over_scratch": rec / scratch,
            "resumed_from_epoch": int(median([float(r["resumed_from_epoch"]) for r in runs])),
            "epochs_at_kill": int(median([float(r["epochs_at_kill"]) for r in runs])),
            "am_attempt2_s": median([r["attempt2_s"] for r in runs]),
            "am_resumed_s": median(resumed) if resumed else None, "am_reps": reps, "am_job_samples": samples,
            "am_epoch_time_s": median([r["epoch_time_s"] for r in runs]),
            "_am_runs": runs}, left


# ----- main ---------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions, short rounds (under ~3 min)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    p.add_argument("--start-reps", type=int, default=None)
    p.add_argument("--am-reps", type=int, default=None)
    p.add_argument("--kill-epoch", type=int, default=None, help="epochs trained when the AM's host dies")
    p.add_argument("--samples", type=int, default=None, help="the AM-loss job's training rows (mlr, tiny preset)")
    p.add_argument("--seconds", type=float, default=None, help="data plane: measuring time per size and side")
    p.add_argument("--rounds", type=int, default=None, help="data plane: alternating raw/store rounds per size")
    p.add_argument("--keep-dir", type=Path, default=None)
    p.add_argument("--client", help=argparse.SUPPRESS)
    p.add_argument("--raw-server", help=argparse.SUPPRESS)
    p.add_argument("--bind", help=argparse.SUPPRESS)
    p.add_argument("--raw-idle", type=float, default=dataplane.RAW_IDLE_S, help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    if ns.raw_server:
        dataplane.raw_server(ns.raw_server, ns.raw_idle, ns.bind)
        return 0
    if ns.client:
        from protocol.daemon import install_uvloop  # noqa: PLC0415
        install_uvloop()
        a = json.loads(ns.client)
        print(json.dumps(asyncio.run(client_measure(a["address"], a["raw_host"], a["raw_port"], a["seconds"],
                                                    a["rounds"]))))
        return 0
    unwind_on_sigterm()   # a SIGTERM unwinds through the finally blocks that remove the hosts
    reason = unavailable_reason(sshd=True)
    if reason:   # `make bench` runs every benchmark: say why, and go on
        print(f"no multi-host testbed here: {reason}")
        print(json.dumps({"skipped": f"no multi-host testbed here: {reason}"}))
        return 0
    parts = [x.strip() for x in ns.parts.split(",") if x.strip()]
    if bad := [x for x in parts if x not in PARTS]:
        p.error(f"unknown part(s) {bad}; known: {', '.join(PARTS)}")
    start_reps = ns.start_reps or (2 if ns.quick else 5)
    am_reps = ns.am_reps or (1 if ns.quick else 3)
    kill_epoch = ns.kill_epoch or (6 if ns.quick else 10)
    samples = ns.samples or 40_000
    seconds = ns.seconds or (2.0 if ns.quick else 6.0)
    rounds = ns.rounds or (3 if ns.quick else 5)
    tmp = None if ns.keep_dir else tempfile.TemporaryDirectory(prefix="multihost-")
    base = (ns.keep_dir or Path(tmp.name)).resolve()  # type: ignore[union-attr]
    out: dict[str, Any] = {}
    left: list[str] = []
    t0 = time.monotonic()
    try:
        if "start" in parts:
            res, lft = part_start(base / "start", start_reps)
            out |= res
            left += lft
        if "dataplane" in parts:
            res, lft = part_dataplane(base / "dataplane", seconds, rounds)
            out |= res
            left += lft
        if "am" in parts:
            res, lft = part_am(base / "am", samples, kill_epoch, am_reps)
            out |= res
            left += lft
    finally:
        if tmp is not None:
            tmp.cleanup()
    details = {k: out.pop(k) for k in list(out) if k.startswith("_")}
    if "start_cluster_s_n6" in out:
        print(f"cluster start, bin/start-cluster until all nodes RUNNING: 3 nodes {out['start_cluster_s_n3']:.2f}s, "
              f"6 nodes {out['start_cluster_s_n6']:.2f}s; one host at a time: 6 NMs {out['serial_start_s_n6']:.2f}s "
              f"(RM {out['start_rm_s']:.2f}s, one NM {out['start_one_nm_s']:.2f}s) -> speedup "
              f"{out['start_parallel_speedup_n6']:.2f}x (median of {start_reps})")
    if "crosshost_ratio" in out:
        for label, what in (("crosshost", "uncapped"), ("capped", f"capped at {LINK_CAP_BPS / 1e9:g} Gbit/s")):
            for size in DP_SIZES:
                r = details[f"_{label}_{size}"]
                print(f"node1 -> node2 {what:>20}, {size}: push+pull {r['store']:.3f} GB/s (serial {r['serial']:.3f}, "
                      f"pipelined {r['pipelined']:.3f}), raw socket {r['raw']:.3f} GB/s (echo {r['echo']:.3f}, stream "
                      f"{r['stream']:.3f}): ratio {r['ratio']:.2f} (rounds {', '.join(f'{x:.2f}' for x in r['ratios'])})")
    if "am_host_loss_recovery_s" in out:
        for r in details["_am_runs"]:
            print(f"AM host loss: {r['am_host']} killed after {r['epochs_at_kill']} epochs; attempt 2 on "
                  f"{r['attempt2_host']} listed after {r['attempt2_s']:.2f}s, resumed from epoch "
                  f"{r['resumed_from_epoch']} after {r['resumed_s']:.2f}s, past epoch {r['epochs_at_kill']} after "
                  f"{r['recovery_s']:.2f}s; a fresh job reached it in {r['scratch_s']:.2f}s (its first epoch after "
                  f"{r['scratch_first_epoch_s']:.2f}s; an epoch takes {r['epoch_time_s']:.3f}s)")
        print(f"AM host loss recovery {out['am_host_loss_recovery_s']:.2f}s vs restart from scratch "
              f"{out['restart_from_scratch_s']:.2f}s (median of {am_reps})")
    if left:
        print("LEFT BEHIND: " + "; ".join(left))
    out["left_behind"] = left
    out["wall_s"] = time.monotonic() - t0
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}))
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
