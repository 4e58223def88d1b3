"""Capacity preemption on the multi-host testbed: queue B gets its guarantee back by elastic shrink,
by YARN's kill, or not at all (issue 34 part 6; docs/preemption.md).

    .venv/bin/python bench/queue_reclaim.py [--hosts 3] [--host-cpus 0.3] [--repeats 3]
                                            [--modes none,kill,shrink] [--timeout-s 1200] [--quick]
                                            [--keep-dir DIR]
    .venv/bin/python bench/queue_reclaim.py --sim [--seeds 0-4] [--hosts 3]

Per run, a fresh testbed (docs/testbed.md): `--hosts` node hosts of `--host-cpus` cores and 2
vcores each (1-vcore executors), the AMs on the master (am_host). Queues a (50 %, max 100 %) and
b (50 %, max 100 %). Queue A's elastic MLR job (`--samples` rows, `--epochs`; its submitted shape fills every node's vcores,
minimum 1 worker + 1 server, a checkpoint every 5 epochs) trains; then B's job (half the cluster) is
submitted. The runs differ only in rm.toml's `preemption`: `none` ("off": B waits for A to end),
`kill` (YARN's way: A's containers over its share are killed after the grace period; A's AM
replaces what it lost, or goes back to its latest checkpoint), `shrink` (A's job is shrunk toward
its minimum by a directive, live). Same jobs, same arrivals; modes interleaved over `--repeats`.

Measured per run (the client polls the RM every `POLL_S`):
- `reclaim_s`: B's submission until the RM's record of B's job says it holds its AM and its
  submitted executors (its guarantee; to within the poll interval);
- `lost_training_s`: A's training time lost from B's submission on, from A's AM's own records
  (shape history: each change's `lost_s`, the time training waited for it -- an EPS remove, a
  lost-worker replacement, a restart from the checkpoint -- plus, for a restart, the epochs it
  redid x A's median epoch time);
- each job's JCT (the RM's startedTime to finishedTime).
A run where a job did not SUCCEED within `--timeout-s` is counted failed and enters no median.

Last line, JSON: {"reclaim_s_shrink", "reclaim_s_kill", "lost_training_s_shrink",
"lost_training_s_kill" (medians over the runs that succeeded, each with _min / _max),
"queue_b_jct_gain_vs_none" (B's median JCT under none over under shrink),
"queue_a_jct_shrink_over_kill" (A's median JCT under shrink over under kill), "failed" (per mode),
"repeats", "hosts", "host_cpus", "runs": [...]}. Targets (issue 34): reclaim_s_shrink <= 10;
lost_training_s_shrink <= 0.05 x lost_training_s_kill; queue_b_jct_gain_vs_none >= 1.5;
queue_a_jct_shrink_over_kill <= 1.0. `--quick`: one repeat, 20 epochs -- to check the bench
runs, not a figure. Without the testbed it says why, prints {"error": ...} and exits 2.

`--sim [--seeds 0-4]`: the same question in the simulator (sim/queue_reclaim_scenario.py: the real
RM core's reclaim, `--hosts` nodes of 2 vcores, AMs on their own node, one job in queue A as on
the testbed), every mode per seed; the
same keys from its runs -- `reclaim_s_*` is B's wait from arrival to training, and
`lost_training_s_*` is null: the simulated AM charges a kill no restart, so it has none to report.
There `queue_b_jct_gain_vs_none` and `queue_a_jct_shrink_over_kill` are the medians of per-seed
ratios over the seeds that succeeded in both modes (each with `_min` / `_max` and `_seeds`, the
number of such seeds), not ratios of medians over different seeds.

Measured 2026-11-28, defaults, on a busy 2-core machine (other sessions' tests running): medians
over 3 repeats -- reclaim_s_shrink 3.45, reclaim_s_kill 27.9, lost_training_s_shrink 0.043,
lost_training_s_kill 9.12, queue_b_jct_gain_vs_none 5.52, queue_a_jct_shrink_over_kill 0.94; one of
the three kill runs failed (A's AM gave up after 11 of its executors were killed) and is counted
apart (docs/preemption.md).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from appmaster.ps.submission import build_ps_submission  # noqa: E402
from elastane_cli import testbed_hosts  # noqa: E402
from elastane_cli.testbed_cluster import TestbedCluster  # noqa: E402
from protocol.ps_status import PsStatus  # noqa: E402
from protocol.shape_history import KillRestartChange, RecoveryChange, ReplaceWorkerChange, SuspendChange  # noqa: E402
from support.sigterm import unwind_on_sigterm  # noqa: E402  (bench/support: not a benchmark itself)

POLL_S = 0.25
MODES = {"none": "off", "kill": "kill", "shrink": "shrink"}
QUEUES = [{"name": "a", "capacity": 50.0, "max_capacity": 100.0},
          {"name": "b", "capacity": 50.0, "max_capacity": 100.0}]
EXECUTOR_MB = 320
FINAL = ("FINISHED", "FAILED", "KILLED")


def log(text: str) -> None:
    print(f"[queue_reclaim] {text}", file=sys.stderr, flush=True)


def rest(url: str, method: str = "GET", body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + ("&" if "?" in url else "?") + "user.name=alice", data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        raw = r.read()
    return json.loads(raw) if raw else None


def submit(c: TestbedCluster, spec: dict[str, Any], name: str, queue: str) -> str:
    app_id = rest(c.rm_url + "/ws/v1/cluster/apps/new-application", "POST")["application-id"]
    sub = build_ps_submission(spec, name=name, queue=queue, am_memory=384)
    rest(c.rm_url + "/ws/v1/cluster/apps", "POST", dict(sub, **{"application-id": app_id}))
    return str(app_id)


def app(c: TestbedCluster, app_id: str) -> dict[str, Any]:
    return rest(c.rm_url + f"/ws/v1/cluster/apps/{app_id}")["app"]  # type: ignore[no-any-return]


def trains_with(report: dict[str, Any], workers: int, servers: int) -> bool:
    """The RM's record of the job: it runs and holds its AM and this many executors."""
    return bool(report["state"] == "RUNNING" and report["runningContainers"] == 1 + workers + servers)


def lost_training_s(status: PsStatus, since: float) -> float:
    """A's training time lost from `since` on, from its AM's shape history (module doc)."""
    times = [h.epoch_time_s for h in status.objective_history if h.epoch_time_s]
    epoch_s = statistics.median(times) if times else 0.0
    lost = 0.0
    for rec in status.shape_history:
        if rec.time < since or isinstance(rec, SuspendChange):     # a pause loses no training time of its own
            continue
        lost += rec.lost_s or (rec.training_time_lost_s if isinstance(rec, KillRestartChange) else 0.0)
        if isinstance(rec, (RecoveryChange, ReplaceWorkerChange)):
            lost += rec.epochs_redone * epoch_s
    return lost


def durable_status(c: TestbedCluster, app_id: str) -> PsStatus:
    return c.final_status(app_id)


def run_once(base: Path, mode: str, ns: argparse.Namespace, repeat: int) -> dict[str, Any]:
    vcores = 2 * ns.hosts
    servers = max(1, vcores // 4)
    a_spec = {"app": "mlr", "workers": vcores - servers, "servers": servers, "min_workers": 1, "min_servers": 1,
              "max_epochs": ns.epochs, "convergence_threshold": 1e-12, "checkpoint_every_epochs": 5,
              "executor_memory_mb": EXECUTOR_MB, "hparams": {"learning_rate": 0.5},
              "data": {"num_samples": ns.samples}}
    b_shape = (vcores // 2 - 1, 1)
    b_spec = {"app": "mlr", "workers": b_shape[0], "servers": b_shape[1], "max_epochs": max(2, ns.epochs // 10),
              "convergence_threshold": 1e-12, "executor_memory_mb": EXECUTOR_MB, "data": {"num_samples": ns.samples}}
    c = TestbedCluster(base, workers=ns.hosts, worker_cpus=ns.host_cpus, node_memory_mb=2 * EXECUTOR_MB + 64,
                       node_vcores=2, am_host=True, queues=QUEUES, nm_expiry_s=30.0, am_expiry_s=60.0,
                       rm_conf={"preemption": MODES[mode], "preemption_natural_termination_factor": 1.0,
                                "preemption_max_wait_before_kill_s": ns.grace_s})
    out: dict[str, Any] = {"mode": mode, "repeat": repeat, "ok": False}
    c.start()
    try:
        deadline = time.monotonic() + ns.timeout_s
        a = submit(c, a_spec, f"a-{mode}", "a")
        while not trains_with(app(c, a), a_spec["workers"], a_spec["servers"]):
            if time.monotonic() > deadline or app(c, a)["state"] in FINAL:
                out["error"] = f"A did not train: {app(c, a).get('diagnostics')}"
                return out
            time.sleep(POLL_S)      # a poll interval, not a readiness stand-in: the loop checks the state
        t_b = time.time()
        b = submit(c, b_spec, f"b-{mode}", "b")
        reclaim: Optional[float] = None
        while True:
            rb, ra = app(c, b), app(c, a)
            if reclaim is None and trains_with(rb, *b_shape):
                reclaim = time.time() - t_b
            if rb["state"] in FINAL and ra["state"] in FINAL:
                break
            if time.monotonic() > deadline:
                for x in (a, b):
                    rest(c.rm_url + f"/ws/v1/cluster/apps/{x}/state", "PUT", {"state": "KILLED"})
                out["error"] = "timeout"
                return out
            time.sleep(POLL_S)
        out.update({"a": a, "b": b, "reclaim_s": reclaim, "a_final": ra["finalStatus"], "b_final": rb["finalStatus"],
                    "a_jct_s": (ra["finishedTime"] - ra["startedTime"]) / 1000,
                    "b_jct_s": (rb["finishedTime"] - rb["startedTime"]) / 1000,
                    "a_preempted": ra["numNonAMContainerPreempted"], "a_diagnostics": ra["diagnostics"][-400:],
                    "lost_training_s": lost_training_s(durable_status(c, a), t_b)})
        out["ok"] = ra["finalStatus"] == rb["finalStatus"] == "SUCCEEDED" and reclaim is not None
        return out
    finally:
        c.stop()


def median_spread(values: list[float], key: str) -> dict[str, Optional[float]]:
    if not values:
        return {key: None, f"{key}_min": None, f"{key}_max": None}
    return {key: round(statistics.median(values), 4), f"{key}_min": round(min(values), 4),
            f"{key}_max": round(max(values), 4)}


def summarize(runs: list[dict[str, Any]], ns: argparse.Namespace) -> dict[str, Any]:
    ok = {m: [r for r in runs if r["mode"] == m and r["ok"]] for m in MODES}
    out: dict[str, Any] = {}
    for m in ("shrink", "kill"):
        out.update(median_spread([r["reclaim_s"] for r in ok[m]], f"reclaim_s_{m}"))
        out.update(median_spread([r["lost_training_s"] for r in ok[m]], f"lost_training_s_{m}"))

    def med(mode: str, key: str) -> Optional[float]:
        vals = [r[key] for r in ok[mode]]
        return statistics.median(vals) if vals else None
    b_none, b_shrink = med("none", "b_jct_s"), med("shrink", "b_jct_s")
    a_shrink, a_kill = med("shrink", "a_jct_s"), med("kill", "a_jct_s")
    out["queue_b_jct_gain_vs_none"] = round(b_none / b_shrink, 4) if b_none and b_shrink else None
    out["queue_a_jct_shrink_over_kill"] = round(a_shrink / a_kill, 4) if a_shrink and a_kill else None
    out["failed"] = {m: sum(1 for r in runs if r["mode"] == m and not r["ok"]) for m in MODES}
    out.update({"repeats": ns.repeats, "hosts": ns.hosts, "host_cpus": ns.host_cpus, "epochs": ns.epochs,
                "runs": runs})
    return out


def per_seed_ratios(ok: dict[str, list[Any]], num: str, den: str, f: Any, key: str) -> dict[str, Any]:
    """`key`: the median over the seeds that succeeded in both modes of the per-seed ratio
    f(run under `num`) / f(run under `den`), with `_min`, `_max` and `_seeds` (how many seeds)."""
    # A ratio of medians over different seed sets would compare different traces.
    by_seed = {r.seed: r for r in ok.get(den, [])}
    vals = [f(r) / f(by_seed[r.seed]) for r in ok.get(num, []) if r.seed in by_seed and f(by_seed[r.seed]) > 0]
    return {**median_spread(vals, key), f"{key}_seeds": len(vals)}


def sim_summary(runs: list[Any], modes: list[str]) -> dict[str, Any]:
    """`--sim`'s keys from the scenario's runs (sim/queue_reclaim_scenario.py ReclaimRun): a run
    succeeded when B and every A job finished; the others are counted in `failed`."""
    by = {m: [r for r in runs if r.mode == MODES[m]] for m in modes}
    ok = {m: [r for r in rs if r.b_jct_s is not None and all(j is not None for j in r.a_jct_s)] for m, rs in by.items()}
    out: dict[str, Any] = {}
    for m in ("shrink", "kill"):
        out.update(median_spread([r.b_wait_s for r in ok.get(m, []) if r.b_wait_s is not None], f"reclaim_s_{m}"))
        out[f"lost_training_s_{m}"] = None
    out.update(per_seed_ratios(ok, "none", "shrink", lambda r: r.b_jct_s, "queue_b_jct_gain_vs_none"))
    out.update(per_seed_ratios(ok, "shrink", "kill", lambda r: statistics.fmean(r.a_jct_s),
                               "queue_a_jct_shrink_over_kill"))
    out["failed"] = {m: len(by[m]) - len(ok[m]) for m in modes}
    return out


def run_sim(ns: argparse.Namespace, modes: list[str]) -> dict[str, Any]:
    """`--sim`: every mode on every seed in the simulator, the bench's keys from the runs."""
    from sim import calibration
    from sim.queue_reclaim_scenario import run

    cal = calibration.load()
    runs = [run(seed, MODES[m], cal, nodes=ns.hosts, node_vcores=2, grace_s=ns.grace_s, a_jobs=1)
            for seed in ns.seeds for m in modes]
    out = sim_summary(runs, modes)
    out.update({"sim": True, "seeds": list(ns.seeds), "hosts": ns.hosts,
                "runs": [dict(r.__dict__, a_jct_s=list(r.a_jct_s)) for r in runs]})
    return out


def parse_seeds(text: str) -> list[int]:
    """"0-4" or "1,3,5": the seeds."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        out += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    return out


def main(argv: Optional[list[str]] = None) -> int:
    unwind_on_sigterm()     # a SIGTERM stops the testbed this bench started
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, default=3)
    p.add_argument("--host-cpus", type=float, default=0.3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=40, help="A's max_epochs (B runs a tenth as many)")
    p.add_argument("--samples", type=int, default=40_000, help="both jobs' MLR training rows (tiny preset's: 4000)")
    p.add_argument("--grace-s", type=float, default=10.0, help="rm.toml preemption_max_wait_before_kill_s")
    p.add_argument("--modes", default="none,kill,shrink")
    p.add_argument("--timeout-s", type=float, default=1200.0)
    p.add_argument("--quick", action="store_true", help="one repeat, 20 epochs: checks the bench runs")
    p.add_argument("--keep-dir", type=Path, default=None)
    p.add_argument("--sim", action="store_true", help="the simulator's runs instead of the testbed's")
    p.add_argument("--seeds", default="0-4", help="--sim: the seeds (at least five for a figure)")
    ns = p.parse_args(argv)
    modes = [m.strip() for m in ns.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        p.error(f"--modes: unknown {bad}; known: {', '.join(MODES)}")
    if ns.hosts < 2 or not (0 < ns.host_cpus) or ns.repeats < 1 or ns.grace_s < 0:
        p.error("need --hosts >= 2, --host-cpus > 0, --repeats >= 1, --grace-s >= 0")
    if ns.quick:
        ns.repeats, ns.epochs = 1, 20
    if ns.sim:
        try:
            ns.seeds = parse_seeds(ns.seeds)
        except ValueError:
            p.error(f"--seeds: want e.g. 0-4 or 1,3,5, got {ns.seeds!r}")
        print(json.dumps(run_sim(ns, modes)))
        return 0
    reason = testbed_hosts.unavailable_reason(sshd=True)
    if reason is not None:
        log(f"no multi-host testbed here: {reason}")
        print(json.dumps({"error": f"no multi-host testbed here: {reason}"}))
        return 2
    runs: list[dict[str, Any]] = []
    tmp = None if ns.keep_dir else tempfile.TemporaryDirectory(prefix="queue-reclaim-")
    base = ns.keep_dir or Path(tmp.name)  # type: ignore[union-attr]
    try:
        for rep in range(ns.repeats):
            for mode in modes:          # interleaved: each repeat runs every mode once
                log(f"repeat {rep + 1}/{ns.repeats}: {mode}")
                r = run_once(base / f"r{rep}-{mode}", mode, ns, rep)
                log(f"  {mode}: ok={r['ok']} reclaim_s={r.get('reclaim_s')} lost={r.get('lost_training_s')} "
                    f"A {r.get('a_jct_s')} s, B {r.get('b_jct_s')} s {r.get('error', '')}")
                runs.append(r)
    finally:
        if tmp is not None:
            tmp.cleanup()
    print(json.dumps(summarize(runs, ns)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
