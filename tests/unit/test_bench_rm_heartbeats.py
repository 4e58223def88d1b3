"""bench/rm_heartbeats.py's arithmetic: a step with no completed heartbeat has no latency (valid
JSON, a failed step), runs without replies leave the medians, and `meets_target` is inconclusive
when the ceiling was not server-bound or the generator ran out."""
from __future__ import annotations

import json
from typing import Any

from bench_module import load_bench

hb = load_bench("rm_heartbeats")


def part(latencies: list[float], errors: int = 0, cpu_s: float = 1.0) -> dict[str, Any]:
    return {"latencies_ms": latencies, "elapsed_s": 4.0, "cpu_s": cpu_s, "errors": errors, "skipped": 0}


def test_a_step_where_nothing_completed_has_no_latency_and_fails() -> None:
    step = hb.merge_step(1000, [part([]), part([])], [1, 1], None)
    assert step["completed"] == 0 and step["achieved"] == 0.0
    assert step["p50_ms"] is None and step["p99_ms"] is None and step["server_cpu"] is None
    assert not hb._passed(step) and hb._ran_out(step) == "unclear" and hb._per_cpu_s([step]) is None
    json.dumps(step, allow_nan=False)                       # inf or NaN would raise here
    best = hb._best([step])
    assert best == {"achieved": 0.0, "p50_ms": None, "p99_ms": None}
    json.dumps(best, allow_nan=False)


def test_a_step_with_replies_keeps_its_figures() -> None:
    step = hb.merge_step(2, [part([1.0, 2.0, 3.0, 4.0]), part([5.0, 6.0, 7.0, 8.0])], [1, 1], 0.5)
    assert step["completed"] == 8 and step["achieved"] == 2.0 and step["p99_ms"] == 8.0
    assert step["server_cpu"] == 0.5 and hb._passed(step)


def test_runs_without_replies_leave_the_policy_medians() -> None:
    runs = [{"p99_ms": 10.0}, {"p99_ms": None}, {"p99_ms": 30.0}]
    assert hb.median_of_runs(runs, "p99_ms") == 20.0
    assert hb.median_of_runs([{"p99_ms": None}], "p99_ms") is None


def test_meets_target_is_inconclusive_unless_the_ceiling_is_server_bound_and_the_generator_kept_up() -> None:
    fast = {"achieved": 6000.0, "p99_ms": 20.0}
    # The old rule said True for all of these: it ignored what limited the ladders.
    assert hb.heartbeat_verdict(fast, 0.8, "generator", "server")[0] is None
    assert hb.heartbeat_verdict(fast, 0.8, "not reached", "server")[0] is None
    assert hb.heartbeat_verdict(fast, 0.8, "unclear", "server")[0] is None
    assert hb.heartbeat_verdict(fast, 0.8, "server", "generator")[0] is None
    assert hb.heartbeat_verdict(fast, 0.8, "server", "server")[0] is True
    assert hb.heartbeat_verdict(fast, 0.5, "server", "server")[0] is False
    assert hb.heartbeat_verdict({"achieved": 0.0, "p50_ms": None, "p99_ms": None}, 0.0, "server", "server")[0] is False
