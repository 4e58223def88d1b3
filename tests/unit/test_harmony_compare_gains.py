"""sim/harmony_compare.py's comparisons on crafted runs: a JCT gain covers only the jobs both runs
finished, and a job Harmony never trained is left out of the isolated-at-Harmony's-DoP trace."""
from __future__ import annotations

from typing import Optional

from sim.colocation import Mode
from sim.harmony_compare import RunOutcome, gains, isolated_at_dops, missing_dops
from sim.job_record import JobRecord
from sim.metrics import summarize
from sim.simulator import SimResult
from sim.trace import TraceJob


def outcome(name: str, jcts: list[Optional[float]]) -> RunOutcome:
    """A run whose job j<i> arrived at 0 and took jcts[i] (None: never finished)."""
    records = [JobRecord(name=f"j{i}", app="mlr", user="u", queue="default", arrival=0.0,
                         end=None if jct is None else jct, final_status="" if jct is None else "SUCCEEDED")
               for i, jct in enumerate(jcts)]
    summary = summarize([r.jct for r in records], [r.arrival for r in records], [r.end for r in records],
                        [], 0, 0.0, 0.0, 0)
    return RunOutcome(name, "static", Mode.ISOLATED, SimResult("static", records, [], summary), 0.5, 0.5, 1)


def test_a_jct_gain_covers_only_the_jobs_both_runs_finished() -> None:
    # The baseline finished all four; the new run lost the two long ones. Each run's own
    # finished-jobs mean would give 550 / 100 = 5.5x; over the jobs both finished it is 1x.
    out = {"isolated": outcome("isolated", [100.0, 100.0, 1000.0, 1000.0]),
           "harmony": outcome("harmony", [100.0, 100.0, None, None])}
    g = gains(out, "harmony")
    assert g["jct_gain"] == 1.0 and g["jct_gain_jobs"] == 2
    assert g["isolated_finished"] == 4 and g["harmony_finished"] == 2
    assert g["isolated_jobs"] == 4 and g["harmony_jobs"] == 4
    assert g["makespan_gain"] is None                     # the new run has no makespan: jobs unfinished


def test_a_gain_with_no_job_finished_in_both_is_none() -> None:
    out = {"isolated": outcome("isolated", [None, 100.0]), "harmony": outcome("harmony", [50.0, None])}
    g = gains(out, "harmony")
    assert g["jct_gain"] is None and g["jct_gain_jobs"] == 0


def job(name: str) -> TraceJob:
    return TraceJob(name=name, arrival_s=0.0, app="mlr", workers=1, servers=1, max_workers=4, threshold=0.01,
                    max_epochs=5)


def test_a_job_harmony_never_trained_is_left_out_and_counted_not_a_crash() -> None:
    trace = [job("a"), job("b"), job("c")]
    dops = {"a": 4, "c": 2}                     # b never trained under Harmony: no DoP
    iso = isolated_at_dops(trace, dops)
    assert [(j.name, j.workers, j.servers) for j in iso] == [("a", 4, 4), ("c", 2, 2)]
    assert missing_dops(trace, dops) == ["b"] and missing_dops(trace, {"a": 1, "b": 1, "c": 1}) == []
