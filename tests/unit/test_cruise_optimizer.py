"""Cruise metrics, trigger policy (injected clock), profile derivation and the optimizer loop."""
import pytest

from appmaster.cruise.metrics import MetricsBook, MetricsError, MovingAverage
from appmaster.cruise.optimizer import CruiseConfig, CruiseOptimizer, JobSizes
from appmaster.cruise.plan import SwitchOp
from appmaster.cruise.plan_builder import ExecutorState, apply_plan
from appmaster.cruise.profiling import ProfilingError, SlotInfo, derive_profiles
from appmaster.cruise.targets import Role
from appmaster.cruise.trigger import TriggerPolicy
from fakes import FakeClock


def test_moving_average_and_batched_reports():
    a = MovingAverage(0.5)
    assert a.add(10) == 10 and a.add(20) == 15 and a.count == 2
    b = MovingAverage(0.5)
    b.add(10)
    b.add(20, weight=2)          # same as two samples of 20
    assert b.value == pytest.approx(17.5)
    with pytest.raises(MetricsError, match="alpha"):
        MovingAverage(0.0)


def test_bad_reports_are_named_and_change_nothing():
    book = MetricsBook()
    with pytest.raises(MetricsError, match="comm_s"):
        book.record_worker("w0", 1, 100, 1.0, -1.0)
    with pytest.raises(MetricsError, match="batches"):
        book.record_worker("w0", 0, 100, 1.0, 1.0)
    assert book.batches_since_reconfiguration("w0") == 0 and "w0" not in book.last_known


def test_worker_and_server_derivations():
    book = MetricsBook(alpha=1.0)
    book.record_worker("w0", batches=4, samples=400, compute_s=2.0, comm_s=1.0, bytes_moved=4e6)
    assert book.workers["w0"].compute_s_per_sample.value == pytest.approx(0.005)
    assert book.workers["w0"].bandwidth == pytest.approx(1e6 / 0.25)
    book.record_server("s0", 0, 0.0, 0)
    book.record_server("s0", 100, 0.5, 5e6)
    assert book.servers["s0"].bandwidth.value == pytest.approx(1e7)
    assert book.servers["s0"].service_s.value == pytest.approx(0.005)
    book.record_server("s0", 3, 0.1, 10)          # counters reset (server restarted): no sample
    assert book.servers["s0"].reports == 1


def test_trigger_waits_for_every_worker_and_the_interval():
    clock = FakeClock(1000.0)
    t = TriggerPolicy(min_batches=3, min_interval_s=60, clock=clock)
    assert "no workers" in t.why_not({})
    assert "w1" in t.why_not({"w0": 3, "w1": 2})
    assert t.ready({"w0": 3, "w1": 3})
    t.attempted()
    assert "ago" in t.why_not({"w0": 9, "w1": 9})
    clock.t += 59.9
    assert not t.ready({"w0": 9, "w1": 9})
    clock.t += 0.2
    assert t.ready({"w0": 9, "w1": 9})


def test_profiles_borrow_from_class_then_scale_by_vcores():
    book = MetricsBook(alpha=1.0)
    book.record_worker("w0", 1, 100, 0.4, 0.1, 1e6)       # 4 ms/sample on a 2-vcore node
    book.record_server("s0", 0, 0, 0)
    book.record_server("s0", 10, 1.0, 2e7)
    slots = [SlotInfo("w0", "small", 2), SlotInfo("s0", "small", 2), SlotInfo("new", "big", 8)]
    p = {x.node_id: x for x in derive_profiles(book, slots)}
    assert p["s0"].compute_s_per_sample == pytest.approx(4e-3)      # same class as w0
    assert p["new"].compute_s_per_sample == pytest.approx(1e-3)     # 4x the cores
    assert p["w0"].worker_bandwidth == pytest.approx(1e7) and p["w0"].server_bandwidth == pytest.approx(2e7)
    with pytest.raises(ProfilingError, match="compute"):
        derive_profiles(MetricsBook(), slots)


JOB = JobSizes(input_blocks=60, samples_per_block=100, model_blocks=12, batch_size=100, nominal_bytes_per_batch=1e6)


def start(workers, servers, clock, **cfg):
    opt = CruiseOptimizer(JOB, CruiseConfig(min_batches=3, min_interval_s=10, **cfg), clock)
    inp = {w: frozenset(range(i, 60, len(workers))) for i, w in enumerate(workers)}
    mod = {s: frozenset(range(i, 12, len(servers))) for i, s in enumerate(servers)}
    ex = [ExecutorState(w, Role.WORKER, inp[w]) for w in workers] + [ExecutorState(s, Role.SERVER, mod[s]) for s in servers]
    opt.set_configuration(ex, [SlotInfo(e.executor_id) for e in ex])
    return opt


def report(opt, c_per_sample=9e-3, comm_bw=1e7, batches=3):
    for e in opt.executors:
        if e.role is Role.WORKER:
            # comm time per batch as a worker-bound exchange of 1 MB at comm_bw
            opt.record_worker(e.executor_id, batches, batches * 100, batches * 100 * c_per_sample,
                              batches * 1e6 / comm_bw, batches * 1e6)
        else:
            opt.record_server(e.executor_id, 0, 0, 0)
            opt.record_server(e.executor_id, 100, 1.0, 1e7)


def test_optimizer_reconfigures_when_gain_is_large():
    clock = FakeClock(1000.0)
    opt = start(["w0"], ["s0", "s1", "s2", "s3", "s4"], clock)   # compute-heavy job on (1, 5)
    assert opt.maybe_decide() is None                              # no reports yet
    report(opt, batches=2)
    assert opt.maybe_decide() is None and "w0" in opt.why_not_ready()
    report(opt, batches=1)
    d = opt.maybe_decide()
    assert d.action == "reconfigure" and d.before_s > d.after_s and d.gain > 0.05
    assert d.target.shape[0] > 1
    switches = d.plan.of_type(SwitchOp)
    assert switches and all(op.role is Role.WORKER for op in switches)
    final = apply_plan(opt.executors, d.plan)
    assert sum(len(e.blocks) for e in final.values() if e.role is Role.WORKER) == 60
    assert opt.maybe_decide() is None                              # plan in progress
    js = d.to_json()
    assert js["chosen_shape"] == list(d.target.shape) and js["plan"]["ops"]
    assert js["inputs"]["job"]["overlap"] and len(js["inputs"]["nodes"]) == 6     # what it was priced with
    opt.reconfigured(list(final.values()))
    assert opt.metrics.batches_since_reconfiguration("w0") == 0 and opt.maybe_decide() is None


def test_optimizer_skips_below_the_gain_threshold():
    clock = FakeClock(1000.0)
    # (7, 1) is optimal: 9 ms of compute per sample against 0.5 MB each way per mini-batch of 100 at
    # 10 MB/s (eq. 3.5 alone would say (6, 2); the compute overlaps the servers' queue).
    opt = start(["w0", "w1", "w2", "w3", "w4", "w5", "w6"], ["s0"], clock)
    report(opt)
    d = opt.maybe_decide()
    assert d.action == "skip" and d.plan is None
    assert "target equals" in d.reason or "< 5%" in d.reason
    # A threshold of 0 would still not reconfigure into the same configuration.
    assert opt.decisions[-1] is d


def test_capacity_growth_and_reclaim():
    clock = FakeClock(1000.0)
    opt = start(["w0", "w1", "w2"], ["s0"], clock)
    report(opt)
    grow = opt.on_capacity_change(8)
    assert grow.trigger == "capacity" and grow.action == "reconfigure"
    assert sum(grow.target.shape) == 8
    opt.reconfigured(list(apply_plan(opt.executors, grow.plan).values()))
    report(opt)
    clock.t += 100
    keep = [SlotInfo(e.executor_id) for e in opt.executors][:4]
    gone = {e.executor_id for e in opt.executors} - {s.slot_id for s in keep}
    shrink = opt.on_capacity_change(keep)
    assert shrink.action == "reconfigure" and "reclaimed" in shrink.reason
    final = apply_plan(opt.executors, shrink.plan)
    assert not gone & set(final) and len(final) == 4
    assert sorted(b for e in final.values() if e.role is Role.WORKER for b in e.blocks) == list(range(60))


def test_optimizer_records_why_it_cannot_decide():
    opt = start(["w0"], ["s0"], FakeClock(1000.0))
    d = opt.decide()
    assert d.action == "skip" and "cannot decide" in d.reason


def test_shape_is_taken_out_of_measured_profiles():
    # Two workers on one 1-core host, one server: compute was measured with both computing at once,
    # and each mini-batch's communication took 30 ms more than its exchange could.
    from appmaster.cruise.profiling import isolate_from_shape, measured_bytes_per_batch
    from models.cruise_cost import Assignment, JobProfile, NodeProfile

    book = MetricsBook(alpha=1.0)
    for e in ("w0", "w1", "s0"):
        book.record_host(e, "host-a", 1)
    assert book.compute_parallelism() == 1.0
    book.record_host("s0", "host-b", 4)           # an executor moves: its host's cores count once
    assert book.compute_parallelism() == 5.0
    book.record_host("s0", "host-a", 1)
    for w in ("w0", "w1"):
        book.record_worker(w, batches=10, samples=1000, compute_s=2.0, comm_s=10 * 0.05, bytes_moved=10 * 2e5)
    assert measured_bytes_per_batch(book, 1.0) == pytest.approx(1e5)          # pull + push, each way
    job = JobProfile(4, 100, 2, measured_bytes_per_batch(book, 1.0), 10, book.compute_parallelism())
    measured = [NodeProfile(e, 2e-3, 1e7, 1e7) for e in ("w0", "w1", "s0")]
    out = {p.node_id: p for p in isolate_from_shape(measured, job, Assignment({"w0": 2, "w1": 2}, {"s0": 2}), book)}
    # Exchange: 1e5 B / 1e7 B/s on the worker's link + 2 blocks * 5e4 B * 2 workers / 1e7 B/s at the server.
    assert out["w0"].latency_s_per_batch == pytest.approx(0.05 - 0.01 - 0.02)
    assert out["s0"].latency_s_per_batch == pytest.approx(0.02)      # a server borrows the workers' mean
    assert out["w0"].compute_s_per_sample == pytest.approx(1e-3)     # 2 workers on 1 core: k = 2
    with pytest.raises(MetricsError, match="cores"):
        book.record_host("w0", "host-a", 0)
    assert MetricsBook().compute_parallelism() == float("inf")
