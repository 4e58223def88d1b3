"""Capacity preemption inside the RM core (fake clock), end to end through the allocate protocol:
queue A's elastic job grew into the cluster; a job arrives in queue B; the policy round shrinks A's
job by a directive its AM carries out live, B's job gets its AM and gang; a plain app that ignores
its preemption message has its containers killed (exit status PREEMPTED) after the grace period;
a queue with disable_preemption is left alone; bad settings stop the RM naming them."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Optional

import pytest

from protocol import internal_api as api
from protocol.config import ConfigError, QueueConfig, RMConfig, load_rm
from protocol.job_report import JobReport
from protocol.records import ExitStatus, Resource
from rm.core import ResourceManagerCore
from rm.model import AmSpec
from rm.policies import StaticPolicy
from rm.policy_runner import run_policy
from rm.reclaim_runner import PREEMPTED_DIAGNOSTICS
from rm import policies, prometheus
from rm.policies.queue_reclaim import ContainerView, PreemptionWarning, am_named, check_book
from rm.policy_runner import build_snapshot
from rm.reclaim_runner import reclaim_inputs
from rm.rest_views import app_json, scheduler_info
from rm.web.scheduler_page import render_scheduler_page
from rm_testing import FakeClock, ask, heartbeat, launch_and_register, make_core, ps_spec, register, submit

E = Resource(1024, 1)
NODES = ("n1:1", "n2:1")
QUEUES = [QueueConfig("a", 50.0, 100.0), QueueConfig("b", 50.0, 100.0)]
SETTINGS: dict[str, Any] = {"preemption_natural_termination_factor": 1.0, "preemption_max_wait_before_kill_s": 5.0,
                            "preemption_hold_rounds": 3}


def submit_ps(core: ResourceManagerCore, queue: str, **spec: Any) -> str:
    app_id = core.new_application()
    ps = {"app": "mlr", "executor_memory_mb": 1024, "executor_vcores": 1, **spec}
    core.submit(app_id, "alice", "job", queue, "ELASTANE_PS", AmSpec(["true"], {}, {}, E), 1, ps_job=ps_spec(ps))
    core.app_saved(app_id)
    return app_id


class ElasticAm:
    """What the PS AM does on the allocate protocol, scripted: ask for its executors, report its
    shape, carry out a directive's counts by releasing its latest executors (EPS remove)."""

    def __init__(self, core: ResourceManagerCore, app_id: str):
        self.core = core
        self.claims = launch_and_register(core, app_id)
        self.response_id = 0
        self.held: dict[str, str] = {}      # container id -> role
        self.last: Optional[api.AllocateResponse] = None

    def allocate(self, asks: Optional[list[api.ResourceAsk]] = None, releases: Optional[list[str]] = None) -> api.AllocateResponse:
        w = sum(1 for r in self.held.values() if r == "worker")
        s = len(self.held) - w
        r = self.core.allocate(self.claims, api.AllocateRequest(
            response_id=self.response_id, asks=asks or [], releases=releases or [],
            shape=JobReport(workers=w, servers=s, started=w > 0 and s > 0, executor_resource=E)))
        self.response_id = r.response_id
        for c in r.allocated:
            self.held[c.container_id] = c.tag
        for done in r.completed:
            self.held.pop(done.container_id, None)
        self.last = r
        return r

    def obey(self, d: api.ShapeDirective) -> list[str]:
        out: list[str] = []
        for role, want in (("worker", d.workers), ("server", d.servers)):
            mine = sorted((c for c, r in self.held.items() if r == role), key=lambda c: int(c.rsplit("_", 1)[1]))
            out += mine[want:]
        for c in out:
            del self.held[c]
        self.allocate(releases=out)
        return out


def nm_confirms(core: ResourceManagerCore, released: list[str]) -> None:
    for n in NODES:
        node = core.nodes.get(n)
        gone = [c for c in released if node is not None and c in node.releasing]
        heartbeat(core, n, [api.ContainerStatus(container_id=c, state="COMPLETE", exit_status=-105) for c in gone])


def cluster(clock: FakeClock, queues: list[QueueConfig] = QUEUES, **kw: Any) -> ResourceManagerCore:
    core = make_core(clock, queues=queues, **{**SETTINGS, **kw})
    for n in NODES:
        register(core, n, mem=4096, vcores=4)
    return core


def grown_job(core: ResourceManagerCore, queue: str = "a") -> tuple[str, ElasticAm]:
    """A job in `queue` holding its AM + 5 workers + 1 server: 7 of the cluster's 8 GB."""
    a = submit_ps(core, queue, workers=5, servers=1, min_workers=1, min_servers=1)
    am = ElasticAm(core, a)
    am.allocate(asks=[ask(1, 5, tag="worker"), ask(2, 1, tag="server")])
    am.allocate()
    assert len(am.held) == 6
    return a, am


def test_a_queue_gets_its_guarantee_back_by_a_live_shrink() -> None:
    clock = FakeClock()
    core = cluster(clock)
    a, am_a = grown_job(core)
    b = submit_ps(core, "b", workers=2, servers=1, min_workers=1, min_servers=1)
    assert core.attempts[core.apps[b].current_attempt or ""].am_container_id == ""   # its gang does not fit
    run_policy(core, StaticPolicy())
    # Queue b is owed half the cluster (its AM + 3 executors): queue a's job shrinks by 3 executors.
    d = am_a.allocate().shape_directive
    assert d is not None and (d.workers, d.servers) == (2, 1) and d.reason.startswith("queue reclaim")
    assert core.queue_shares["b"].ideal == Resource(4096, 4)
    nm_confirms(core, am_a.obey(d))
    # B's AM and its gang fit now.
    assert core.attempts[core.apps[b].current_attempt or ""].am_container_id != ""
    run_policy(core, StaticPolicy())
    rec = core.apps[a].preemption
    assert (rec.shrunk, rec.killed, rec.resources) == (3, 0, E.scale(3))
    view = app_json(core, core.apps[a])
    assert view["preemptedResourceMB"] == 3072 and view["numNonAMContainerPreempted"] == 3
    assert view["numAMContainerPreempted"] == 0 and "shrunk from 5 workers + 1 servers to 2 + 1" in view["diagnostics"]
    # Nothing oscillates: the job is held, and rounds after the shrink change no directive of it.
    version = core.apps[a].directive_version
    for _ in range(5):
        clock.advance(1.0)
        run_policy(core, StaticPolicy())
    assert core.apps[a].directive_version == version and core.reclaim_book.targets == {}
    q = {x["queueName"]: x for x in scheduler_info(core)["scheduler"]["schedulerInfo"]["queues"]["queue"]}
    assert q["a"]["preemptedResourceMB"] == 3072 and q["a"]["beingReclaimed"] == {"memory": 0, "vCores": 0}
    assert q["b"]["guaranteedResource"] == {"memory": 4096, "vCores": 4} and q["b"]["numContainersShrunk"] == 0
    # Prometheus counters and the web UI's scheduler page say the same.
    prom = prometheus.render(core)
    assert 'elastane_rm_queue_preempted_containers_total{queue="a",how="shrink"} 3' in prom
    assert 'elastane_rm_queue_preempted_memory_mb_total{queue="a"} 3072' in prom
    assert 'elastane_rm_queue_share_memory_mb{queue="b",kind="guaranteed"} 4096' in prom
    page = render_scheduler_page(SimpleNamespace(core=core, policy_interval_s=1.0), clock() * 1000)  # type: ignore[arg-type]
    assert "Capacity preemption" in page and "Being reclaimed memory" in page and "Executors shrunk" in page


def test_a_plain_app_is_warned_then_killed_after_the_grace_period() -> None:
    clock = FakeClock()
    core = cluster(clock)
    p = submit(core, queue="a")
    claims = launch_and_register(core, p)
    r = core.allocate(claims, api.AllocateRequest(response_id=0, asks=[ask(1, 6)]))
    r = core.allocate(claims, api.AllocateRequest(response_id=r.response_id))
    assert sum(1 for c in core.containers.values() if c.app_id == p and not c.is_am) == 6
    b = submit_ps(core, "b", workers=2, servers=1)
    run_policy(core, StaticPolicy())
    r = core.allocate(claims, api.AllocateRequest(response_id=r.response_id))
    assert r.preemption is not None and len(r.preemption.containers) == 3
    assert r.preemption.deadline_ms == int((clock() + 5.0) * 1000)
    named = [c.container_id for c in r.preemption.containers]
    ams = [c.container_id for c in core.containers.values() if c.is_am]
    assert ams and am_named([PreemptionWarning(tuple(ContainerView(c.container_id, c.resource, 0.0)
                                                     for c in r.preemption.containers), 0.0, "")], ams) == []
    clock.advance(4.0)
    run_policy(core, StaticPolicy())
    assert all(c in core.containers for c in named)         # the grace period is not over
    clock.advance(1.0)
    run_policy(core, StaticPolicy())
    r = core.allocate(claims, api.AllocateRequest(response_id=r.response_id))
    killed = {s.container_id: s for s in r.completed}
    assert set(killed) == set(named) and all(s.exit_status == ExitStatus.PREEMPTED for s in killed.values())
    assert all(s.diagnostics == PREEMPTED_DIAGNOSTICS for s in killed.values()) and r.preemption is None
    view = app_json(core, core.apps[p])
    assert view["numNonAMContainerPreempted"] == 3 and "killed for another queue" in view["diagnostics"]
    nm_confirms(core, named)
    assert core.attempts[core.apps[b].current_attempt or ""].am_container_id != ""


def test_containers_running_on_an_unhealthy_node_are_no_reason_to_reclaim() -> None:
    """One queue holds most of the cluster and a node turns unhealthy: its containers go on
    (docs/operating.md), so they count in the cluster's total -- without them the queue's usage
    was more than the total, and the reclaim warned and then killed containers with no other
    queue there to give them to."""
    clock = FakeClock()
    core = cluster(clock, queues=[QueueConfig("default", 100.0, 100.0)])
    p = submit(core, queue="default")
    claims = launch_and_register(core, p)
    r = core.allocate(claims, api.AllocateRequest(response_id=0, asks=[ask(1, 6)]))
    r = core.allocate(claims, api.AllocateRequest(response_id=r.response_id))
    held = {c.container_id for c in core.containers.values() if c.app_id == p}
    assert len(held) == 7
    heartbeat(core, NODES[1], healthy=False)
    assert core.nodes.total == Resource(4096, 4) + core.nodes.nodes[NODES[1]].used
    for _ in range(8):                   # past the grace period (5 s) many times over
        run_policy(core, StaticPolicy())
        r = core.allocate(claims, api.AllocateRequest(response_id=r.response_id))
        assert r.preemption is None and not r.completed
        clock.advance(2.0)
    assert {c.container_id for c in core.containers.values() if c.app_id == p} == held
    assert core.apps[p].preemption.killed == 0 and core.reclaim_book.targets == {}


def test_a_queue_that_opted_out_is_left_alone() -> None:
    clock = FakeClock()
    core = cluster(clock, queues=[QueueConfig("a", 50.0, 100.0, disable_preemption=True), QueueConfig("b", 50.0, 100.0)])
    a, am_a = grown_job(core)
    submit_ps(core, "b", workers=2, servers=1)
    for _ in range(3):
        run_policy(core, StaticPolicy())
        clock.advance(10.0)
    assert am_a.allocate().shape_directive is None and core.reclaim_book.targets == {}
    assert core.apps[a].preemption.non_am_containers == 0


def test_preemption_off_reclaims_nothing() -> None:
    clock = FakeClock()
    core = cluster(clock, preemption="off")
    _, am_a = grown_job(core)
    submit_ps(core, "b", workers=2, servers=1)
    run_policy(core, StaticPolicy())
    assert am_a.allocate().shape_directive is None


@pytest.mark.parametrize("key, value", [("preemption_max_ignored_over_capacity", 1.5),
                                        ("preemption_max_ignored_over_capacity", -0.1),
                                        ("preemption_natural_termination_factor", 0.0),
                                        ("preemption_natural_termination_factor", 2.0),
                                        ("preemption_max_wait_before_kill_s", -1.0),
                                        ("preemption_hold_rounds", -1)])
def test_out_of_range_settings_stop_the_rm_naming_them(tmp_path: Any, key: str, value: float) -> None:
    path = tmp_path / "rm.toml"
    path.write_text(f"[rm]\n{key} = {value}\n")
    with pytest.raises(ConfigError, match=key):
        load_rm(str(path))
    with pytest.raises(ValueError, match=key):
        RMConfig(**{key: value})       # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(policies.known()))
def test_the_reclaim_runs_with_every_policy(name: str) -> None:
    """Whatever the policy decides, the round computes the queues' shares, keeps the book's
    invariants, and never leaves queue a's job directed above what b is owed."""
    clock = FakeClock()
    core = cluster(clock, policy=name)
    policy = policies.create(name, core.cfg)
    a, am_a = grown_job(core)
    submit_ps(core, "b", workers=2, servers=1, min_workers=1, min_servers=1)
    run_policy(core, policy)
    assert core.queue_shares["b"].ideal == Resource(4096, 4)
    assert check_book(core.reclaim_book, reclaim_inputs(core, build_snapshot(core))) == []
    d = core.apps[a].directive
    if d is not None and d.run_state.value == "run":
        assert d.workers + d.servers <= 3, d        # b is owed 4 of 8: a's job keeps at most 3 + its AM


def test_once_queue_b_is_done_the_shrunk_job_gets_its_shape_back_after_the_hold() -> None:
    clock = FakeClock()
    core = cluster(clock)
    a, am_a = grown_job(core)
    b = submit_ps(core, "b", workers=2, servers=1, min_workers=1, min_servers=1)
    run_policy(core, StaticPolicy())
    d = am_a.allocate().shape_directive
    assert d is not None
    nm_confirms(core, am_a.obey(d))
    clock.advance(1.0)
    run_policy(core, StaticPolicy())                 # the shrink is counted done
    core.kill(b)
    nm_confirms(core, [c.container_id for c in list(core.containers.values()) if c.app_id == b] +
                [cid for n in NODES for cid in list(core.nodes.nodes[n].releasing)])
    versions = []
    for _ in range(4):                               # preemption_hold_rounds = 3
        clock.advance(1.0)
        run_policy(core, StaticPolicy())
        versions.append(core.apps[a].directive_version)
    assert versions[0] == versions[1] and versions[-1] == versions[0] + 1, versions
    back = core.apps[a].directive
    assert back is not None and (back.workers, back.servers) == (5, 1) and back.reason.startswith("queue restore")
    assert "given back its shape, 5 workers + 1 servers" in app_json(core, core.apps[a])["diagnostics"]
