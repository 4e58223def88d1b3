"""`--policy optimus` inside a ResourceManager (in-process, fake clock) with two live PS jobs: the job
whose loss curve and speed are known grows into the free nodes with a Theorem-1 placement, the
directive reaches its AM once, the AM's asks on the named nodes are granted there, and once the job
reports the new shape the policy leaves it be; the job with no speed measured yet keeps its shape."""
from __future__ import annotations

from collections import Counter

from protocol import internal_api as api
from protocol.job_report import EpochObjective, JobReport
from protocol.records import Resource
from rm.__main__ import load_configs, parse_args
from rm.model import AmSpec
from rm.policies import OptimusPolicy
from rm.policies.optimus import SCHEDULING_INTERVAL_S
from rm.policy_runner import run_policy
from rm.server import ResourceManagerServer
from rm_testing import FakeClock, ask, launch_and_register, ps_spec, register

E = Resource(1024, 1)


def submit_ps(core, workers: int, servers: int, most: int, name: str) -> str:
    app_id = core.new_application()
    spec = {"app": "mlr", "workers": workers, "servers": servers, "max_workers": most, "max_servers": most,
            "executor_memory_mb": 1024, "executor_vcores": 1, "max_epochs": 200, "convergence_threshold": 1e-3}
    core.submit(app_id, "alice", name, "default", "ELASTANE_PS", AmSpec(["true"], {}, {}, Resource(1024, 1)),
                1, ps_job=ps_spec(spec))
    core.app_saved(app_id)
    return app_id


def report(workers: int, servers: int, epochs: int, version: int = 0, changing: bool = False) -> JobReport:
    losses = [1.0 / (0.2 * (e + 1) + 1.0) + 0.05 for e in range(epochs)]
    return JobReport(workers=workers, servers=servers, started=True, changing=changing, iterations=20 * epochs,
                     early_feedback=True, early_feedback_iterations=10, speed=2.0, speed_iterations=20,
                     executor_resource=E, directive_version=version, phase="TRAINING",
                     epoch=epochs - 1, epoch_time_s=3.0, epoch_times=[3.0] * min(epochs, 20), initial_objective=1.05,
                     objectives=[EpochObjective(e, o) for e, o in enumerate(losses)])


def start(core, app_id: str, workers: int, servers: int) -> tuple[dict, int]:
    claims = launch_and_register(core, app_id)
    r = core.allocate(claims, api.AllocateRequest(response_id=0, asks=[ask(1, workers, tag="worker"),
                                                                       ask(2, servers, tag="server")]))
    assert len(r.allocated) == workers + servers
    return claims, r.response_id


async def test_optimus_grows_the_fitted_job_onto_named_nodes_and_leaves_the_other_alone(tmp_path):
    (tmp_path / "cluster.toml").write_text('[cluster]\nsecret = "test-secret-0123456789"\n')
    cfg, cluster = load_configs(parse_args(["--policy", "optimus", "--state-dir", str(tmp_path / "rm"),
                                            "--cluster-config", str(tmp_path / "cluster.toml")]))
    clock = FakeClock()
    rm = ResourceManagerServer(cfg, cluster, clock=clock, run_timers=False)
    core = rm.core
    try:
        assert isinstance(rm.policy, OptimusPolicy)
        for n in ("n1:1", "n2:1", "n3:1"):
            register(core, n, mem=4 * 1024, vcores=4)

        # A: 1 worker + 1 server, may grow to 4 + 4, 12 epochs trained (a loss curve and speed samples).
        a = submit_ps(core, 1, 1, 4, "A")
        a_claims, a_rid = start(core, a, 1, 1)
        # B: 1 + 1 too, just started: no epoch and no speed measured yet, it keeps the shape it asked for.
        b = submit_ps(core, 1, 1, 4, "B")
        b_claims, b_rid = start(core, b, 1, 1)
        r = core.allocate(a_claims, api.AllocateRequest(response_id=a_rid, shape=report(1, 1, epochs=12)))
        a_rid = r.response_id
        rb = core.allocate(b_claims, api.AllocateRequest(response_id=b_rid, shape=JobReport(
            workers=1, servers=1, started=True, executor_resource=E, phase="TRAINING", initial_objective=1.05)))
        b_rid = rb.response_id

        assert run_policy(core, rm.policy) == 1
        assert core.apps[b].directive is None
        d = core.apps[a].directive
        assert d is not None and d.version == 1 and "optimus" in d.reason
        assert (d.workers, d.servers) != (1, 1) and d.workers + d.servers <= 12 - 4    # two AMs, B's two executors
        # Theorem 1: the fewest nodes, workers and servers split evenly over them.
        counts = [(p.workers, p.servers) for p in d.placement]
        assert sum(w for w, _ in counts) == d.workers and sum(s for _, s in counts) == d.servers
        assert max(w for w, _ in counts) - min(w for w, _ in counts) <= 1
        assert max(s for _, s in counts) - min(s for _, s in counts) <= 1

        # The directive reaches A's AM once.
        r = core.allocate(a_claims, api.AllocateRequest(response_id=a_rid, shape=report(1, 1, epochs=12)))
        a_rid = r.response_id
        got = r.shape_directive
        assert got is not None and got.version == 1 and got.placement == d.placement
        assert run_policy(core, rm.policy) == 0

        # The AM carries it out: on each named node it asks for what the placement wants there beyond
        # what it has, on exactly that node; executors elsewhere would move (none here: the placement
        # credits the job's own executors where they are).
        on = Counter(c.node_id for c in core.containers.values() if c.app_id == a and not c.is_am)
        wanted = {p.node: p.workers + p.servers for p in got.placement}
        assert all(n in wanted for n in on)
        asks = [ask(10 + i, wanted[n] - on[n], nodes=[n], relax_locality=False, tag="exec")
                for i, n in enumerate(sorted(wanted)) if wanted[n] > on[n]]
        r = core.allocate(a_claims, api.AllocateRequest(response_id=a_rid, asks=asks,
                                                        shape=report(1, 1, epochs=12, version=1, changing=True)))
        a_rid = r.response_id
        granted = list(r.allocated)
        assert len(granted) == sum(x.count for x in asks)
        assert granted and all(c.node_id in got.nodes for c in granted)
        assert run_policy(core, rm.policy) == 0          # a change in flight is not redirected

        # Done: A reports the new shape; the policy has nothing new to say to either job.
        r = core.allocate(a_claims, api.AllocateRequest(response_id=a_rid,
                                                        shape=report(got.workers, got.servers, epochs=13, version=1)))
        assert r.shape_directive is None
        clock.advance(SCHEDULING_INTERVAL_S)              # the next scheduling round
        assert run_policy(core, rm.policy) == 0
        assert core.apps[b].directive is None
    finally:
        rm.store.close()
