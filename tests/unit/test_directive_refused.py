"""A directive its job refused (a change it cannot make; the AM's report says why, in
`JobReport.directive_refused`): the RM never sends it again, and the policies plan the job at the
shape it has, not at the refused one. The controller's side is in tests/unit/test_directives_units.py."""
from __future__ import annotations

from protocol.internal_api import NodePlacement, ShapeDirective
from protocol.job_report import JobReport
from protocol.records import Resource
from rm.directive_retry import FIRST_RETRY_S, MAX_RETRY_S, DirectiveRetries, short_of
from rm.policies import AppView, ClusterSnapshot, ps_job_view
from rm.policies.elastic_jobs import elastic_view
from rm.policies.eps_jobs import classify
from rm.policies.queue_guard import current_shape
from rm.policies.queue_reclaim import current_or

E = Resource(1024, 1)
WHY = "9 workers is more than this job's maximum of 8 (max_workers unset, 8 input splits)"


def report(version: int, workers: int, refused: str = "") -> JobReport:
    return JobReport(workers=workers, servers=2, started=True, directive_version=version, executor_resource=E,
                     directive_refused=refused)


def test_refused_names_only_the_version_acted_on() -> None:
    r = report(3, 8, WHY)
    assert r.refused(3) and not r.refused(2) and not r.refused(4)
    assert not report(3, 8).refused(3)


def test_a_refused_directive_is_not_short_and_never_sent_again() -> None:
    d = ShapeDirective(workers=9, servers=2, version=1)
    assert short_of(d, report(1, 8)) and not short_of(d, report(1, 8, WHY))
    assert short_of(d, report(2, 8, "a later directive's refusal"))     # not this version's
    r = DirectiveRetries()
    assert not r.due("a", d, report(1, 8), 0.0)                 # seen short first: counting
    assert "a" in r.apps
    assert not any(r.due("a", d, report(1, 8, WHY), t) for t in (1.0, FIRST_RETRY_S, 10 * MAX_RETRY_S))
    assert "a" not in r.apps                                     # the count is dropped


def test_policies_plan_a_job_at_its_shape_when_it_refused_its_directive() -> None:
    spec = ps_job_view({"app": "mlr", "workers": 4, "servers": 2, "executor_memory_mb": E.memory,
                        "executor_vcores": E.vcores})
    d = ShapeDirective(workers=9, servers=2, version=5)

    def app(rep: JobReport) -> AppView:
        return AppView("app_A", "default", "alice", "RUNNING", 1.0, E.scale(1 + 8 + 2), rep, spec,
                       am_resource=E, directive=d, executors=(NodePlacement("n1", 8, 2),))

    def planned(rep: JobReport) -> set[tuple[int, int]]:
        """The shape each policy's view plans the job at: EPS's, DRF / Dorm's, the queue guard's
        and the queue reclaim's."""
        a = app(rep)
        snap = ClusterSnapshot(now=100.0, total=E.scale(16), used=E.scale(11), nodes=(), apps=(a,))
        (eps,) = classify(snap).running
        (elastic,) = elastic_view(snap).jobs
        return {(eps.workers, eps.servers), (elastic.workers, elastic.servers), current_shape(a),
                current_or(a, (rep.workers, rep.servers))}

    assert app(report(4, 8)).heading_to == d and app(report(5, 8, WHY)).heading_to is None
    assert planned(report(4, 8)) == {(9, 2)}          # acted on an older one: moving to the directive
    assert planned(report(5, 8, WHY)) == {(8, 2)}     # refused this one: planned where it is
