"""The policies' state across an RM restart or failover (issue 37 part 5), in-process with a fake
clock: scripted PS AMs run under `optimus`, `dorm`, `harmony`, `drf` and `eps` until the policy's decisions
are steady; the RM is replaced by a new one recovering from the same SQLite state store (what a
new active RM does on etcd); the NMs re-register with the containers they run and the AMs register
again and report. The new RM's policy rounds wait until they have, and its first 3 rounds reshape
no job (`reshapes_after_failover` 0) -- unless the cluster changed: a node that does not come back
is a reshape the metric counts. Dropping the stored policy state shows the metric catches a policy
that forgot."""
from __future__ import annotations

import sqlite3
from typing import Optional

import pytest

from protocol import internal_api as api
from protocol.internal_api import RunState
from protocol.job_report import EpochObjective, JobReport, WorkerTiming
from protocol.records import ContainerState, Resource
from protocol.remote_exception import ApplicationMasterNotRegistered
from rm.__main__ import load_configs, parse_args
from rm.core import ResourceManagerCore
from rm.model import AmSpec
from rm.policies import OptimusPolicy, describe
from rm.policies.optimus import SCHEDULING_INTERVAL_S
from rm.policy_resync import WINDOW, PolicyResync
from rm.prometheus import render
from rm.rest_views import cluster_info
from rm.server import ResourceManagerServer
from rm_testing import FakeClock, am_claims, heartbeat, nm_claims, ps_spec
from test_policy_optimus import app, report, snapshot

E = Resource(1024, 1)
NODES = ("n1:1", "n2:1", "n3:1")
NODE = Resource(6 * 1024, 6)
ROUND_S = 31.0          # past Optimus's scheduling interval: every round is a full one
# Per job: (COMP on one machine, COMM) for Harmony; workers/servers bounds for the others.
PROFILES = {"A": (8.0, 1.0), "B": (1.0, 1.8), "C": (6.0, 0.6)}


def new_rm(tmp_path, policy: str, clock: FakeClock) -> ResourceManagerServer:
    (tmp_path / "cluster.toml").write_text('[cluster]\nsecret = "test-secret-0123456789"\n')
    cfg, cluster = load_configs(parse_args(["--policy", policy, "--state-dir", str(tmp_path / "rm"),
                                            "--cluster-config", str(tmp_path / "cluster.toml")]))
    return ResourceManagerServer(cfg, cluster, clock=clock, run_timers=False)


def submit_ps(core: ResourceManagerCore, name: str, policy: str) -> str:
    app_id = core.new_application()
    spec: dict[str, object] = {"app": "mlr", "workers": 1, "servers": 1, "executor_memory_mb": 1024,
                               "executor_vcores": 1}
    if policy != "harmony":
        spec.update(max_workers=4, max_servers=4, max_epochs=200, convergence_threshold=1e-3)
    core.submit(app_id, "alice", name, "default", "ELASTANE_PS", AmSpec(["true"], {}, {}, E), 1,
                ps_job=ps_spec(spec))
    core.app_saved(app_id)
    return app_id


class ScriptedAm:
    """A PS AM that carries out each new directive (an older or repeated version it ignores, as the
    real one does): it holds executor containers where the directive places them -- releasing the
    rest, asking for the missing ones on their nodes -- and reports its job on every allocate: epochs
    trained at a speed that depends on its shape and a falling loss (Optimus), its COMP / COMM times
    (Harmony). Until its first directive it runs its submitted 1 worker + 1 server anywhere (under
    Harmony, which places new jobs, it waits for the directive)."""

    def __init__(self, core: ResourceManagerCore, app_id: str, name: str, waits: bool):
        self.core, self.app_id, self.name = core, app_id, name
        for eff in core.take_effects():
            core.am_launched(eff.attempt_id)
        self.claims = am_claims(core, app_id)
        core.am_register(self.claims, api.AmRegisterRequest(tracking_url="http://am:1"))
        self.response_id = 0
        self.directive: Optional[api.ShapeDirective] = None
        self.waits = waits
        self.held: dict[str, tuple[str, str]] = {}      # container id -> (node, role)
        self.ask_ids: dict[tuple[str, str], int] = {}
        self.epochs = 0
        self.iterations = 0
        self.started = False

    def wanted(self) -> dict[tuple[str, str], int]:
        """(node or "" for anywhere, role) -> executors the AM should hold."""
        d = self.directive
        if d is None:
            return {} if self.waits else {("", "worker"): 1, ("", "server"): 1}
        if d.run_state is RunState.PAUSE:
            return {}
        if not d.placement:
            return {("", "worker"): d.workers, ("", "server"): d.servers}
        out: dict[tuple[str, str], int] = {}
        for p in d.placement:
            out[(p.node, "worker")], out[(p.node, "server")] = p.workers, p.servers
        return out

    def table(self) -> tuple[list[str], list[api.ResourceAsk]]:
        """Releases of what it holds beyond the wanted placement, and its whole ask table."""
        want = self.wanted()
        anywhere = any(node == "" for node, _ in want)
        have: dict[tuple[str, str], list[str]] = {}
        for cid, (node, role) in sorted(self.held.items()):
            have.setdefault(("" if anywhere else node, role), []).append(cid)
        releases = [cid for key, cids in have.items() for cid in cids[want.get(key, 0):]]
        size = self.directive.executor_resource if self.directive is not None else None
        size = size or E
        asks = []
        for key in sorted(set(want) | set(self.ask_ids)):
            missing = max(0, want.get(key, 0) - len(have.get(key, [])))
            ask_id = self.ask_ids.setdefault(key, len(self.ask_ids) + 1)
            node, role = key
            asks.append(api.ResourceAsk(ask_id=ask_id, count=missing, resource=size, tag=role,
                                        nodes=[node] if node else [], relax_locality=not node))
        return releases, asks

    def report(self, settled: bool) -> JobReport:
        w = sum(1 for _, role in self.held.values() if role == "worker")
        s = len(self.held) - w
        version = self.directive.version if self.directive is not None and settled else 0
        if w == 0 or s == 0:    # paused, or between shapes (started stays true once training began)
            paused = self.directive is not None and self.directive.run_state is RunState.PAUSE
            return JobReport(workers=w, servers=s, started=self.started or paused, iterations=self.iterations,
                             directive_version=version, paused=paused, changing=not settled)
        self.started = True
        self.epochs += 1
        self.iterations += 20
        t_cpu1, t_net = PROFILES[self.name]
        epoch_time = 2.0 / w + 1.0 / s + 0.3 * w      # best near 3 workers: room left unused
        losses = [1.0 / (0.2 * (e + 1) + 1.0) + 0.05 for e in range(self.epochs)]
        sizes = {self.core.containers[c].resource for c in self.held if c in self.core.containers}
        return JobReport(workers=w, servers=s, started=True, changing=not settled, iterations=self.iterations,
                         early_feedback=True, early_feedback_iterations=10, speed=20.0 / epoch_time,
                         speed_iterations=20, executor_resource=min(sizes, default=E, key=lambda r: r.memory),
                         directive_version=version, phase="TRAINING", epoch=self.epochs - 1,
                         epoch_time_s=epoch_time, epoch_times=[epoch_time] * min(self.epochs, 20),
                         initial_objective=1.05, objectives=[EpochObjective(e, o) for e, o in enumerate(losses)],
                         worker_times=WorkerTiming(compute_s=t_cpu1 / w, comm_s=t_net, workers=w,
                                                   compute_held_s=t_cpu1 / w, comm_held_s=t_net))

    def allocate(self) -> None:
        releases, asks = self.table()
        for cid in releases:
            del self.held[cid]
        settled = not releases and all(a.count == 0 for a in asks)
        r = self.core.allocate(self.claims, api.AllocateRequest(response_id=self.response_id, asks=asks,
                                                                releases=releases, shape=self.report(settled)))
        self.response_id = r.response_id
        by_id = {v: k for k, v in self.ask_ids.items()}
        for c in r.allocated:
            self.held[c.container_id] = (c.node_id, by_id[c.ask_id][1])
        for done in r.completed:
            self.held.pop(done.container_id, None)
        d = r.shape_directive
        if d is not None and (self.directive is None or d.version > self.directive.version):
            self.directive = d

    def fail_over(self, core: ResourceManagerCore) -> None:
        """The RM changed: its first call is refused as not registered, so it registers again and
        allocates with its whole ask table."""
        self.core = core
        with pytest.raises(ApplicationMasterNotRegistered):
            core.allocate(self.claims, api.AllocateRequest(response_id=self.response_id))
        core.am_register(self.claims, api.AmRegisterRequest(tracking_url="http://am:1"))
        self.response_id = 0
        self.allocate()


def statuses(core: ResourceManagerCore, node_id: str) -> list[api.ContainerStatus]:
    """What the NM reports of the containers the RM placed on it (all running)."""
    return [api.ContainerStatus(container_id=c.container_id, state=ContainerState.RUNNING.value,
                                resource=c.resource, role="am" if c.is_am else c.tag)
            for c in core.containers.values() if c.node_id == node_id]


class Cluster:
    """Three NMs, three PS jobs and their scripted AMs under one RM, which can be replaced by a new
    one recovering from the same store."""

    def __init__(self, tmp_path, policy: str):
        self.tmp_path, self.policy = tmp_path, policy
        self.clock = FakeClock()
        self.rm = new_rm(tmp_path, policy, self.clock)
        for n in NODES:
            self.rm.core.register_node(nm_claims(n), api.NodeRegisterRequest(
                node_id=n, http_address=n, capability=NODE))
        self.ams = [ScriptedAm(self.rm.core, submit_ps(self.rm.core, name, policy), name, policy == "harmony")
                    for name in PROFILES]
        self.rm.flush()

    @property
    def core(self) -> ResourceManagerCore:
        return self.rm.core

    async def round(self, nodes: tuple[str, ...] = NODES) -> int:
        """One policy round as the server runs it (decide off the loop, store), then the NMs'
        heartbeats and the AMs' allocates."""
        self.clock.advance(ROUND_S)
        changed = await self.rm.policy_round()
        self.rm.flush()
        for am in self.ams:
            am.allocate()
        for n in nodes:         # the NMs launch what was allocated (and confirm what was released)
            heartbeat(self.core, n, statuses(self.core, n))
        self.rm.flush()
        return changed or 0

    async def steady(self, rounds: int = 16, most: int = 120) -> None:
        """Rounds until `rounds` in a row change no directive. Eight were too few for Optimus: its
        hysteresis keeps a job at a shape until the gain its fits predict passes twice the job's
        measured resize cost, which a few more epochs of samples can make it do later on."""
        quiet = 0
        for _ in range(most):
            quiet = quiet + 1 if await self.round() == 0 else 0
            if quiet >= rounds:
                return
        raise AssertionError(f"{self.policy}: no steady decision in {most} rounds")

    def fail_over(self, back: tuple[str, ...] = NODES, forget_policy: bool = False) -> None:
        """A new RM on the same store; the nodes in `back` re-register with what they run.
        `forget_policy`: the stored policy state is lost first."""
        old = self.rm
        reports = {n: statuses(old.core, n) for n in NODES}
        self.reports = reports
        old.store.close()
        if forget_policy:
            with sqlite3.connect(self.tmp_path / "rm" / "state.db") as db:
                db.execute("DELETE FROM policy")
        self.clock.advance(5)
        self.rm = new_rm(self.tmp_path, self.policy, self.clock)
        self.back = back
        for n in back:
            self.core.register_node(nm_claims(n), api.NodeRegisterRequest(
                node_id=n, http_address=n, capability=NODE, containers=reports[n]))

    def directives(self) -> dict[str, Optional[api.ShapeDirective]]:
        return {am.name: self.core.apps[am.app_id].directive for am in self.ams}

    def close(self) -> None:
        self.rm.store.close()


POLICIES = ["optimus", "dorm", "harmony", "drf", "eps"]


@pytest.mark.parametrize("policy", POLICIES)
async def test_a_new_rm_reshapes_no_job_in_its_first_rounds_when_the_cluster_did_not_change(tmp_path, policy):
    c = Cluster(tmp_path, policy)
    try:
        await c.steady()
        before = c.directives()
        assert any(d is not None for d in before.values()), f"{policy} never directed a job"
        c.fail_over()
        core = c.core
        # What the old RM stored: every job's directive and its version counter.
        assert c.directives() == before
        rs = core.policy_resync
        assert rs is not None and rs.holding
        # The AMs have not registered again: the policy decides nothing yet.
        assert await c.rm.policy_round() == 0
        assert rs.holding and rs.held_rounds == 1
        assert sorted(rs.waiting_for) == sorted(f"the AM of {am.app_id} to register again" for am in c.ams)
        for am in c.ams:
            am.fail_over(core)
        c.rm.flush()
        for _ in range(WINDOW):
            await c.round()
        assert not rs.holding and not rs.cluster_changed and rs.rounds == WINDOW
        assert rs.reshapes == 0 and core.counters["reshapes_after_failover"] == 0
        info = cluster_info(core)["clusterInfo"]
        assert info["policyResync"]["reshapesAfterFailover"] == 0
        assert "elastane_rm_reshapes_after_failover_total 0\n" in render(core)
        assert 'elastane_rm_policy_rounds_total{outcome="held"} 1\n' in render(core)
        for name, d in c.directives().items():
            b = before[name]
            assert d == b or (d is not None and b is not None and d.version > b.version)
    finally:
        c.close()


# `eps` places no executors (its directives name counts only): a lost node reaches it only through
# the jobs' reports, which these scripted AMs do not change.
@pytest.mark.parametrize("policy", ["optimus", "dorm", "harmony", "drf"])
async def test_a_node_that_does_not_come_back_is_a_reshape_the_metric_counts(tmp_path, policy):
    c = Cluster(tmp_path, policy)
    try:
        await c.steady()
        before = c.directives()
        c.fail_over(back=NODES[:2])         # n3 never re-registers
        core = c.core
        for am in c.ams:
            am.fail_over(core)
        rs = core.policy_resync
        assert rs is not None
        assert await c.rm.policy_round() == 0 and rs.waiting_for == ["node n3:1 to register again"]
        # The wait ends at its deadline (the node is as lost as the old RM would have found it).
        for _ in range(WINDOW):
            await c.round(nodes=NODES[:2])
        assert rs.cluster_changed and rs.rounds == WINDOW and "n3:1" in rs.released_why
        assert rs.reshapes > 0 and core.counters["reshapes_after_failover"] == rs.reshapes
        # Versions go on from the stored ones: every new directive is numbered above its old one.
        for name, d in c.directives().items():
            b = before[name]
            if d is not None and b is not None and d != b:
                assert d.version > b.version
    finally:
        c.close()


@pytest.mark.parametrize("policy", ["harmony"])
async def test_without_its_stored_state_the_policy_reshapes_jobs_and_the_metric_says_so(tmp_path, policy):
    c = Cluster(tmp_path, policy)
    try:
        await c.steady()
        c.fail_over(forget_policy=True)
        for am in c.ams:
            am.fail_over(c.core)
        for _ in range(WINDOW):
            await c.round()
        assert c.core.counters["reshapes_after_failover"] > 0
    finally:
        c.close()


async def test_the_policy_state_round_trips_through_the_store_and_versions_follow_the_am(tmp_path):
    c = Cluster(tmp_path, "harmony")
    try:
        await c.steady()
        stored = c.rm.store.load_policy_state()
        assert stored is not None and stored.policy == "harmony" and stored.nodes == list(NODES)
        groups = {(s["state"], s["group"]) for s in describe(c.rm.policy).values()}
        c.fail_over()
        assert {(s["state"], s["group"]) for s in describe(c.rm.policy).values()} == groups
        # An AM that acted on a directive the new RM did not recover moves its counter on.
        am = c.ams[0]
        app = c.core.apps[am.app_id]
        am.fail_over(c.core)
        assert am.directive is not None
        am.directive = api.ShapeDirective(am.directive.workers, am.directive.servers,
                                          version=app.directive_version + 5, placement=am.directive.placement,
                                          nodes=am.directive.nodes, group=am.directive.group,
                                          run_state=am.directive.run_state,
                                          executor_resource=am.directive.executor_resource)
        am.allocate()
        assert app.directive_version == am.directive.version
        c.rm.flush()
        stored_app = next(r for r, _ in c.rm.store.load() if r.app_id == am.app_id)
        assert stored_app.directive_version == am.directive.version
    finally:
        c.close()


@pytest.mark.parametrize("hold", [True, False])
async def test_deciding_before_the_nodes_are_back_would_reshape_jobs_and_the_hold_prevents_it(tmp_path, hold):
    c = Cluster(tmp_path, "drf")
    try:
        await c.steady()
        c.fail_over(back=NODES[:2])         # n3 has not re-registered yet
        for am in c.ams:
            am.fail_over(c.core)
        if not hold:    # an RM that decides at once: a resync with nothing to wait for
            now = c.clock()
            c.core.policy_resync = PolicyResync(now, now, frozenset(), frozenset())
        await c.rm.policy_round()
        c.core.register_node(nm_claims("n3:1"), api.NodeRegisterRequest(
            node_id="n3:1", http_address="n3:1", capability=NODE, containers=c.reports["n3:1"]))
        for _ in range(WINDOW):
            await c.round()
        reshapes = c.core.counters["reshapes_after_failover"]
        assert reshapes == 0 if hold else reshapes > 0
    finally:
        c.close()


def test_a_restored_optimus_decides_as_the_one_that_stored_its_state_and_a_fresh_one_does_not():
    # The policy level: jobs grown by a first round report epochs at their new shapes, slower than
    # at the old one; a policy restored from the state stored after the second round decides every
    # later round exactly as the undisturbed one (and ends in the same state), while one starting
    # afresh -- no speed samples at the old shape, so it cannot know the change made the jobs
    # slower, no record of the reshape -- decides otherwise.
    live = OptimusPolicy()
    first = live.decide(snapshot([app(1, report(2, 2, epochs=10, epoch_time=2.0), most=4),
                                  app(2, report(2, 2, epochs=10, epoch_time=2.0, b0=0.05), most=4)], nodes=3))
    assert len(first) == 2

    def later(k: int):
        return snapshot([app(i, report(jd.workers, jd.servers, epochs=10 + 2 * k, epoch_time=3.0 + 0.1 * i,
                                       directive_version=1, b0=0.3 if i == 1 else 0.05),
                             most=4, directive=jd.directive(1))
                         for i, (_, jd) in enumerate(sorted(first.jobs.items()), 1)],
                        nodes=3, now=k * SCHEDULING_INTERVAL_S)
    live.decide(later(1))
    restored, fresh = OptimusPolicy(), OptimusPolicy()
    restored.restore_state(live.export_state())
    differs = False
    for k in (2, 3, 4):
        snap = later(k)
        want = live.decide(snap)
        assert restored.decide(snap).jobs == want.jobs
        differs = differs or fresh.decide(snap).jobs != want.jobs
    assert restored.export_state() == live.export_state()
    assert differs
