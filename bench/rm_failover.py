"""ResourceManager failover on the multi-host testbed: the active RM's host dies while a PS job trains.

    .venv/bin/python bench/rm_failover.py [--quick] [--reps N] [--soak-s S] [--nodes N] [--keep-dir D]

The cluster (elastane_cli.ha_testbed_cluster, started the way operators start one): etcd, one member,
on its own host `etcd`; two RM hosts `rm1` and `rm2` listed in cluster.toml's [ha] with the
documented default settings (lease_s 5, failover_max_attempts 15, failover_sleep_s 0.5,
rm.toml's nm_expiry_s and am_expiry_s 10); NM hosts
`node1..nodeN`. `bin/start-cluster` runs on rm1: rm1 there, rm2 over ssh, then the NMs over ssh;
the RMs elect the active one on etcd. Each repetition builds a fresh cluster and:

1. baseline: one PS job (mlr, 1 worker + 1 server, a fixed number of epochs, a checkpoint every
   epoch on shared storage) runs undisturbed, before the failover run and again after it (on the
   new active); `T0` = the mean of the two runs' submission -> the RM reports it FINISHED.
2. (first repetition only) soak: for `--soak-s` the machine is kept saturated by other work (one
   busy loop per core beside everything else on this machine) while a copy of the job trains;
   `spurious_failovers` = how many new terms (etcd epoch increments) began in that time with
   nobody killed. Its machine load is reported.
3. failover: the same job again; once it has trained `--kill-epoch` epochs the active RM's host
   dies (testbed.kill_host: link cut, every process SIGKILLed). `failover_s` = the kill -> the
   other RM answers `GET /ws/v1/cluster/apps` as the active one; `nm_resync_s` = the kill -> every
   NM RUNNING at the new active with a heartbeat after the kill; then the job runs on to its end:
   `job_lost_s` = its submission -> FINISHED time minus `T0` of the same repetition (what the
   failover cost the job; with a restarted attempt it includes redoing the epochs since the last
   checkpoint). `job_attempts` says whether the new active restarted the job's attempt.
4. `duplicate_container_ids`: over the whole run (every job, both terms), container ids that more
   than one NM launch names (every NM's log on every node host: `launched <id> pid ...`), plus
   launches an NM refused because the id had already started there (its message, in the NMs'
   logs or the containers' stderr).

Timings are the median of the repetitions, with min / max and every value. Every figure is
labelled `busy`: this runs on a small machine shared with other work, so absolute times are
those of a loaded machine (the soak adds its own load on purpose). Nothing is left behind:
bin/stop-cluster from the surviving RM host, then the testbed is removed; `left_behind` lists
anything found. The last line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from appmaster.ps.submission import build_ps_submission  # noqa: E402
from elastane_cli.machine_load import MachineMeter  # noqa: E402
from elastane_cli.ha_testbed_cluster import (  # noqa: E402
    RM_HOSTS, HaTestbedCluster, duplicate_container_ids, get, wait_for)
from elastane_cli.testbed_hosts import unavailable_reason  # noqa: E402
from protocol.ha_config import DEFAULT_LEASE_S  # noqa: E402
from support.http_json import http_json  # noqa: E402
from support.sigterm import unwind_on_sigterm  # noqa: E402

FINAL = ("FINISHED", "FAILED", "KILLED")
JOB: dict[str, Any] = {"app": "mlr", "workers": 1, "servers": 1, "convergence_threshold": 1e-12,
                       "checkpoint_every_epochs": 1, "hparams": {"learning_rate": 0.5}, "executor_memory_mb": 320}


def log(text: str) -> None:
    print(f"[rm_failover] {text}", file=sys.stderr, flush=True)


# ----- pure parts (tests/unit/test_rm_failover_bench.py; duplicate_container_ids is the cluster module's) --

def spread(xs: list[float]) -> dict[str, Any]:
    """Median, min, max and every value (rounded) of a timing's repetitions."""
    return {"median": round(float(statistics.median(xs)), 3), "min": round(min(xs), 3), "max": round(max(xs), 3),
            "values": [round(x, 3) for x in xs]}


def new_terms(epoch_before: int, epoch_after: int) -> int:
    """Terms that began between two readings of the etcd epoch counter (each election adds one)."""
    if epoch_after < epoch_before:
        raise ValueError(f"the epoch went back from {epoch_before} to {epoch_after}")
    return epoch_after - epoch_before


# ----- one job -----------------------------------------------------------------------------------

class Job:
    """One PS job, submitted to whichever RM is active and watched through it."""

    def __init__(self, c: HaTestbedCluster, spec: dict[str, Any], name: str) -> None:
        self.c = c
        rm = c.rm_url
        self.submitted = time.monotonic()
        self.app_id: str = http_json(f"{rm}/ws/v1/cluster/apps/new-application", "POST", user="bench")["application-id"]
        sub = build_ps_submission(spec, name=name, am_memory=384, app_id=self.app_id, max_app_attempts=2)
        http_json(f"{rm}/ws/v1/cluster/apps", "POST", sub, user="bench")

    def app(self) -> dict[str, Any]:
        active = self.c.active_id()
        body = get(f"{self.c.rm_address(active)}/ws/v1/cluster/apps/{self.app_id}") if active else None
        return (body or {}).get("app") or {}

    def attempts(self) -> int:
        active = self.c.active_id()
        body = get(f"{self.c.rm_address(active)}/ws/v1/cluster/apps/{self.app_id}/appattempts") if active else None
        return len((((body or {}).get("appAttempts") or {}).get("appAttempt")) or [])

    def epochs(self) -> int:
        app = self.app()
        if app.get("state") != "RUNNING" or not app.get("trackingUrl"):
            return 0
        st = get(str(app["trackingUrl"]).rstrip("/") + "/status")
        return len((st or {}).get("objective_history") or [])

    def wait_end(self, timeout_s: float) -> tuple[str, float]:
        """(final state, submission -> the RM reporting it) or ("TIMEOUT", nan)."""
        def ended() -> Optional[dict[str, Any]]:
            a = self.app()
            return a if a.get("state") in FINAL else None
        try:
            app = wait_for(ended, timeout_s, f"{self.app_id} to end", 0.2)
        except TimeoutError:
            return "TIMEOUT", float("nan")
        return f"{app['state']}/{app.get('finalStatus')}", time.monotonic() - self.submitted

    def kill(self) -> None:
        active = self.c.active_id()
        if active is None:
            return
        try:
            http_json(f"{self.c.rm_address(active)}/ws/v1/cluster/apps/{self.app_id}/state", "PUT", {"state": "KILLED"},
                      timeout_s=10, user="bench")
            wait_for(lambda: self.app().get("state") in FINAL, 60, f"{self.app_id} to end", 0.25)
        except Exception as e:  # noqa: BLE001 - stop-cluster ends what is left
            log(f"could not kill {self.app_id}: {e}")


def epoch_now(c: HaTestbedCluster) -> int:
    """The etcd epoch counter as the active RM reports it (its term's epoch)."""
    active = wait_for(c.active_id, 60, "an active RM", 0.1)
    return int(c.ha_info(active).get("haEpoch") or 0)


def soak(c: HaTestbedCluster, spec: dict[str, Any], seconds: float, burners: int) -> dict[str, Any]:
    """`seconds` with the machine saturated (busy loops) while a job trains; new terms counted."""
    job = Job(c, {**spec, "max_epochs": 1_000_000}, "soak")
    wait_for(lambda: job.epochs() > 0, 300, "the soak job's first epoch", 0.2)
    before = epoch_now(c)
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
             for _ in range(burners)]
    meter = MachineMeter().start()
    try:
        time.sleep(seconds)     # the soak's length is the measurement window, not a wait for readiness
    finally:
        load = meter.stop()
        for p in loops:
            p.kill()
            p.wait()
    after = epoch_now(c)
    job.kill()
    return {"spurious_failovers": new_terms(before, after), "soak_s": seconds, "soak_busy_loops": burners,
            "soak_machine": load.to_json()}


def one_rep(base: Path, rep: int, spec: dict[str, Any], kill_epoch: int, soak_s: float, burners: int,
            nodes: int) -> tuple[dict[str, Any], list[str]]:
    c = HaTestbedCluster(base, nodes=nodes)
    dead: Optional[str] = None
    res: dict[str, Any] = {}
    jobs: list[Job] = []
    try:
        log(f"rep {rep}: starting etcd, 2 RMs and {nodes} NMs")
        c.start()
        first_active = c.active_id()
        log(f"rep {rep}: {first_active} is active; the baseline job")
        base_job = Job(c, spec, f"baseline-{rep}")
        jobs.append(base_job)
        state0, t0_before = base_job.wait_end(900)
        log(f"rep {rep}: baseline {state0} in {t0_before:.1f}s")
        if soak_s > 0:
            log(f"rep {rep}: soak of {soak_s:.0f}s with {burners} busy loops")
            res |= soak(c, spec, soak_s, burners)
            log(f"rep {rep}: soak: {res['spurious_failovers']} new terms, machine {res['soak_machine']}")
        job = Job(c, spec, f"failover-{rep}")
        jobs.append(job)
        wait_for(lambda: job.epochs() >= kill_epoch, 600, f"{job.app_id} to train {kill_epoch} epochs", 0.1)
        dead = c.active_id()
        if dead is None:
            raise RuntimeError("no active RM to kill")
        survivor = next(i for i in RM_HOSTS if i != dead)
        t_kill, wall_kill_ms = time.monotonic(), time.time() * 1000
        c.testbed.kill_host(dead)
        log(f"rep {rep}: killed {dead} (the active RM's host) at epoch >= {kill_epoch}")
        url = c.rm_address(survivor)
        wait_for(lambda: c.ha_info(survivor).get("haState") == "ACTIVE"
                 and get(url + "/ws/v1/cluster/apps") is not None, 300, f"{survivor} to serve as active", 0.02)
        failover_s = time.monotonic() - t_kill
        want = {c.node_id(n) for n in c.node_names}

        def all_heard() -> bool:
            nodes_ = (((get(url + "/ws/v1/cluster/nodes") or {}).get("nodes")) or {}).get("node") or []
            fresh = {n.get("id") for n in nodes_ if n.get("state") == "RUNNING"
                     and (n.get("lastHeartbeat") or 0) > wall_kill_ms}
            return want <= fresh
        wait_for(all_heard, 300, "every NM at the new active", 0.02)
        nm_resync_s = time.monotonic() - t_kill
        log(f"rep {rep}: {survivor} active after {failover_s:.2f}s, every NM heard from after {nm_resync_s:.2f}s")
        state1, t1 = job.wait_end(600.0 if math.isnan(t0_before) else max(600.0, 5 * t0_before))
        attempts = job.attempts()
        # The undisturbed run again, now on the new active, so the baseline brackets the failover run
        # in time (a busy machine drifts; one run before it alone varied by a third between reps).
        after_job = Job(c, spec, f"baseline-after-{rep}")
        jobs.append(after_job)
        state2, t0_after = after_job.wait_end(900)
        t0 = (t0_before + t0_after) / 2
        ok = state0 == state1 == state2 == "FINISHED/SUCCEEDED"
        res |= {"first_active": first_active, "killed": dead, "failover_s": failover_s, "nm_resync_s": nm_resync_s,
                "failover_job_state": state1, "failover_job_s": t1, "job_attempts": attempts,
                "baseline_state": state0 if state0 != "FINISHED/SUCCEEDED" else state2, "baseline_s": t0,
                "baseline_before_s": t0_before, "baseline_after_s": t0_after,
                "job_lost_s": (t1 - t0) if ok else None,
                "new_epoch": int(c.ha_info(survivor).get("haEpoch") or 0)}
        log(f"rep {rep}: the job {state1} in {t1:.1f}s ({attempts} attempt(s)); undisturbed {t0_before:.1f}s "
            f"before, {t0_after:.1f}s after ({state2})")
        for j in jobs:
            if j.app().get("state") not in FINAL:
                j.kill()
        res["nm_logs"] = c.nm_logs() + c.am_stderr()
    finally:
        if dead is not None:
            c.testbed.restore_link(dead)    # its sshd is dead: stop-cluster's ssh is refused at once
        if "nm_logs" not in res and c.testbed.hosts:
            try:
                res["nm_logs"] = c.nm_logs() + c.am_stderr()
            except OSError:
                pass
        c.stop()
    return res, c.left_behind(dead)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="one repetition, a short job and a 20 s soak")
    p.add_argument("--reps", type=int, default=None, help="fresh clusters, each with a baseline and a failover (3)")
    p.add_argument("--soak-s", type=float, default=None, help="seconds of the saturated soak (600; quick 20; 0: none)")
    p.add_argument("--busy-loops", type=int, default=os.cpu_count() or 1, help="busy loops during the soak (one per core)")
    p.add_argument("--nodes", type=int, default=None, help="NM hosts (3; quick 2)")
    p.add_argument("--epochs", type=int, default=None, help="the job's epochs (40; quick 15)")
    p.add_argument("--kill-epoch", type=int, default=None, help="epochs trained when the active RM's host dies (8; quick 4)")
    p.add_argument("--samples", type=int, default=20_000, help="the job's training rows (mlr)")
    p.add_argument("--keep-dir", type=Path, default=None)
    ns = p.parse_args(argv)
    reps = ns.reps or (1 if ns.quick else 3)
    soak_s = ns.soak_s if ns.soak_s is not None else (20.0 if ns.quick else 600.0)
    nodes = ns.nodes or (2 if ns.quick else 3)
    epochs = ns.epochs or (15 if ns.quick else 40)
    kill_epoch = ns.kill_epoch or (4 if ns.quick else 8)
    if not (reps >= 1 and soak_s >= 0 and nodes >= 1 and 1 <= kill_epoch < epochs and ns.busy_loops >= 0):
        p.error("need --reps >= 1, --soak-s >= 0, --nodes >= 1, 1 <= --kill-epoch < --epochs, --busy-loops >= 0")
    unwind_on_sigterm()
    reason = unavailable_reason(sshd=True) or (None if shutil.which("etcd") else "no etcd binary")
    if reason:
        print(f"no multi-host testbed with etcd here: {reason}")
        print(json.dumps({"skipped": reason}))
        return 0
    spec = {**JOB, "max_epochs": epochs, "data": {"num_samples": ns.samples}}
    tmp = None if ns.keep_dir else tempfile.TemporaryDirectory(prefix="rm-failover-")
    base = (ns.keep_dir or Path(tmp.name)).resolve()  # type: ignore[union-attr]
    runs: list[dict[str, Any]] = []
    left: list[str] = []
    logs: list[str] = []
    try:
        for rep in range(1, reps + 1):
            res, lft = one_rep(base / f"rep{rep}", rep, spec, kill_epoch, soak_s if rep == 1 else 0.0,
                               ns.busy_loops, nodes)
            logs += res.pop("nm_logs", [])
            runs.append(res)
            left += lft
    finally:
        if tmp is not None:
            tmp.cleanup()
    dups, dup_ids, launched = duplicate_container_ids(logs)
    lost = [r["job_lost_s"] for r in runs if r.get("job_lost_s") is not None]
    out: dict[str, Any] = {
        "machine": "busy",
        "failover_s": spread([r["failover_s"] for r in runs])["median"],
        "nm_resync_s": spread([r["nm_resync_s"] for r in runs])["median"],
        "job_lost_s": spread(lost)["median"] if lost else None,
        "duplicate_container_ids": dups,
        "spurious_failovers": runs[0].get("spurious_failovers"),
        "soak_s": runs[0].get("soak_s", 0.0),
        "failover_s_spread": spread([r["failover_s"] for r in runs]),
        "nm_resync_s_spread": spread([r["nm_resync_s"] for r in runs]),
        "job_lost_s_spread": spread(lost) if lost else None,
        "baseline_job_s_spread": spread(base_s) if (base_s := [r["baseline_s"] for r in runs if not math.isnan(r["baseline_s"])]) else None,
        "baseline_runs_s": [round(r[k], 3) for r in runs for k in ("baseline_before_s", "baseline_after_s")],
        "jobs_not_finished": [f"rep{i + 1}: {r['failover_job_state']}" for i, r in enumerate(runs)
                              if r["failover_job_state"] != "FINISHED/SUCCEEDED"],
        "job_attempts_after_failover": [r["job_attempts"] for r in runs],
        "duplicate_ids": dup_ids[:20], "containers_launched": launched,
        "soak_machine": runs[0].get("soak_machine"), "soak_busy_loops": runs[0].get("soak_busy_loops"),
        "lease_s": DEFAULT_LEASE_S, "reps": reps, "nodes": nodes, "job_epochs": epochs, "kill_epoch": kill_epoch,
        "left_behind": left,
    }
    for i, r in enumerate(runs, 1):
        print(f"rep {i} (busy machine): {r['killed']} (active) killed; {r['failover_s']:.2f}s to the new active serving, "
              f"{r['nm_resync_s']:.2f}s to every NM heard from; job {r['failover_job_state']} in "
              f"{r['failover_job_s']:.1f}s ({r['job_attempts']} attempt(s)) against {r['baseline_s']:.1f}s undisturbed "
              f"({r['baseline_before_s']:.1f}s before, {r['baseline_after_s']:.1f}s after)")
    if out["soak_s"]:
        print(f"soak (busy machine, {out['soak_busy_loops']} extra busy loops): {out['spurious_failovers']} spurious "
              f"failover(s) over {out['soak_s']:.0f}s with the default {DEFAULT_LEASE_S:g}s lease; machine "
              f"{out['soak_machine']}")
    else:
        print("no soak (--soak-s 0): spurious_failovers not measured")
    print(f"duplicate container ids over the run: {dups} (of {launched} container ids launched)")
    print(json.dumps(out))
    return 0 if not left else 1


if __name__ == "__main__":
    sys.exit(main())
