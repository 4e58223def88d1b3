"""The co-location model (sim/colocation.py), its simulator adapter, the Harmony workload and a run."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from elastane_cli.main import main
from sim.calibration import save
from sim.trace import dump_trace

from sim.colocation import (ColocationError, ColocationTimes, Interference, Mode, SubtaskTimes, harmony_group_time,
                            iteration_times, throughput_gain, utilization)
from sim.harmony_compare import best_case, gains, run_mode
from sim.iteration_time import ClusterLoad, ExecutorLoad, JobLoad
from sim.simulator import SimConfig
from sim.sim_job import JobTimings
from sim.workload_harmony import CLOCKS_PER_EPOCH, DOP, HarmonyWorkloadSpec, generate

NONE = Interference(0.0, 0.0)


def L(c: float, n: float) -> SubtaskTimes:
    return SubtaskTimes(c, n)


# ----- eq. 4.1 ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("loads, expected", [
    ([L(2, 1), L(1, 3)], 4.0),          # network-bound: 1 + 3
    ([L(3, 1), L(3, 1)], 6.0),          # CPU-bound: 3 + 3
    ([L(5, 5), L(1, 1)], 10.0),         # job-bound (Fig. 4.7b): the long job's 5 + 5
    ([L(0.7, 0.3), L(0.3, 0.7)], 1.0),  # complementary: every term is 1
    ([L(2, 0.5)], 2.5),                 # alone: COMP then COMM
])
def test_group_time_is_eq_4_1(loads: list[SubtaskTimes], expected: float) -> None:
    assert harmony_group_time(loads, NONE) == pytest.approx(expected)
    assert iteration_times(loads, Mode.HARMONY, NONE) == pytest.approx([expected] * len(loads))


def test_handoffs_add_one_per_queued_subtask() -> None:
    loads = [L(2, 1), L(1, 3)]
    # Two jobs, three subtasks each (COMP, PULL, PUSH), each queued behind the other job's.
    assert harmony_group_time(loads, Interference(arbiter_handoff_s=0.01)) == pytest.approx(4.0 + 6 * 0.01)
    assert harmony_group_time([L(2, 1)], Interference(arbiter_handoff_s=0.01)) == pytest.approx(3.0)


def test_isolated_is_each_job_alone() -> None:
    assert iteration_times([L(2, 1), L(1, 3)], Mode.ISOLATED) == (3.0, 4.0)


def test_complementary_pair_gains_and_a_like_pair_gains_less() -> None:
    pair = [L(0.7, 0.3), L(0.3, 0.7)]
    like = [L(0.7, 0.3), L(0.7, 0.3)]
    g_pair = throughput_gain(pair, Mode.HARMONY, NONE)
    g_like = throughput_gain(like, Mode.HARMONY, NONE)
    assert g_pair == pytest.approx(2.0)           # two jobs' work in one job's time
    assert g_like == pytest.approx(2.0 / 1.4)     # CPU-bound: sum of COMPs 1.4
    assert 1.0 < g_like < g_pair
    assert throughput_gain(pair, Mode.ISOLATED) == 1.0


@pytest.mark.parametrize("loads", [
    [L(0.7, 0.3), L(0.3, 0.7)],
    [L(0.7, 0.3), L(0.7, 0.3)],
    [L(0.5, 0.5), L(0.2, 0.8), L(0.8, 0.2)],
    [L(1.0, 0.3), L(0.2, 1.1)],
])
def test_naive_is_slower_than_harmony(loads: list[SubtaskTimes]) -> None:
    harmony = throughput_gain(loads, Mode.HARMONY)
    naive = throughput_gain(loads, Mode.NAIVE)
    assert naive < harmony
    # and contention makes it slower still
    assert throughput_gain(loads, Mode.NAIVE, Interference(0.0, 0.3)) < throughput_gain(loads, Mode.NAIVE, NONE)


def test_a_job_bound_group_charges_its_short_job_the_long_ones_iteration() -> None:
    # Fig. 4.7b: eq. 4.1 makes every job of the group take the group iteration, so the short job
    # here runs at the long one's pace, and contending freely would do better: why Algorithm 2
    # (rm/policies/harmony_grouping.py) keeps groups from becoming job-bound.
    loads = [L(1.0, 0.2), L(0.1, 2.0)]
    assert iteration_times(loads, Mode.HARMONY, NONE) == pytest.approx((2.2, 2.2))
    assert throughput_gain(loads, Mode.NAIVE, NONE) > throughput_gain(loads, Mode.HARMONY, NONE)


def test_naive_of_one_job_is_its_own_time_and_idle_jobs_do_not_contend() -> None:
    assert iteration_times([L(2, 1)], Mode.NAIVE) == (3.0,)
    times = iteration_times([L(2, 1), L(0, 0)], Mode.NAIVE)
    assert times[0] == pytest.approx(3.0)


def test_utilization_is_eq_4_3() -> None:
    loads = [L(2, 1), L(1, 3)]
    assert utilization(loads, [4.0, 4.0]) == pytest.approx((0.75, 1.0))


def test_bad_loads_are_refused() -> None:
    with pytest.raises(ColocationError):
        SubtaskTimes(-1.0, 1.0)
    with pytest.raises(ColocationError):
        Interference(-0.1, 0.0)


# ----- the simulator adapter ----------------------------------------------------------------------------
def _job(app_id: str, app: str, nodes: list[str], solo: float) -> JobLoad:
    execs = tuple(ExecutorLoad(app_id, app, role, n, 4) for n in nodes for role in ("worker", "server"))
    return JobLoad(app_id, app, len(nodes), len(nodes), solo, execs)


def test_adapter_applies_eq_4_1_to_jobs_sharing_nodes() -> None:
    trace, cal, truth = generate(HarmonyWorkloadSpec(settings=1), seed=3)
    a, b, c = trace[0], trace[1], trace[2]
    nodes = [f"n{i}" for i in range(DOP)]
    ja = _job("A", a.app, nodes, cal.app(a.app).epoch_model().epoch_time(DOP, DOP))
    jb = _job("B", b.app, nodes, cal.app(b.app).epoch_model().epoch_time(DOP, DOP))
    jc = _job("C", c.app, [f"m{i}" for i in range(DOP)], cal.app(c.app).epoch_model().epoch_time(DOP, DOP))
    cluster = ClusterLoad.of({n: 8 for n in nodes}, (ja, jb, jc))
    now = [0.0]
    model = ColocationTimes(cal, Mode.HARMONY, NONE, clock=lambda: now[0])
    ta, tb = truth[0], truth[1]
    # The adapter recovers each job's COMP / COMM at DoP 16 from the speed function ...
    assert model.subtasks(ja).t_cpu == pytest.approx(ta.t_cpu)
    assert model.subtasks(ja).t_net == pytest.approx(ta.t_net)
    # ... the two sharing nodes take eq. 4.1's group time per iteration, the third its own.
    tg = max(ta.t_cpu + tb.t_cpu, ta.t_net + tb.t_net, ta.t_cpu + ta.t_net, tb.t_cpu + tb.t_net)
    assert model.epoch_time(ja, cluster) == pytest.approx(tg * CLOCKS_PER_EPOCH)
    assert model.epoch_time(jb, cluster) == pytest.approx(tg * CLOCKS_PER_EPOCH)
    assert model.epoch_time(jc, cluster) == pytest.approx(jc.solo_epoch_s)
    # Utilization over time: eq. 4.3 per set times its hosts, the third job alone on its own.
    now[0] = 10.0
    model.epoch_time(ja, ClusterLoad.of({}, ()))    # a new (empty) snapshot closes the interval
    tc = truth[2]
    busy = DOP * min(1.0, (ta.t_cpu + tb.t_cpu) / tg) + DOP * tc.t_cpu / (tc.t_cpu + tc.t_net)
    cpu, _ = model.mean_utilization(3 * DOP, 0.0, 10.0)
    assert cpu == pytest.approx(busy / (3 * DOP))
    # Isolated mode ignores the sharing.
    iso = ColocationTimes(cal, Mode.ISOLATED, NONE)
    assert iso.epoch_time(ja, cluster) == pytest.approx(ja.solo_epoch_s)


# ----- the workload -------------------------------------------------------------------------------------
def test_workload_is_the_papers_shape_and_deterministic() -> None:
    trace, cal, truth = generate()
    assert len(trace) == 80 and len(cal.apps) == 80
    assert len({j.app.split("_")[0] for j in trace}) == 4                 # 4 applications
    assert all((j.workers, j.servers) == (DOP, DOP) for j in trace)
    shares = sorted(t.cpu_share for t in truth)
    assert shares[0] < 0.3 and shares[-1] > 0.7                           # spans about 20:80 to 80:20
    for j, t in zip(trace, truth):
        model = cal.app(j.app).epoch_model()
        assert model.epoch_time(DOP, DOP) == pytest.approx((t.t_cpu + t.t_net) * CLOCKS_PER_EPOCH)
        assert cal.app(j.app).epochs_to_converge(j.threshold, j.max_epochs or 0) == t.epochs
    again, _, _ = generate()
    assert again == trace
    other, _, _ = generate(seed=2)
    assert other != trace


def test_best_case_prefers_complementary_jobs() -> None:
    comp = best_case([L(0.7, 0.3), L(0.3, 0.7)], [100.0, 100.0], NONE)
    like = best_case([L(0.7, 0.3), L(0.7, 0.3)], [100.0, 100.0], NONE)
    assert comp == pytest.approx(2.0)
    assert 1.0 < like < comp


# ----- the simulator with Harmony -----------------------------------------------------------------------
def test_harmony_runs_a_tiny_trace_to_completion() -> None:
    trace, cal, _ = generate(HarmonyWorkloadSpec(settings=1, nodes=DOP, job_minutes=(3.0, 6.0)), seed=1)
    trace = trace[:4]
    cfg = SimConfig(nodes=DOP, node_memory_mb=32768, node_vcores=8, am_nodes=1, heartbeat_s=2.0,
                    policy_interval_s=2.0, timings=JobTimings(allocate_interval_s=2.0))
    out = {name: run_mode(trace, cal, cfg, name, policy, mode)
           for name, policy, mode in (("isolated", "static", Mode.ISOLATED), ("harmony", "harmony", Mode.HARMONY))}
    for o in out.values():
        s = o.result.summary
        assert s.finished == s.jobs == 4
        assert 0.0 < o.cpu_utilization <= 1.0
    g = gains(out, "harmony")
    assert g["jct_gain"] is not None and g["makespan_gain"] is not None


# ----- the CLI ------------------------------------------------------------------------------------------
def test_cli_sim_run_harmony_compares_with_isolated_and_naive(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    trace, cal, _ = generate(HarmonyWorkloadSpec(settings=1, nodes=DOP, job_minutes=(3.0, 5.0)), seed=2)
    trace_file, cal_file, out = tmp_path / "trace.jsonl", tmp_path / "cal.json", tmp_path / "out"
    trace_file.write_text(dump_trace(trace[:3]))
    save(cal, cal_file)
    args = ["sim", "run", str(trace_file), "--policy", "harmony", "--nodes", str(DOP), "--node-memory-mb", "32768",
            "--am-nodes", "1", "--step-s", "2", "--calibration", str(cal_file), "--out", str(out)]
    assert main(args) == 0
    text = capsys.readouterr().out
    for run in ("isolated", "harmony", "naive"):
        assert run in text
    assert "harmony vs isolated: mean JCT" in text
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["runs"]) == {"isolated", "harmony", "naive"}
    assert all(r["finished"] == 3 for r in summary["runs"].values())
    assert len((out / "records.jsonl").read_text().splitlines()) == 3
    # Bad numbers are refused with exit 2, naming the option.
    assert main(args[:-2] + ["--am-nodes", "-1"]) == 2
    assert "--am-nodes" in capsys.readouterr().err
