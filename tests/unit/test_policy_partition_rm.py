"""`--policy dorm | drf | tetris` inside a ResourceManager (in-process, fake clock), end to end
through the RM's allocate protocol: a running PS job is grown into the free cluster, then a second
job arrives and the policy shrinks the first; each directive reaches the job's AM once in its
allocate response, with a placement, and the AM (a stand-in that does what the PS AM's directive
handler does: release executors off the named nodes, ask for the missing ones on them) carries it
out -- the RM grants the new executors on exactly the placement's nodes and the second job's AM
gets the room the shrink freed."""
from __future__ import annotations

from typing import Any, Optional

import pytest

from protocol import internal_api as api
from protocol.job_report import JobReport
from protocol.records import Resource
from rm.__main__ import load_configs, parse_args
from rm.core import ResourceManagerCore
from rm.model import AmSpec
from rm.policies import DormPolicy, DrfPolicy, TetrisPolicy
from rm.policy_runner import run_policy
from rm.server import ResourceManagerServer
from rm_testing import FakeClock, heartbeat, launch_and_register, ps_spec, register

E = Resource(1024, 1)


def submit_ps(core: ResourceManagerCore, name: str, **spec: Any) -> str:
    app_id = core.new_application()
    ps = {"app": "mlr", "executor_memory_mb": 1024, "executor_vcores": 1, "elastic_mode": "kill", **spec}
    core.submit(app_id, "alice", name, "default", "ELASTANE_PS", AmSpec(["true"], {}, {}, Resource(1024, 1)),
                1, ps_job=ps_spec(ps))
    core.app_saved(app_id)
    return app_id


class StandInAm:
    """What a PS AM does on the allocate protocol, scripted: ask for its executors, report its shape,
    obey a directive's placement (removals first, then additions on the named nodes only)."""

    def __init__(self, core: ResourceManagerCore, app_id: str):
        self.core = core
        self.app_id = app_id
        self.claims = launch_and_register(core, app_id)
        self.response_id = 0
        self.held: dict[str, tuple[str, str]] = {}       # container id -> (node, role)
        self.next_ask = 1
        self.directives: list[api.ShapeDirective] = []

    def allocate(self, asks: Optional[list[api.ResourceAsk]] = None, releases: Optional[list[str]] = None) -> None:
        r = self.core.allocate(self.claims, api.AllocateRequest(response_id=self.response_id, asks=asks or [],
                                                                releases=releases or [], shape=self.report()))
        self.response_id = r.response_id
        for c in r.allocated:
            self.held[c.container_id] = (c.node_id, c.tag)
        if r.shape_directive is not None:
            self.directives.append(r.shape_directive)

    def ask(self, role: str, count: int, nodes: tuple[str, ...] = ()) -> api.ResourceAsk:
        self.next_ask += 1
        return api.ResourceAsk(ask_id=self.next_ask, count=count, resource=E, tag=role, nodes=list(nodes),
                               relax_locality=not nodes)

    def count(self, role: str) -> int:
        return sum(1 for _, r in self.held.values() if r == role)

    def report(self) -> JobReport:
        w, s = self.count("worker"), self.count("server")
        return JobReport(workers=w, servers=s, started=w > 0 and s > 0,
                         iterations=200, early_feedback=True, early_feedback_iterations=100, speed=1.0,
                         speed_iterations=50, executor_resource=E)

    def obey(self, d: api.ShapeDirective) -> list[str]:
        """Carry out `d`; returns the containers released (their NMs must report them gone)."""
        want = {(p.node, role): n for p in d.placement for role, n in (("worker", p.workers), ("server", p.servers))}
        released: list[str] = []
        have: dict[tuple[str, str], list[str]] = {}
        for cid, key in sorted(self.held.items()):
            have.setdefault(key, []).append(cid)
        for key, cids in have.items():
            released += cids[want.get(key, 0):]
        for cid in released:
            del self.held[cid]
        asks = [self.ask(role, n - len(have.get((node, role), [])), (node,))
                for (node, role), n in sorted(want.items()) if n > len(have.get((node, role), []))]
        self.allocate(asks=asks, releases=released)
        return released

    def placement(self) -> dict[str, tuple[int, int]]:
        out: dict[str, list[int]] = {}
        for node, role in self.held.values():
            out.setdefault(node, [0, 0])[0 if role == "worker" else 1] += 1
        return {n: (w, s) for n, (w, s) in sorted(out.items())}


def complete(core: ResourceManagerCore, released: list[str], nodes: tuple[str, ...]) -> None:
    gone = set(released)
    for n in nodes:
        node = core.nodes.get(n)
        mine = [cid for cid in gone if node is not None and cid in node.releasing]
        heartbeat(core, n, [api.ContainerStatus(container_id=cid, state="COMPLETE", exit_status=-105) for cid in mine])


@pytest.mark.parametrize("name, cls", [("dorm", DormPolicy), ("drf", DrfPolicy), ("tetris", TetrisPolicy)])
async def test_policy_grows_then_shrinks_a_live_job_for_an_arriving_one(tmp_path, name: str, cls: type) -> None:
    (tmp_path / "cluster.toml").write_text('[cluster]\nsecret = "test-secret-0123456789"\n')
    cfg, cluster = load_configs(parse_args(["--policy", name, "--state-dir", str(tmp_path / "rm"),
                                            "--cluster-config", str(tmp_path / "cluster.toml")]))
    rm = ResourceManagerServer(cfg, cluster, clock=FakeClock(), run_timers=False)
    core = rm.core
    nodes = ("n1:1", "n2:1")
    try:
        assert isinstance(rm.policy, cls)
        for n in nodes:
            register(core, n, mem=3 * 1024, vcores=3)

        # Job A starts with 1 worker + 1 server; it may grow to 2 + 2.
        a = submit_ps(core, "A", workers=1, servers=1, max_workers=2, max_servers=2)
        am_a = StandInAm(core, a)
        am_a.allocate(asks=[am_a.ask("worker", 1), am_a.ask("server", 1)])
        assert (am_a.count("worker"), am_a.count("server")) == (1, 1)
        am_a.allocate()

        # The cluster has room (6 slots: A's AM and 2 executors): the policy grows A to its maximum.
        assert run_policy(core, rm.policy) == 1
        am_a.allocate()
        assert len(am_a.directives) == 1
        grow = am_a.directives[0]
        assert (grow.workers, grow.servers, grow.version) == (2, 2, 1) and grow.placement
        assert grow.reason.startswith(name + ":")
        am_a.obey(grow)
        assert am_a.placement() == {p.node: (p.workers, p.servers) for p in grow.placement if p.workers + p.servers}
        am_a.allocate()
        assert len(am_a.directives) == 1                 # delivered once
        assert run_policy(core, rm.policy) == 0          # nothing changed: no new directive

        # Job B (1 + 1) arrives: it needs its AM and two executors, one slot is free: A shrinks.
        b = submit_ps(core, "B", workers=1, servers=1)
        assert core.apps[b].state.value == "ACCEPTED"
        assert run_policy(core, rm.policy) == 1
        am_a.allocate()
        shrink = am_a.directives[-1]
        assert shrink.version == 2 and shrink.workers + shrink.servers < 4 and shrink.workers >= 1
        released = am_a.obey(shrink)
        assert released
        complete(core, released, nodes)
        assert any(c.app_id == b and c.is_am for c in core.containers.values())   # B's AM got the room
        am_b = StandInAm(core, b)
        am_b.allocate(asks=[am_b.ask("worker", 1), am_b.ask("server", 1)])
        assert (am_b.count("worker"), am_b.count("server")) == (1, 1)
        am_b.allocate()
        am_a.allocate()
        assert am_a.placement() == {p.node: (p.workers, p.servers) for p in shrink.placement if p.workers + p.servers}
        # Both run; nothing fits any more and nothing changes.
        assert run_policy(core, rm.policy) == 0
        used = sum(n.used.vcores for n in core.nodes)
        assert used <= 6
    finally:
        rm.store.close()
