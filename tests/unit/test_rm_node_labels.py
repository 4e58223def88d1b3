"""Node labels (protocol/node_labels.py): exclusive partitions, AMs on the AM label's nodes, config
and registration checks."""
from __future__ import annotations

import re

import msgspec
import pytest

from protocol import internal_api as api
from protocol import node_labels
from protocol.config import ConfigError, NMConfig, QueueConfig, RMConfig, load, load_nm
from protocol.records import Resource
from rm.nodes import NodeTracker
from rm.scheduler import AM_ASK_ID, CapacityScheduler
from rm_testing import make_core, nm_claims

AM = frozenset({"am"})


def setup(nodes: dict[str, tuple[int, int, frozenset[str]]], **kw) -> tuple[CapacityScheduler, NodeTracker]:
    tracker = NodeTracker(expiry_s=10)
    for nid, (mem, vc, labels) in nodes.items():
        tracker.register(nid, nid, Resource(mem, vc), "/r", "", 0.0, labels)
    cfg = RMConfig(queues=[QueueConfig("default")], **kw)
    return CapacityScheduler(cfg, tracker.lookup, lambda: tracker.total), tracker


def asks(s: CapacityScheduler, app_id: str, *rows: api.ResourceAsk) -> None:
    s.update_asks(app_id, s.validate_asks(rows), {})


def ask(ask_id: int, count: int, mem: int = 1024, **kw) -> api.ResourceAsk:
    return api.ResourceAsk(ask_id=ask_id, count=count, resource=Resource(mem, 1), **kw)


# ----- the rule ---------------------------------------------------------------------------------

def test_accepts_is_exclusive():
    assert node_labels.accepts(frozenset(), is_am=False, am_node_label="am")
    assert not node_labels.accepts(AM, is_am=False, am_node_label="am")
    assert node_labels.accepts(AM, is_am=True, am_node_label="am")
    assert not node_labels.accepts(frozenset(), is_am=True, am_node_label="am")
    # No AM label: AMs go where executors go, and a labelled node takes neither.
    assert node_labels.accepts(frozenset(), is_am=True, am_node_label="")
    assert not node_labels.accepts(AM, is_am=True, am_node_label="")


# ----- the scheduler ----------------------------------------------------------------------------

def test_ams_go_to_the_am_label_and_executors_never_do():
    # The master is listed first and has the most room: without labels it would take everything.
    s, t = setup({"master:1": (16384, 16, AM), "n:1": (2048, 2, frozenset()), "n:2": (2048, 2, frozenset())},
                 node_labels=["am"], am_node_label="am")
    for i in (1, 2):
        s.add_app(f"a{i}", "default", "u", i)
        s.request_am(f"a{i}", Resource(512, 1))
    asks(s, "a1", ask(1, 6))
    out = s.allocate(t.schedulable())
    ams = [a for a in out if a.ask_id == AM_ASK_ID]
    execs = [a for a in out if a.ask_id != AM_ASK_ID]
    assert sorted(a.app_id for a in ams) == ["a1", "a2"]
    assert {a.node_id for a in ams} == {"master:1"}
    # Four executors fill the two worker nodes; the two left wait rather than go to the master.
    assert len(execs) == 4 and {a.node_id for a in execs} == {"n:1", "n:2"}
    assert s.apps["a1"].asks[1].count == 2
    assert t.get("master:1").used == Resource(1024, 2)


def test_am_waits_for_an_am_node_with_room():
    s, t = setup({"master:1": (512, 1, AM), "n:1": (8192, 8, frozenset())}, node_labels=["am"],
                 am_node_label="am")
    for i in (1, 2):
        s.add_app(f"a{i}", "default", "u", i)
        s.request_am(f"a{i}", Resource(512, 1))
    out = s.allocate(t.schedulable())
    assert [(a.app_id, a.node_id) for a in out] == [("a1", "master:1")]   # a2 does not spill to n:1
    assert s.apps["a2"].am_request is not None


def test_locality_cannot_reach_a_labelled_node():
    s, t = setup({"master:1": (8192, 8, AM), "n:1": (8192, 8, frozenset())}, node_labels=["am"],
                 am_node_label="am")
    s.add_app("a", "default", "u", 1)
    asks(s, "a", ask(1, 1, nodes=["master:1"]), ask(2, 1, nodes=["master:1"], relax_locality=False))
    out = s.allocate(t.schedulable())
    assert [(a.ask_id, a.node_id) for a in out] == [(1, "n:1")]   # relaxed: elsewhere; strict: never
    assert s.apps["a"].asks[2].count == 1


def test_labelled_node_without_am_label_takes_nothing():
    s, t = setup({"gpu:1": (8192, 8, frozenset({"gpu"})), "n:1": (1024, 2, frozenset())}, node_labels=["gpu"])
    s.add_app("a", "default", "u", 1)
    s.request_am("a", Resource(512, 1))
    asks(s, "a", ask(1, 3, mem=512))
    out = s.allocate(t.schedulable())
    assert {a.node_id for a in out} == {"n:1"} and len(out) == 2


def test_no_labels_is_unchanged():
    s, t = setup({"n:1": (2048, 2, frozenset())})
    s.add_app("a", "default", "u", 1)
    s.request_am("a", Resource(1024, 1))
    asks(s, "a", ask(1, 1))
    assert [(a.ask_id, a.node_id) for a in s.allocate(t.schedulable())] == [(AM_ASK_ID, "n:1"), (1, "n:1")]


# ----- registration and config -------------------------------------------------------------------

def register(core, node_id: str, labels: list[str]) -> api.NodeRegisterResponse:
    return core.register_node(nm_claims(node_id), api.NodeRegisterRequest(
        node_id=node_id, http_address=node_id, capability=Resource(4096, 4), node_labels=labels))


def test_registration_records_labels_and_refuses_unknown_ones():
    core = make_core(node_labels=["am"], am_node_label="am")
    assert register(core, "master:8042", ["am"]).action == "NORMAL"
    assert core.nodes.get("master:8042").labels == AM
    refused = register(core, "n:8042", ["am", "gpu"])
    assert refused.action == "SHUTDOWN"
    assert re.search(r"\['gpu'\].*node_labels: \['am'\]", refused.diagnostics), refused.diagnostics
    assert core.nodes.get("n:8042") is None and core.nodes.total == Resource(4096, 4)   # nothing stored


def test_registration_with_labels_on_a_cluster_without_any_is_refused():
    core = make_core()
    refused = register(core, "n:8042", ["am"])
    assert refused.action == "SHUTDOWN" and "does not know" in refused.diagnostics
    assert core.nodes.get("n:8042") is None


@pytest.mark.parametrize("kw, match", [
    ({"am_node_label": "am"}, "not one of the cluster's node_labels"),
    ({"node_labels": ["am", "am"]}, "listed twice"),
    ({"node_labels": ["-x"]}, "not a label name"),
    ({"node_labels": ["a b"]}, "not a label name"),
    ({"node_labels": ["am"], "am_node_label": "AM"}, "not one of"),
])
def test_rm_config_checks(kw, match):
    with pytest.raises(ValueError, match=match):
        RMConfig(**kw)
    with pytest.raises(msgspec.ValidationError, match=match):
        msgspec.convert(kw, RMConfig, strict=True)


def test_config_files_name_the_file(tmp_path):
    rm = tmp_path / "rm.toml"
    rm.write_text('[rm]\nam_node_label = "am"\n')
    with pytest.raises(ConfigError, match=f"{rm}.*am_node_label 'am'"):
        load(rm, RMConfig, "rm")
    (tmp_path / "nm.toml").write_text("[nm]\nvcores = 2\n")
    (tmp_path / "nm-master.toml").write_text('[nm]\nnode_labels = ["am"]\n')
    assert load_nm(str(tmp_path / "nm.toml"), hostname="master").node_labels == ["am"]
    assert load_nm(str(tmp_path / "nm.toml"), hostname="node1").node_labels == []
    (tmp_path / "nm-bad.toml").write_text('[nm]\nnode_labels = ["a/b"]\n')
    with pytest.raises(ConfigError, match="nm-bad.toml.*'a/b' is not a label name"):
        load_nm(str(tmp_path / "nm.toml"), hostname="bad")
    with pytest.raises(ValueError, match="not a label name"):
        NMConfig(node_labels=[""])


# ----- the policies' view ------------------------------------------------------------------------

def test_policies_see_the_executor_partition_only():
    from rm.policy_runner import build_snapshot
    from rm_testing import heartbeat, submit
    core = make_core(node_labels=["am"], am_node_label="am")
    register(core, "master:8042", ["am"])
    register(core, "n1:8042", [])
    app_id = submit(core, mem=1024)
    heartbeat(core, "master:8042")
    assert core.containers and all(c.node_id == "master:8042" for c in core.containers.values())
    snap = build_snapshot(core)
    assert [v.node_id for v in snap.nodes] == ["n1:8042"]
    assert snap.total == Resource(4096, 4) and snap.used == Resource(0, 0)
    (view,) = [a for a in snap.apps if a.app_id == app_id]
    assert view.am_node is None and view.am_resource == Resource(0, 0)
    # The AM on the labelled node is out of what the app holds in the partition: with it in, the
    # policies (executors' room = resources - am_resource) saw one AM's worth of phantom room.
    assert view.resources == Resource(0, 0)


def test_policies_see_every_node_without_labels():
    from rm.policy_runner import build_snapshot
    core = make_core()
    register(core, "n1:8042", [])
    register(core, "n2:8042", [])
    snap = build_snapshot(core)
    assert sorted(v.node_id for v in snap.nodes) == ["n1:8042", "n2:8042"] and snap.total == Resource(8192, 8)


def test_the_policies_snapshot_names_the_final_status_of_apps_that_just_ended():
    """An app that ended leaves the scheduler's apps; the snapshot's `ended` says how it ended, so
    a policy that learns from a job's end (Optimus's epochs prior) can tell a kill from a finish."""
    from rm.policy_runner import build_snapshot
    from rm_testing import submit
    core = make_core()
    register(core, "n1:8042", [])
    app_id = submit(core, mem=1024)
    core.kill(app_id)
    snap = build_snapshot(core)
    assert app_id not in {a.app_id for a in snap.apps}
    assert snap.ended == {app_id: "KILLED"}
