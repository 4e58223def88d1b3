"""The `harmony` policy honours a job's min / max workers and servers (one of each per node of its
group): in a scripted world (tests/support/harmony_world.py), the nodes a job is told to run on stay
within max(min_workers, min_servers) .. min(max_workers, max_servers), profiling included."""
from __future__ import annotations

from protocol.internal_api import RunState
from rm.policies import HarmonyPolicy

from harmony_world import World


def nodes_told(w: World, app_id: str) -> int:
    d = w.apps[app_id].directive
    return 0 if d is None or d.run_state is RunState.PAUSE else len(d.placement)


def within_bounds(w: World, p: HarmonyPolicy) -> bool:
    """Every job told to run runs on a node count its bounds admit."""
    info = p.describe()
    for app_id, app in w.apps.items():
        m = nodes_told(w, app_id)
        if app.state != "RUNNING" or m == 0 or app_id not in info:
            continue
        lo, hi = info[app_id]["minNodes"], info[app_id]["maxNodes"]
        assert isinstance(lo, int) and (hi is None or isinstance(hi, int))
        if m < lo or (hi is not None and m > hi):
            return False
    return True


def test_a_job_capped_at_one_worker_is_never_grouped_on_more_nodes_even_where_the_model_gains():
    # COMP-heavy, little COMM: alone on the cluster it gets all 4 nodes (COMP parallelises).
    w, p = World(4), HarmonyPolicy()
    w.submit("a", 16.0, 0.5)
    for _ in range(4):
        w.step(p)
    assert nodes_told(w, "a") == 4
    # The same job asking max_workers 1 stays on one node; the other nodes stay idle.
    w, p = World(4), HarmonyPolicy()
    w.submit("a", 16.0, 0.5, max_workers=1)
    for _ in range(4):
        w.step(p)
        assert nodes_told(w, "a") == 1
    assert p.describe()["a"]["state"] == "running"
    # With partners arriving and leaving, it is only ever in a one-node group.
    for app_id, (cpu, net) in {"b": (1.0, 1.8), "c": (6.0, 0.6), "d": (0.8, 2.0)}.items():
        w.submit(app_id, cpu, net)
    for i in range(12):
        if i == 6:
            w.finish("b")
        w.step(p)
        assert nodes_told(w, "a") <= 1 and within_bounds(w, p)


def test_a_job_with_two_workers_at_least_is_profiled_on_two_nodes_and_grouped_on_two_or_more():
    w, p = World(4), HarmonyPolicy()
    w.submit("a", 8.0, 1.0, workers=2, min_workers=2)
    w.submit("b", 1.0, 1.8)
    d = w.step(p)
    assert p.describe()["a"]["state"] == "profiling"
    assert len(d.jobs["a"].placement) == 2 and (d.jobs["a"].workers, d.jobs["a"].servers) == (2, 2)
    assert all((pl.workers, pl.servers) == (1, 1) for pl in d.jobs["a"].placement)
    assert len(d.jobs["b"].placement) == 1
    for _ in range(6):
        w.step(p)
        assert within_bounds(w, p)
    assert p.describe()["a"]["state"] == "running" and nodes_told(w, "a") >= 2
    # Its profile is per machine: measured on 2 workers, COMP normalised to one machine.
    assert p.describe()["a"]["tCpu1"] == 8.0


def test_no_node_is_borrowed_for_profiling_from_a_group_at_a_members_minimum():
    w, p = World(3), HarmonyPolicy()
    w.submit("a", 8.0, 1.0, workers=3, min_workers=3)
    for _ in range(3):
        w.step(p)
    assert p.describe()["a"]["state"] == "running" and nodes_told(w, "a") == 3
    w.submit("c", 1.0, 1.8)
    for _ in range(3):
        w.step(p)
        assert nodes_told(w, "a") == 3
    info = p.describe()["c"]
    assert info["state"] == "waiting" and "waits for a node to be profiled on" in str(info["note"])
    # Without the minimum the group lends its last node (the paper's rule).
    w, p = World(3), HarmonyPolicy()
    w.submit("a", 8.0, 1.0)
    for _ in range(3):
        w.step(p)
    w.submit("c", 1.0, 1.8)
    w.step(p)
    assert p.describe()["c"]["state"] == "profiling" and nodes_told(w, "a") == 2


def test_a_group_keeps_a_members_minimum_when_partners_leave_or_a_node_is_lost():
    # a is COMM-heavy: more machines barely help it, so unbounded it would get one node.
    w, p = World(4), HarmonyPolicy()
    w.submit("a", 1.0, 2.0, workers=3, min_workers=3)
    for app_id, (cpu, net) in {"b": (8.0, 1.0), "c": (6.0, 0.6), "d": (0.8, 2.0)}.items():
        w.submit(app_id, cpu, net)
    for i in range(14):
        if i in (4, 8):
            w.finish("b" if i == 4 else "c")
        w.step(p)
        assert within_bounds(w, p)
    assert p.describe()["a"]["state"] == "running" and nodes_told(w, "a") >= 3
    # Lost nodes leave a's group with 2: a waits, paused, rather than running on 2.
    group = sorted(w.apps["a"].directive.nodes)
    w.nodes = [n for n in w.nodes if n.node_id not in group[2:]]
    w.step(p)
    info = p.describe()["a"]
    assert info["state"] == "paused" and "needs 3" in str(info["note"]) and nodes_told(w, "a") == 0


def test_a_job_no_group_size_can_suit_waits_with_a_note_and_is_never_run():
    w, p = World(4), HarmonyPolicy()
    w.submit("big", 8.0, 1.0, workers=5, min_workers=5)                              # 5 of 4 nodes
    w.submit("odd", 8.0, 1.0, workers=2, max_workers=2, servers=3, min_servers=3)   # at least 3, at most 2
    w.submit("b", 1.0, 1.8)
    for _ in range(5):
        w.step(p)
        assert nodes_told(w, "big") == 0 and nodes_told(w, "odd") == 0
    info = p.describe()
    assert info["big"]["state"] == "waiting" and "needs at least 5 nodes" in str(info["big"]["note"])
    assert info["odd"]["state"] == "waiting" and "admits no node count" in str(info["odd"]["note"])
    assert w.apps["big"].directive.run_state is RunState.PAUSE
    # The others are not held up by them.
    assert info["b"]["state"] == "running"
