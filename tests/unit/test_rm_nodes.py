"""Node tracker: registration, health, liveness with a fake clock."""
from __future__ import annotations

from protocol.records import NodeState, Resource
from rm.nodes import NodeTracker
from rm_testing import FakeClock


def test_register_heartbeat_expire_and_reregister():
    clock = FakeClock()
    t = NodeTracker(expiry_s=10)
    a = t.register("a:1", "a:2", Resource(1000, 4), "/r1", "", clock())
    b = t.register("b:1", "b:2", Resource(2000, 8), "/r1", "", clock())
    assert t.total == Resource(3000, 12) and [n.node_id for n in t.schedulable()] == ["a:1", "b:1"]
    clock.advance(6)
    t.heartbeat(a, True, "", clock())
    assert t.expired(clock()) == []
    clock.advance(6)                   # b silent for 12 s, a for 6 s
    assert t.expired(clock()) == [b]
    assert b.state == NodeState.LOST and t.total == Resource(1000, 4)
    assert t.expired(clock()) == []    # reported once
    t.register("b:1", "b:2", Resource(500, 2), "/r1", "", clock())
    assert b.state == NodeState.RUNNING and t.total == Resource(1500, 6)


def test_unhealthy_nodes_leave_the_pool_and_come_back():
    clock = FakeClock()
    t = NodeTracker(expiry_s=10)
    a = t.register("a:1", "a:2", Resource(1000, 4), "/r1", "", clock())
    t.heartbeat(a, False, "disk full", clock())
    assert a.state == NodeState.UNHEALTHY and t.total == Resource(0, 0) and t.schedulable() == []
    assert a.health_report == "disk full"
    t.heartbeat(a, True, "", clock())
    assert a.state == NodeState.RUNNING and t.total == Resource(1000, 4)


def test_lookup_by_id_or_host():
    t = NodeTracker(expiry_s=10)
    t.register("h1:1", "h1:2", Resource(1, 1), "/r", "", 0.0)
    t.register("h1:3", "h1:4", Resource(1, 1), "/r", "", 0.0)
    assert [n.node_id for n in t.lookup("h1:3")] == ["h1:3"]
    assert sorted(n.node_id for n in t.lookup("h1")) == ["h1:1", "h1:3"]
    assert t.lookup("nope") == []
