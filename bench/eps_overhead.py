"""EPS's overhead experiment (EPS §7, Table 2 / Fig. 20): remove one worker and one server from a
running MLR job and add them back, with EPS and with the kill-based baseline, in the same run.

    python bench/eps_overhead.py [--features 210000 --classes 128 --samples 6000] [--keep-dir D]

One local cluster (an RM and 3 NMs as processes, sized for a 2-core / 24 GB machine). For each
mode (eps, then kill) it submits the same MLR job -- 3 workers, 3 servers, a model of >= 100 MB --
waits until it trains, then asks the AM (POST /scale, what `elastane ps scale` calls) for
-1 worker -1 server, lets one more epoch run, asks for +1 +1, lets an epoch run on the restored
shape; that round runs `--rounds` times (7), and each change reports its median round. Then it
kills the app. Measured per change, from the request to the new shape training:

- EPS: from the first function's call to the last one's end (the AM's own records): the two
  removals run concurrently, and so do the two additions; the plain sum of the four durations,
  which counts the overlapped parts twice, is reported as `eps_*_ops_sum_s` and
  `ratio_of_ops_sum`;
- kill: the restart's duration from the request (waiting for the epoch boundary, checkpoint of
  every server block, stopping and releasing every container, asking for and launching the new
  ones, regenerating the input data, restoring the model) to training resuming;
- the training time each change lost (EPS: the time training waited for it; kill: all of the
  restart, as nothing trains meanwhile).

An EPS add's span is its slower part's: add_servers = allocate + start (the new executor
announcing itself) + register (bind and address broadcast) + move_blocks; add_workers = the same
first three + stage_splits + boundary (its commit at the next clock boundary). That boundary wait
was the rest of the running ~0.25 s clock -- uniform over it, so its median over rounds was
about 0.13 s and the add's median swung between ~0.1 and ~0.2 s from run to run; the commit now
ends the running clock early (EndClock), so it waits about one mini-batch. `eps_steps_s` gives
each part's phases of the median round. Seven rounds, not three: at 3 the add's rounds were 0.121,
0.090 and 0.123 s in one run (median 0.121), and 0.075-0.111 s (median 0.090) over 7 in the next,
on the quiet machine (2026-11-29): with three, one slow round in two sets the median.

Last line, JSON: {"eps_remove_s", "kill_remove_s", "eps_add_s", "kill_add_s", "ratio", ...}, ratio =
EPS total / kill total (the EPS paper's Fig. 20 shows about 0.24); also the training time lost per
change and its ratio (`lost_ratio`), the kill restart's steps, and `kill_restart_s` (the restart
alone, from the pause at the epoch boundary to training resuming).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from elastane_cli.local_cluster import LocalCluster  # noqa: E402
from protocol.ps_status import PsStatus  # noqa: E402
from support.watched_job import Job, am_log_tail, mlr_job_spec  # noqa: E402
from support.sigterm import unwind_on_sigterm  # noqa: E402  (bench/support: not a benchmark itself)



def log(text: str) -> None:
    print(f"[eps_overhead] {text}", file=sys.stderr, flush=True)


def change_seconds(changes: list[dict[str, Any]], mode: str) -> tuple[float, float]:
    """(duration from the request to the new shape training, training time lost) of one /scale."""
    if mode == "kill":
        (c,) = changes
        if not c.get("changed"):
            raise RuntimeError(f"the kill-based change did nothing: {c}")
        return sum(c["steps"].values()), c["lost_s"]
    bad = [c for c in changes if not c.get("ok")]
    if bad:
        raise RuntimeError(f"EPS change failed: {bad}")
    return eps_span_s(changes), sum(c["training_time_lost_s"] for c in changes)


def eps_span_s(changes: list[dict[str, Any]]) -> float:
    """From the first op's start to the last op's end: the two roles' removals run concurrently,
    and so do their additions, so summing their durations would count the overlapped clock
    boundaries and container launches twice (the sum is reported too, as `eps_*_ops_sum_s`)."""
    return max(c["started"] + c["duration_s"] for c in changes) - min(c["started"] for c in changes)


def run_mode(cluster: LocalCluster, mode: str, spec: dict[str, Any], rounds: int) -> dict[str, Any]:
    job = Job(cluster, {**spec, "elastic_mode": mode}, f"overhead-{mode}")
    log(f"{mode}: submitted {job.app_id}; waiting for the first epoch")
    job.wait_epochs(1)
    st = job.status() or PsStatus()
    log(f"{mode}: training, model {st.model_mb} MB over {spec['servers']} servers, "
        f"epoch time {st.objective_history[-1].epoch_time_s:.2f}s")
    out: dict[str, Any] = {"app_id": job.app_id, "model_mb": st.model_mb}
    samples: dict[str, list[tuple[float, float, float, list[dict[str, Any]]]]] = {"remove": [], "add": []}
    for rnd in range(rounds):
        for label, delta in (("remove", -1), ("add", +1)):
            try:
                changes, wall = job.scale(delta, delta)
            except (OSError, RuntimeError):
                log(f"{mode}: the {label} call failed; the AM's log ends with:\n" + am_log_tail(cluster, job.app_id))
                raise
            seconds, lost = change_seconds(changes, mode)
            ops_sum = sum(c.get("duration_s", 0.0) for c in changes)
            samples[label].append((seconds, lost, ops_sum, changes))
            done = job.epochs()
            log(f"{mode}: round {rnd + 1}: {label} 1 worker + 1 server: {seconds:.2f}s (training lost {lost:.2f}s, "
                f"HTTP call {wall:.2f}s)")
            job.wait_epochs(done + 1)
    for label, got in samples.items():
        # The median round by duration stands for the change (one slow launch on a busy machine
        # is not what the change costs); every round's duration is reported too.
        seconds, lost, ops_sum, changes = sorted(got, key=lambda g: g[0])[len(got) // 2]
        out[f"{label}_s"], out[f"{label}_lost_s"], out[f"{label}_ops_sum_s"] = seconds, lost, ops_sum
        out[f"{label}_detail"] = changes
        out[f"{label}_rounds_s"] = [round(g[0], 3) for g in got]
    st = job.status() or PsStatus()
    objectives = [h.objective for h in st.objective_history]
    out["objectives"] = objectives
    out["epoch_times_s"] = [round(h.epoch_time_s, 3) for h in st.objective_history]
    # No progress lost: the objective never went back up to where it was before the changes (a
    # non-finite one, null in the status, is no progress either).
    out["objective_monotone"] = all(a is not None and b is not None and b <= a * 1.02
                                    for a, b in zip(objectives, objectives[1:]))
    job.kill()
    return out


def main(argv: list[str] | None = None) -> int:
    unwind_on_sigterm()   # a SIGTERM stops the cluster this bench started
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--features", type=int, default=210_000)
    p.add_argument("--classes", type=int, default=128)
    p.add_argument("--samples", type=int, default=6000)
    p.add_argument("--executor-mb", type=int, default=1024)
    p.add_argument("--keep-dir", type=Path, default=None)
    p.add_argument("--rounds", type=int, default=7, help="remove/add rounds per mode (the median is reported)")
    ns = p.parse_args(argv)
    model_mb = ns.features * ns.classes * 4 / 2**20
    spec = mlr_job_spec(ns.features, ns.classes, ns.samples, ns.executor_mb)
    tmp = None if ns.keep_dir else tempfile.TemporaryDirectory(prefix="eps-overhead-")
    base = ns.keep_dir or Path(tmp.name)  # type: ignore[union-attr]
    # 3 nodes x (3 GB, 4 vcores): room for the AM and 3 + 3 executors of 1 GB, one job at a time.
    cluster = LocalCluster(base, nodes=3, node_memory_mb=3 * ns.executor_mb + 512, node_vcores=4,
                           heartbeat_interval_ms=250, nm_expiry_s=30, am_expiry_s=30)
    results: dict[str, Any] = {}
    try:
        log(f"starting the cluster under {base}; model {model_mb:.1f} MiB")
        cluster.start(timeout_s=60)
        for mode in ("eps", "kill"):
            results[mode] = run_mode(cluster, mode, spec, ns.rounds)
    finally:
        cluster.stop()
        if tmp is not None:
            tmp.cleanup()
    eps, kill = results["eps"], results["kill"]
    ratio = (eps["remove_s"] + eps["add_s"]) / (kill["remove_s"] + kill["add_s"])
    for mode in ("eps", "kill"):
        r = results[mode]
        log(f"{mode:4s}: remove {r['remove_s']:.2f}s (lost {r['remove_lost_s']:.2f}s), add {r['add_s']:.2f}s "
            f"(lost {r['add_lost_s']:.2f}s); epoch times {r['epoch_times_s']}")
    kill_steps = {label: kill[f"{label}_detail"][0]["steps"] for label in ("remove", "add")}
    summary = {
        "eps_remove_s": round(eps["remove_s"], 3), "kill_remove_s": round(kill["remove_s"], 3),
        "eps_add_s": round(eps["add_s"], 3), "kill_add_s": round(kill["add_s"], 3), "ratio": round(ratio, 3),
        "eps_remove_lost_s": round(eps["remove_lost_s"], 3), "kill_remove_lost_s": round(kill["remove_lost_s"], 3),
        "eps_add_lost_s": round(eps["add_lost_s"], 3), "kill_add_lost_s": round(kill["add_lost_s"], 3),
        "lost_ratio": round((eps["remove_lost_s"] + eps["add_lost_s"])
                            / max(1e-9, kill["remove_lost_s"] + kill["add_lost_s"]), 4),
        "kill_restart_s": {label: kill[f"{label}_detail"][0]["seconds"] for label in ("remove", "add")},
        "kill_steps_s": {k: {s: round(v, 3) for s, v in d.items()} for k, d in kill_steps.items()},
        "eps_remove_ops_sum_s": round(eps["remove_ops_sum_s"], 3), "eps_add_ops_sum_s": round(eps["add_ops_sum_s"], 3),
        "ratio_of_ops_sum": round((eps["remove_ops_sum_s"] + eps["add_ops_sum_s"]) / (kill["remove_s"] + kill["add_s"]), 3),
        "rounds_s": {m: {label: results[m][f"{label}_rounds_s"] for label in ("remove", "add")} for m in results},
        # Where each EPS change's time went (the median round's), by op and step: see
        # appmaster/ps/eps_records.py ElasticOpRecord.phases.
        "eps_steps_s": {label: {c["op"]: c.get("phases", {}) for c in eps[f"{label}_detail"]}
                        for label in ("remove", "add")},
        "eps_blocks_moved": sum(c["blocks_moved"] for label in ("remove", "add") for c in eps[f"{label}_detail"]),
        "model_mib": round(model_mb, 1), "workers": 3, "servers": 3,
        "objective_monotone": {"eps": eps["objective_monotone"], "kill": kill["objective_monotone"]},
        "paper_ratio": 0.24,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
