"""Capacity scheduler: queue shares, DRF between users, FIFO, AM-first, locality, normalisation."""
from __future__ import annotations

import pytest

from protocol import internal_api as api
from protocol.config import QueueConfig, RMConfig
from protocol.records import Resource
from rm.nodes import NodeTracker
from rm.scheduler import AM_ASK_ID, AskError, CapacityScheduler


def setup(nodes: dict[str, tuple[int, int]], queues=None, **kw) -> tuple[CapacityScheduler, NodeTracker]:
    tracker = NodeTracker(expiry_s=10)
    for nid, (mem, vc) in nodes.items():
        tracker.register(nid, nid, Resource(mem, vc), "/r", "", 0.0)
    cfg = RMConfig(queues=queues or [QueueConfig("default")], **kw)
    return CapacityScheduler(cfg, tracker.lookup, lambda: tracker.total), tracker


def asks(s: CapacityScheduler, app_id: str, *rows: api.ResourceAsk) -> None:
    s.update_asks(app_id, s.validate_asks(rows), {})


def ask(ask_id: int, count: int, mem: int = 1024, vc: int = 1, **kw) -> api.ResourceAsk:
    return api.ResourceAsk(ask_id=ask_id, count=count, resource=Resource(mem, vc), **kw)


def test_normalisation_and_limits():
    s, _ = setup({}, minimum_allocation_mb=256, maximum_allocation_mb=4096, maximum_allocation_vcores=4)
    assert s.normalize(Resource(300, 1)) == Resource(512, 1)
    assert s.normalize(Resource(4096, 4)) == Resource(4096, 4)
    with pytest.raises(AskError, match="exceeds the maximum"):
        s.normalize(Resource(4097, 1))
    with pytest.raises(AskError, match="vCores"):
        s.normalize(Resource(512, 5))
    with pytest.raises(AskError, match="memory must be positive"):
        s.normalize(Resource(0, 1))
    with pytest.raises(AskError, match=r"asks\[0\].count"):
        s.validate_asks([ask(1, -1)])


def test_am_containers_first_then_fifo():
    s, t = setup({"n:1": (4096, 4)})
    s.add_app("a1", "default", "u", 1)
    s.add_app("a2", "default", "u", 2)
    asks(s, "a1", ask(1, 10))
    s.request_am("a2", Resource(1024, 1))
    out = s.allocate(t.schedulable())
    assert [(a.app_id, a.ask_id) for a in out] == [("a2", AM_ASK_ID), ("a1", 1), ("a1", 1), ("a1", 1)]
    assert s.apps["a1"].asks[1].count == 7
    assert t.get("n:1").used == Resource(4096, 4)


def test_fifo_within_a_user():
    s, t = setup({"n:1": (3072, 8)})
    s.add_app("late", "default", "u", 2)
    s.add_app("early", "default", "u", 1)
    asks(s, "late", ask(1, 5))
    asks(s, "early", ask(1, 2))
    out = s.allocate(t.schedulable())
    assert [a.app_id for a in out] == ["early", "early", "late"]


def test_drf_between_users():
    # alice already holds memory-heavy containers; bob holds nothing, so bob goes first.
    s, t = setup({"n:1": (10240, 10)})
    s.add_app("a", "default", "alice", 1)
    s.add_app("b", "default", "bob", 2)
    asks(s, "a", ask(1, 1, 4096, 1))
    s.allocate(t.schedulable())
    asks(s, "a", ask(1, 3, 1024, 1))
    asks(s, "b", ask(1, 3, 1024, 1))
    out = s.allocate(t.schedulable())
    order = [a.app_id for a in out]
    # bob catches up to alice's dominant share (0.4) before alice gets more.
    assert order[:3] == ["b", "b", "b"] and order[3:] == ["a", "a", "a"]


def test_queue_furthest_below_guarantee_goes_first_and_max_capacity_caps():
    qs = [QueueConfig("prod", 75, 100), QueueConfig("dev", 25, 50)]
    s, t = setup({"n:1": (8192, 8)}, queues=qs)
    s.add_app("p", "prod", "u", 1)
    s.add_app("d", "dev", "u", 2)
    asks(s, "p", ask(1, 100))
    asks(s, "d", ask(1, 100))
    out = s.allocate(t.schedulable())
    used = {"p": 0, "d": 0}
    for a in out:
        used[a.app_id] += 1
    assert used == {"p": 6, "d": 2}          # shares 75% / 25%
    # dev alone may grow to its 50% ceiling, not beyond.
    s.remove_app("p")
    s.release("p", "prod", "u", t.get("n:1"), Resource(6 * 1024, 6))
    out = s.allocate(t.schedulable())
    assert len(out) == 2 and s.queues["dev"].used == Resource(4096, 4)
    assert s.headroom("d") == Resource(0, 0)


def test_locality_preference_and_strict():
    s, t = setup({"a:1": (2048, 2), "b:1": (2048, 2)})
    s.add_app("x", "default", "u", 1)
    asks(s, "x", ask(1, 1, nodes=["b:1"]))
    # A pass over node a only waits for b, which has room.
    assert s.allocate([t.get("a:1")]) == []
    out = s.allocate(t.schedulable())
    assert [a.node_id for a in out] == ["b:1"]
    asks(s, "x", ask(2, 3, nodes=["b"], relax_locality=False))   # by host name, strict
    out = s.allocate(t.schedulable())
    assert [a.node_id for a in out] == ["b:1"]                 # b is full now; nothing on a
    assert s.apps["x"].asks[2].count == 2
    asks(s, "x", ask(3, 1, nodes=["b:1"]))                      # relaxed, b full -> a
    out = s.allocate(t.schedulable())
    assert [a.node_id for a in out] == ["a:1"]


def test_undelivered_containers_count_against_a_resent_ask():
    s, t = setup({"n:1": (8192, 8)})
    s.add_app("x", "default", "u", 1)
    asks(s, "x", ask(1, 2))
    assert len(s.allocate(t.schedulable())) == 2
    s.update_asks("x", s.validate_asks([ask(1, 2)]), {1: 2})
    assert not s.has_demand and s.allocate(t.schedulable()) == []


def test_idle_pass_is_a_no_op():
    s, t = setup({"n:1": (8192, 8)})
    s.add_app("x", "default", "u", 1)
    assert not s.has_demand and s.allocate(t.schedulable()) == []
