"""The RM's side of log aggregation (rm/nm_protocol.py, rm/log_aggregation_status.py, the app view):
a node that (re)registers holding an app that is over is told to clean it up (so it aggregates and
frees its logs), the nodes' reports add up to YARN's logAggregationStatus, and amContainerLogs
points at the RM's aggregated log page once the app is over."""
from __future__ import annotations

import re
from pathlib import Path
from typing import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient

from protocol import codec
from protocol import internal_api as api
from protocol.aggregated_logs import ChunkSource, LogFileWriter, RemoteLogDir, node_file_name
from protocol.config import ClusterConfig, RMConfig
from protocol.internal_api import LogAggregationReport
from protocol.internal_api import LogAggregationStatus as S
from protocol.records import AppState, NodeState, Resource
from protocol.remote_exception import BadRequest
from rm.core import ResourceManagerCore
from rm.log_aggregation_status import TIMEOUT_S, app_status
from rm.rest_views import app_json, attempt_json
from rm.server import ResourceManagerServer
from rm_inprocess import inprocess_rm
from rm_testing import (SECRET, FakeClock, ask, heartbeat, launch_and_register, make_core, nm_claims, register,
                        sign_nm, submit)


def _aggregating_core(clock: FakeClock) -> ResourceManagerCore:
    return ResourceManagerCore(RMConfig(nm_expiry_s=10.0, am_expiry_s=1000.0), ClusterConfig(secret=SECRET, remote_app_log_dir="/srv/logs"),
                               clock)


def _reregister(core: ResourceManagerCore, node_id: str, applications: list[str],
                reports: list[LogAggregationReport] | None = None) -> None:
    core.register_node(nm_claims(node_id), api.NodeRegisterRequest(
        node_id=node_id, http_address=node_id, capability=Resource(8192, 8), applications=applications,
        log_aggregation=reports or []))


def _report(core: ResourceManagerCore, node_id: str, app_id: str, status: S, why: str = "") -> None:
    node = core.nodes.get(node_id)
    assert node is not None
    core.node_heartbeat(nm_claims(node_id), api.NodeHeartbeatRequest(
        node_id=node_id, response_id=node.response_id, used=Resource(0, 0),
        log_aggregation=[LogAggregationReport(app_id, status, why)]))


def _run_on_two_nodes(core: ResourceManagerCore) -> tuple[str, str]:
    """An app whose AM runs on n1 and one container on n2; returns (app id, container id)."""
    register(core, "n1:1", mem=1024)
    register(core, "n2:1", mem=1024)
    app_id = submit(core, mem=1024)
    claims = launch_and_register(core, app_id)
    r = core.allocate(claims, api.AllocateRequest(response_id=0, asks=[ask(1, 1)]))
    heartbeat(core, "n2:1")
    allocated = r.allocated + core.allocate(claims, api.AllocateRequest(response_id=1)).allocated
    [c] = allocated
    assert c.node_id == "n2:1"
    return app_id, c.container_id


def _finish(core: ResourceManagerCore, app_id: str) -> None:
    claims = {"app_id": app_id, "attempt_id": core.apps[app_id].current_attempt, "user": "alice"}
    core.am_finish(claims, api.AmFinishRequest(final_status="SUCCEEDED"))
    assert core.apps[app_id].state.is_final


# ===== telling nodes that come back =================================================================

def test_a_restarted_node_is_told_of_the_finished_and_unknown_apps_it_holds() -> None:
    clock = FakeClock()
    core = make_core(clock)
    register(core, "n1:1")
    done, running = submit(core), submit(core)
    launch_and_register(core, done)
    _finish(core, done)
    heartbeat(core, "n1:1")                      # the running node heard of it...
    unknown = "application_1600000000000_0042"    # ...an app of an RM that forgot it (no state store)
    _reregister(core, "n1:1", [done, running, unknown])   # ...but this NM restarted and missed it
    hb = heartbeat(core, "n1:1")
    assert hb.apps_to_cleanup == [done, unknown]
    assert heartbeat(core, "n1:1").apps_to_cleanup == []     # said once
    # The running app now counts the node among its nodes: it is told when the app ends, even
    # though it got no container under this node id (a restarted NM may have a new one).
    assert "n1:1" in core.apps[running].nodes_used


def test_a_lost_node_that_comes_back_is_told_the_app_it_ran_finished() -> None:
    clock = FakeClock()
    core = _aggregating_core(clock)
    app_id, cid = _run_on_two_nodes(core)
    clock.advance(6)
    heartbeat(core, "n1:1")
    clock.advance(6)
    heartbeat(core, "n1:1")
    core.tick()                                   # n2 silent for 12 s: LOST, its container aborted
    assert core.nodes.nodes["n2:1"].state == NodeState.LOST and cid not in core.containers
    _finish(core, app_id)
    assert app_id in heartbeat(core, "n1:1").apps_to_cleanup
    # n2's NM comes back with the app's logs (and the container's record) and registers again.
    assert heartbeat(core, "n2:1").action == "RESYNC"
    _reregister(core, "n2:1", [app_id])
    assert heartbeat(core, "n2:1").apps_to_cleanup == [app_id]


def test_a_registration_naming_a_bad_app_id_is_refused_and_changes_nothing() -> None:
    core = make_core()
    with pytest.raises(BadRequest, match="applications: .*'../../etc'"):
        _reregister(core, "n1:1", ["../../etc"])
    assert core.nodes.get("n1:1") is None


# ===== logAggregationStatus =========================================================================

def test_the_nodes_reports_add_up_as_yarns_do() -> None:
    def status(final: bool, *per_node: S | None, now: float = 100.0) -> S:
        reports = {f"n{i}": LogAggregationReport("a", s) for i, s in enumerate(per_node) if s is not None}
        return app_status(True, {f"n{i}" for i in range(len(per_node))}, reports, final, 50.0, now)

    assert app_status(False, {"n0"}, {}, True, 0.0, 1.0) == S.DISABLED
    assert status(False) == S.NOT_START and status(True) == S.NOT_START       # ran nowhere
    assert status(False, None, None) == S.NOT_START
    assert status(False, S.RUNNING, None) == S.RUNNING
    assert status(False, S.RUNNING, S.RUNNING_WITH_FAILURE) == S.RUNNING_WITH_FAILURE
    assert status(True, S.SUCCEEDED, None) == S.RUNNING                      # a node still to upload
    assert status(True, S.SUCCEEDED, S.RUNNING_WITH_FAILURE) == S.RUNNING_WITH_FAILURE
    assert status(True, S.SUCCEEDED, S.SUCCEEDED) == S.SUCCEEDED
    assert status(True, S.SUCCEEDED, S.FAILED) == S.FAILED
    # A node that had not finished TIMEOUT_S after the app did (lost, never back): TIME_OUT.
    assert status(True, S.SUCCEEDED, None, now=50.0 + TIMEOUT_S - 1) == S.RUNNING
    assert status(True, S.SUCCEEDED, None, now=50.0 + TIMEOUT_S) == S.TIME_OUT
    assert status(True, S.FAILED, S.RUNNING, now=50.0 + TIMEOUT_S) == S.FAILED
    assert status(True, S.SUCCEEDED, S.SUCCEEDED, now=10 ** 6) == S.SUCCEEDED


def test_the_app_view_reports_log_aggregation_from_the_nodes_heartbeats() -> None:
    clock = FakeClock()
    core = _aggregating_core(clock)
    app_id, _ = _run_on_two_nodes(core)
    app = core.apps[app_id]
    assert app_json(core, app)["logAggregationStatus"] == "NOT_START"
    _report(core, "n2:1", app_id, S.RUNNING)                      # a rolled upload
    assert app_json(core, app)["logAggregationStatus"] == "RUNNING"
    _report(core, "n1:1", app_id, S.RUNNING_WITH_FAILURE, "roll upload failed 1 time(s): store down")
    assert app_json(core, app)["logAggregationStatus"] == "RUNNING_WITH_FAILURE"
    _finish(core, app_id)
    _report(core, "n1:1", app_id, S.SUCCEEDED)
    assert app_json(core, app)["logAggregationStatus"] == "RUNNING"
    _report(core, "n2:1", app_id, S.FAILED, "final upload failed 1 time(s), next try in 1 s: store down")
    assert app_json(core, app)["logAggregationStatus"] == "FAILED"
    _report(core, "n2:1", app_id, S.SUCCEEDED)                    # the NM's next try went through
    assert app_json(core, app)["logAggregationStatus"] == "SUCCEEDED"
    # Reports of an app the RM does not know are dropped; a registration's reports count.
    _report(core, "n1:1", "application_1600000000000_0001", S.RUNNING)
    assert "application_1600000000000_0001" not in core.log_aggregation.by_app
    _reregister(core, "n2:1", [app_id], [LogAggregationReport(app_id, S.FAILED, "x")])
    assert app_json(core, app)["logAggregationStatus"] == "FAILED"


def test_a_node_lost_for_good_times_the_status_out() -> None:
    clock = FakeClock()
    core = _aggregating_core(clock)
    app_id, _ = _run_on_two_nodes(core)
    for _ in range(2):
        clock.advance(6)
        heartbeat(core, "n1:1")
    core.tick()                                   # n2 LOST
    _finish(core, app_id)
    _report(core, "n1:1", app_id, S.SUCCEEDED)
    assert app_json(core, core.apps[app_id])["logAggregationStatus"] == "RUNNING"
    clock.advance(TIMEOUT_S)
    assert app_json(core, core.apps[app_id])["logAggregationStatus"] == "TIME_OUT"


def test_without_a_remote_dir_the_status_is_disabled_and_am_logs_stay_on_the_node() -> None:
    core = make_core()
    register(core, "n1:1")
    app_id = submit(core)
    claims = launch_and_register(core, app_id)
    _finish(core, app_id)
    view = app_json(core, core.apps[app_id], "http://rm:8088")
    am = core.attempts[claims["attempt_id"]].am_container_id
    assert view["logAggregationStatus"] == "DISABLED"
    assert view["amContainerLogs"] == f"http://n1:1/node/containerlogs/{am}/alice"
    # A simple-auth user name is free-form: the link keeps it one path segment.
    odd = submit(core, user="bob/x?y#z")
    claims = launch_and_register(core, odd)
    am2 = core.attempts[claims["attempt_id"]].am_container_id
    assert app_json(core, core.apps[odd], "http://rm:8088")["amContainerLogs"] == \
        f"http://n1:1/node/containerlogs/{am2}/bob%2Fx%3Fy%23z"


def test_am_container_logs_link_the_rm_once_the_app_is_over_or_its_node_gone() -> None:
    clock = FakeClock()
    core = _aggregating_core(clock)
    app_id, _ = _run_on_two_nodes(core)
    at = core.attempts[core.apps[app_id].current_attempt or ""]
    am = at.am_container_id
    on_node = f"http://n1:1/node/containerlogs/{am}/alice"
    assert app_json(core, core.apps[app_id], "http://rm:8088")["amContainerLogs"] == on_node
    assert attempt_json(core, at, "http://rm:8088")["logsLink"] == on_node
    _finish(core, app_id)
    at_rm = f"http://rm:8088/cluster/logs/{app_id}/{am}"
    assert app_json(core, core.apps[app_id], "http://rm:8088")["amContainerLogs"] == at_rm
    assert attempt_json(core, at, "http://rm:8088")["logsLink"] == at_rm
    assert app_json(core, core.apps[app_id])["amContainerLogs"] == f"/cluster/logs/{app_id}/{am}"


# ===== through the REST API ========================================================================

@pytest.fixture
async def rm_client(tmp_path: Path) -> AsyncIterator[tuple[ResourceManagerServer, TestClient]]:
    async with inprocess_rm(tmp_path, ClusterConfig(secret=SECRET, remote_app_log_dir=str(tmp_path / "remote"))) as env:
        yield env


async def test_the_rest_app_view_after_the_app_ends(tmp_path: Path, rm_client) -> None:
    rm, client = rm_client
    node = "127.0.0.1:8042"
    auth = {"Authorization": f"Bearer {sign_nm(node)}"}

    async def nm_post(path: str, body: api.NodeRegisterRequest | api.NodeHeartbeatRequest) -> None:
        r = await client.post(path, data=codec.dumps(body), headers={**auth, "Content-Type": "application/json"})
        assert r.status == 200, await r.text()

    await nm_post(api.NODE_REGISTER, api.NodeRegisterRequest(node_id=node, http_address=node,
                                                             capability=Resource(4096, 4)))
    app_id = submit(rm.core)
    claims = launch_and_register(rm.core, app_id)
    am = rm.core.attempts[claims["attempt_id"]].am_container_id
    _finish(rm.core, app_id)

    async def view() -> dict:
        r = await client.get(f"/ws/v1/cluster/apps/{app_id}?user.name=alice")
        assert r.status == 200
        return (await r.json())["app"]

    v = await view()
    assert v["state"] == "FINISHED" and v["logAggregationStatus"] == "NOT_START"
    # The node uploads the AM's logs and says so in its next heartbeat.
    log = tmp_path / "stderr"
    log.write_bytes(b"the AM's own log\n")
    RemoteLogDir(str(tmp_path / "remote")).write(app_id, node_file_name(node), LogFileWriter(
        app_id, node, "final", 0, 1, [ChunkSource(am, "stderr", str(log), 0, log.stat().st_size)]).pieces())
    await nm_post(api.NODE_HEARTBEAT, api.NodeHeartbeatRequest(
        node_id=node, response_id=rm.core.nodes.nodes[node].response_id, used=Resource(0, 0),
        log_aggregation=[LogAggregationReport(app_id, S.SUCCEEDED)]))
    v = await view()
    assert v["logAggregationStatus"] == "SUCCEEDED"
    app_page = await (await client.get(f"/cluster/app/{app_id}")).text()
    assert re.search(r"<th>Log aggregation</th><td [^>]*>SUCCEEDED</td>", app_page), app_page
    # amContainerLogs is absolute (the address this client used) and its page lists the AM's files.
    origin = str(client.make_url(""))
    assert v["amContainerLogs"] == f"{origin.rstrip('/')}/cluster/logs/{app_id}/{am}"
    page = await (await client.get(v["amContainerLogs"].removeprefix(origin.rstrip("/")))).text()
    assert f'href="/cluster/logs/{app_id}/{am}/stderr"' in page and f"Logs of {am}" in page
    assert (await (await client.get(f"/cluster/logs/{app_id}/{am}/stderr")).text()) == "the AM's own log\n"
    assert rm.core.apps[app_id].state == AppState.FINISHED


async def test_under_token_auth_an_apps_logs_are_its_owners_and_the_admins(tmp_path: Path) -> None:
    """cluster.toml client_auth = "token": the RM's log pages ask for a client token and serve the
    app's owner and the admins only (YARN's view ACL), also once the RM has forgotten the app (the
    aggregated files name their user)."""
    cluster = ClusterConfig(secret=SECRET, remote_app_log_dir=str(tmp_path / "remote"), client_auth="token",
                            client_tokens={"t-alice": "alice", "t-bob": "bob", "t-root": "root"}, admins=["root"])
    async with inprocess_rm(tmp_path, cluster) as (rm, client):
        app_id = submit(rm.core, user="alice")
        forgotten = "application_1700000000000_0099"         # an app this RM does not know (any more)
        log = tmp_path / "stderr"
        log.write_bytes(b"alice's secret\n")
        cid = {}
        for app in (app_id, forgotten):
            cid[app] = f"container_{app.removeprefix('application_')}_01_000001"
            RemoteLogDir(str(tmp_path / "remote")).write(app, node_file_name("n:1"), LogFileWriter(
                app, "n:1", "final", 0, 1, [ChunkSource(cid[app], "stderr", str(log), 0, log.stat().st_size)],
                user="alice").pieces())
        for app in (app_id, forgotten):
            for path in (f"/cluster/logs/{app}", f"/cluster/logs/{app}/{cid[app]}/stderr"):
                for token, status in ((None, 401), ("t-nobody", 401), ("t-bob", 403), ("t-alice", 200), ("t-root", 200)):
                    headers = {"Authorization": f"Bearer {token}"} if token else {}
                    r = await client.get(path, headers=headers)
                    body = await r.text()
                    assert r.status == status, (path, token, body)
                    assert ("alice's secret" in body) == (status == 200 and path.endswith("stderr")), (path, token)
