"""The simulator's workload generators: Poisson arrivals, offered load, the papers' job types."""
from __future__ import annotations

import math
import statistics
from dataclasses import replace

import pytest

from protocol.records import Resource
from sim.calibration import AppCalibration, Calibration
from sim.papers import dorm as dorm_paper
from sim.papers import optimus as optimus_paper
from sim.papers.speed import FeatureEpochTimeModel
from sim.simulator import SimConfig, Simulator, simulate
from sim.trace import TraceError, TraceJob, parse_trace
from sim.workload import WorkloadSpec, cluster_trace, generate, job_epochs, job_usage, offered_load

AM = Resource(512, 1)


def calibration(theta: tuple[float, ...] = (2.0, 0.5, 0.0, 0.0, 0.0)) -> Calibration:
    app = AppCalibration(theta=list(theta), loss_curve=[0.5, 2.0, 0.1], clocks_per_epoch=20.0, am_start_s=2.0,
                         startup_s=3.0, finish_s=1.0)
    return Calibration(apps={a: app for a in ("mlr", "nmf", "lda", "lasso")}, measured_on="test")


# ----- Poisson arrivals and determinism ---------------------------------------------------------

def test_poisson_arrivals_have_the_asked_rate() -> None:
    rate = 0.02
    jobs = generate(WorkloadSpec(jobs=4000, arrivals="poisson", rate_per_s=rate), 3)
    times = [j.arrival_s for j in jobs]
    gaps = [b - a for a, b in zip([0.0] + times, times)]
    assert all(g >= 0 for g in gaps)
    # Exponential gaps: mean 1/rate, standard deviation 1/rate (the mean of 4000 is within 5 %).
    assert statistics.fmean(gaps) == pytest.approx(1 / rate, rel=0.05)
    assert statistics.stdev(gaps) == pytest.approx(1 / rate, rel=0.08)
    # Counts per window of 1/rate x 10 seconds are Poisson(10): mean == variance.
    width = 10 / rate
    counts = [0] * int(times[-1] // width)
    for t in times:
        if int(t // width) < len(counts):
            counts[int(t // width)] += 1
    assert statistics.fmean(counts) == pytest.approx(10, rel=0.08)
    assert statistics.pvariance(counts) == pytest.approx(10, rel=0.3)


def test_poisson_rate_defaults_to_jobs_over_window() -> None:
    jobs = generate(WorkloadSpec(jobs=3000, window_s=30000.0, arrivals="poisson"), 5)
    assert jobs[-1].arrival_s == pytest.approx(30000.0, rel=0.06)


def test_generators_are_deterministic_per_seed() -> None:
    spec = WorkloadSpec(jobs=30, arrivals="poisson", epochs=(20, 60))
    assert generate(spec, 4) == generate(spec, 4) and generate(spec, 4) != generate(spec, 5)
    cal = calibration()
    a = cluster_trace(cal, Resource(8192 * 4, 32), AM, 2, 0.7)
    assert a == cluster_trace(cal, Resource(8192 * 4, 32), AM, 2, 0.7)
    assert optimus_paper.generate(optimus_paper.OptimusPaper(), 1) == optimus_paper.generate(optimus_paper.OptimusPaper(), 1)
    assert dorm_paper.generate(dorm_paper.DormPaper(), 1) != dorm_paper.generate(dorm_paper.DormPaper(), 2)


def test_epochs_range_becomes_max_epochs_in_the_trace() -> None:
    jobs = generate(WorkloadSpec(jobs=50, epochs=(20, 60)), 1)
    assert all(j.max_epochs is not None and 20 <= j.max_epochs <= 60 for j in jobs)
    assert len({j.max_epochs for j in jobs}) > 5


@pytest.mark.parametrize("spec, field", [
    (WorkloadSpec(arrivals="poisson", rate_per_s=-1.0), "rate_per_s"),
    (WorkloadSpec(epochs=(30, 20)), "epochs"),
    (WorkloadSpec(arrivals="poisson", window_s=0.0), "window"),
    (WorkloadSpec(jobs=0), "jobs"),
])
def test_bad_knobs_are_named(spec: WorkloadSpec, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        generate(spec, 1)


# ----- offered load -----------------------------------------------------------------------------

def test_offered_load_by_hand() -> None:
    cal = calibration()
    app = cal.apps["mlr"]
    # Two jobs 100 s apart (window 200 s: the span stretched by n / (n - 1)), one worker and one
    # server of 1 vCore / 1024 MB each, 3 epochs of T(1, 1) = 2.5 s on the reference data.
    jobs = [TraceJob(name=f"j{i}", arrival_s=100.0 * i, app="mlr", threshold=1e-6, workers=1, servers=1,
                     executor_memory_mb=1024, max_epochs=3) for i in range(2)]
    assert job_epochs(jobs[0], app) == 3
    train = 3 * 2.5
    am_s = app.am_start_s + app.startup_s + train + app.finish_s
    exec_s = app.startup_s + train
    vcore_s = am_s + 2 * exec_s
    mem_s = 512 * am_s + 2 * 1024 * exec_s
    assert job_usage(jobs[0], app, AM) == pytest.approx((mem_s, vcore_s))
    cluster = Resource(4096, 4)
    expected = max(2 * mem_s / (4096 * 200.0), 2 * vcore_s / (4 * 200.0))
    assert offered_load(jobs, cal, cluster, AM) == pytest.approx(expected)
    assert offered_load(jobs, cal, cluster, AM, window_s=400.0) == pytest.approx(expected / 2)
    # More cluster, less load; the bottleneck resource decides.
    assert offered_load(jobs, cal, Resource(4096, 8), AM) < expected
    with pytest.raises(ValueError, match="window"):
        offered_load(jobs[:1], cal, cluster, AM)


def test_cluster_trace_offers_the_asked_load() -> None:
    cal = calibration()
    cluster = Resource(8192 * 16, 8 * 16)
    for load in (0.6, 0.9):
        ct = cluster_trace(cal, cluster, AM, 1, load)
        # The rate is set so the expected load is `load`; the drawn trace's own is near it.
        assert ct.offered_load == pytest.approx(load, rel=0.25)
        assert ct.offered_load == pytest.approx(offered_load(ct.jobs, cal, cluster, AM))
    low, high = cluster_trace(cal, cluster, AM, 1, 0.6), cluster_trace(cal, cluster, AM, 1, 0.9)
    assert high.rate_per_s == pytest.approx(low.rate_per_s * 1.5)
    # The same jobs, only closer together.
    assert [j.app for j in low.jobs] == [j.app for j in high.jobs]
    assert high.jobs[-1].arrival_s < low.jobs[-1].arrival_s


def test_cluster_trace_jobs_train_tens_of_epochs() -> None:
    cal = calibration()
    ct = cluster_trace(cal, Resource(8192 * 16, 128), AM, 1, 0.75)
    epochs = [job_epochs(j, cal.app(j.app)) for j in ct.jobs]
    assert statistics.median(epochs) >= 20 and all(e <= 60 for e in epochs)


# ----- the papers' job types --------------------------------------------------------------------

@pytest.mark.parametrize("w, p", [(1, 1), (2, 1), (4, 4), (8, 2), (3, 7), (16, 16)])
def test_optimus_apps_follow_table2(w: int, p: int) -> None:
    cal = optimus_paper.calibration()
    sync = cal.apps[optimus_paper.app_name("ResNet50", True)].epoch_model()
    asyn = cal.apps[optimus_paper.app_name("ResNet50", False)].epoch_model()
    # Async needs the seven-feature model (eq. 3's 1/p and p/w); sync is the simulator's own form.
    assert isinstance(asyn, FeatureEpochTimeModel) and not isinstance(sync, FeatureEpochTimeModel)
    # Table 2 by hand, sync (eq. 4, M = 1): θ = 1.02, 2.78, 4.92, 0.00, 0.02.
    sync_step = 1.02 / w + 2.78 + 4.92 * w / p + 0.0 * w + 0.02 * p
    # Async (eq. 3): f = w / (2.83 + 3.92 w/p + 0.00 w + 0.11 p) steps per second.
    async_step = (2.83 + 3.92 * w / p + 0.0 * w + 0.11 * p) / w
    unit_sync = sync.epoch_time(1, 1) / (1.02 + 2.78 + 4.92 + 0.02)
    unit_async = asyn.epoch_time(1, 1) / (2.83 + 3.92 + 0.11)
    assert sync.epoch_time(w, p) == pytest.approx(unit_sync * sync_step)
    assert asyn.epoch_time(w, p) == pytest.approx(unit_async * async_step)
    assert optimus_paper.sync_step_time(w, p) == pytest.approx(sync_step)
    assert 1.0 / optimus_paper.async_speed(w, p) == pytest.approx(async_step)


def test_optimus_paper_speed_shapes() -> None:
    """Table 2's sync function says more workers can slow a job (§3.2 observation (c)); async scales."""
    model = optimus_paper.calibration().apps[optimus_paper.app_name("Seq2Seq", True)].epoch_model()
    assert model.epoch_time(16, 4) > model.epoch_time(4, 4)
    # 1:1, sixteen times the executors of (1, 1) buy less than 10 % (§6.2: more resources do not
    # mean higher speed); with models/optimus_fit.py's M = 16 they buy more than 2x.
    assert model.epoch_time(1, 1) / model.epoch_time(16, 16) < 1.1
    m16 = optimus_paper.calibration(optimus_paper.OptimusPaper(batch_m=16.0)).apps[
        optimus_paper.app_name("Seq2Seq", True)].epoch_model()
    assert m16.epoch_time(1, 1) / m16.epoch_time(16, 16) > 2.0
    asyn = optimus_paper.calibration().apps[optimus_paper.app_name("Seq2Seq", False)].epoch_model()
    assert asyn.epoch_time(16, 16) < asyn.epoch_time(4, 4) / 3


def test_optimus_paper_curve_and_workload() -> None:
    paper = optimus_paper.OptimusPaper()
    cal = optimus_paper.calibration(paper)
    assert len(cal.apps) == 18
    trace = optimus_paper.generate(paper, 1)
    assert len(trace) == 60 and all(0 <= j.arrival_s <= 12000 for j in trace)
    assert {j.sync for j in optimus_paper.generate(replace(paper, modes=(True,)), 1)} == {"bsp"}
    assert all(0.01 <= j.threshold <= 0.05 and j.workers == j.servers for j in trace)
    assert {j.sync for j in trace} == {"bsp", "ssp"}
    # Fig. 7's curve with 1-5 % thresholds: tens of epochs.
    epochs = [job_epochs(j, cal.app(j.app)) for j in trace]
    assert min(epochs) >= 10 and max(epochs) <= 60
    for j in trace:
        app = cal.app(j.app)
        assert app.loss_curve == list(optimus_paper.LOSS_CURVE)
        assert (j.sync == "bsp") == app.reference["sync"]


def test_dorm_paper_mix() -> None:
    paper = dorm_paper.DormPaper()
    trace = dorm_paper.generate(paper, 1)
    assert len(trace) == 50
    counts = {k.name: sum(1 for j in trace if j.app == dorm_paper.app_name(k)) for k in dorm_paper.KINDS}
    assert counts == {"LR": 20, "MF": 20, "CaffeNet": 6, "VGG16": 1, "GoogLeNet": 1, "AlexNet": 1, "ResNet50": 1}
    static = {k.name: k.static for k in dorm_paper.KINDS}
    cal = dorm_paper.calibration(paper)
    for j in trace:
        kind = j.app.split(":")[1]
        assert j.workers + j.servers == static[kind]
        # Each application runs the kind's assumed hours at its static size.
        app = cal.app(j.app)
        hours = app.reference["hours"]
        t = job_epochs(j, app) * app.epoch_model().epoch_time(j.workers, j.servers)
        assert t == pytest.approx(hours * 3600.0)
    gaps = [b.arrival_s - a.arrival_s for a, b in zip(trace, trace[1:])]
    assert statistics.fmean(gaps) == pytest.approx(20 * 60, rel=0.35)


def test_paper_apps_run_in_the_simulator() -> None:
    paper = optimus_paper.OptimusPaper(jobs=3, window_s=60.0, epoch_s=5.0)
    cal = optimus_paper.calibration(paper)
    trace = optimus_paper.generate(paper, 2)
    assert {j.sync for j in trace} == {"bsp", "ssp"}     # both speed forms (the seed draws both)
    res = simulate(trace, "static", cal, SimConfig(nodes=2, node_memory_mb=65536, node_vcores=16))
    assert res.summary.finished == 3
    # optimus-truth reads the asynchronous jobs' seven-feature speed function as it is.
    assert simulate(trace, "optimus-truth", cal, SimConfig(nodes=2, node_memory_mb=65536, node_vcores=16)).summary.finished == 3
    for rec, job in zip(res.records, trace):
        app = cal.app(job.app)
        assert rec.epochs == job_epochs(job, app)
        assert rec.jct is not None and rec.jct >= rec.epochs * app.epoch_model().epoch_time(job.workers, job.servers)


def test_trace_accepts_module_class_apps_only() -> None:
    ok = parse_trace(['{"arrival_s": 0, "app": "optimus:ResNet50_sync", "threshold": 0.1, "workers": 1, "servers": 1}'])
    assert ok[0].app == "optimus:ResNet50_sync"
    with pytest.raises(TraceError, match="line 1: app"):
        parse_trace(['{"arrival_s": 0, "app": "resnet", "threshold": 0.1, "workers": 1, "servers": 1}'])
    with pytest.raises(TraceError, match="line 1: weight"):
        parse_trace(['{"arrival_s": 0, "app": "mlr", "threshold": 0.1, "workers": 1, "servers": 1, "weight": 0}'])


def test_feature_model_checks_coefficients() -> None:
    with pytest.raises(ValueError, match="7 coefficients"):
        FeatureEpochTimeModel((1.0, 2.0))
    with pytest.raises(ValueError, match="non-negative"):
        FeatureEpochTimeModel((1.0, -1.0, 0, 0, 0, 0, 0))
    assert not math.isnan(FeatureEpochTimeModel((1.0, 0, 0, 0, 0, 0, 0)).speed(2, 2))


def test_dorm_weights_reach_the_job_spec() -> None:
    paper = dorm_paper.DormPaper()
    trace = dorm_paper.generate(paper, 1)
    sim = Simulator(trace, "static", dorm_paper.calibration(paper), SimConfig(nodes=2))
    weights = {j.job.app: j.spec_json()["weight"] for j in sim.jobs}
    assert weights[dorm_paper.app_name(dorm_paper.KINDS[1])] == 2.0     # MF's weight, Table II
    assert weights[dorm_paper.app_name(dorm_paper.KINDS[0])] == 1.0
