"""Moving an application to another queue (YARN's move to queue): what it holds and asks for goes
with it, the queues' accounting stays what its containers and AM requests add up to (checked
against a recount from the core's records after every step), and a move that cannot be made
changes nothing. Core, then the REST API and a restart."""
from __future__ import annotations

import pytest

from protocol import internal_api as api
from protocol.config import QueueConfig
from protocol.records import ZERO, Resource
from protocol.remote_exception import BadRequest
from rm.core import ResourceManagerCore
from rm_testing import ask, heartbeat, launch_and_register, make_core, register, submit
from test_rm_api import BASE, close_env, make_env

QUEUES = [QueueConfig("a", 50, 100), QueueConfig("b", 30, 60), QueueConfig("c", 20, 20)]


def recount(core: ResourceManagerCore) -> dict[str, tuple[Resource, dict[str, Resource], Resource]]:
    """Each queue's (used, used per user, AM charge) as the core's records add them up: every live
    container of an app in the queue (the node keeps a released one charged, not the queue), and
    the AM resource of each app the queue's AM limit has activated, allocated or not."""
    out: dict[str, tuple[Resource, dict[str, Resource], Resource]] = {}
    for name in core.scheduler.queues:
        used, users, am = ZERO, {}, ZERO
        for c in core.containers.values():
            app = core.apps[c.app_id]
            if app.queue != name:
                continue
            used = used + c.resource
            users[app.user] = users.get(app.user, ZERO) + c.resource
            if c.is_am:
                am = am + c.resource
        for sa in core.scheduler.queues[name].apps.values():
            if sa.am_request is not None and sa.am_active:
                am = am + sa.am_request
        out[name] = (used, users, am)
    return out


def booked(core: ResourceManagerCore) -> dict[str, tuple[Resource, dict[str, Resource], Resource]]:
    return {name: (q.used, {u: r for u, r in q.user_used.items() if r != ZERO}, q.am.used)
            for name, q in core.scheduler.queues.items()}


def consistent(core: ResourceManagerCore) -> None:
    assert booked(core) == recount(core)
    for name, q in core.scheduler.queues.items():
        assert all(sa.queue == name and core.apps[sa.app_id].queue == name for sa in q.apps.values())


def running_in_a(node_mb: int, executors: int) -> tuple[ResourceManagerCore, str, dict]:
    """A core with one node of `node_mb` (1 vcore a GB) and an app in queue a holding its AM and
    `executors` executors of 1 GB: (core, app id, its AM's claims)."""
    core = make_core(queues=QUEUES)
    register(core, "n1:1", mem=node_mb, vcores=node_mb // 1024)
    app = submit(core, queue="a")
    claims = launch_and_register(core, app)
    core.allocate(claims, api.AllocateRequest(response_id=0, asks=[ask(1, executors, 1024)]))
    heartbeat(core, "n1:1")
    return core, app, claims


def test_an_app_moves_with_its_containers_asks_and_am_and_gives_back_to_its_new_queue() -> None:
    core, app, claims = running_in_a(16384, executors=2)
    held = [c for c in core.containers.values() if c.app_id == app]
    assert len(held) == 3
    consistent(core)
    core.allocate(claims, api.AllocateRequest(response_id=1, asks=[ask(2, 1, 1024)]))   # one more asked
    core.move_app(app, "b")                       # its ask is served at once, from queue b
    consistent(core)
    assert core.apps[app].queue == "b" and len([c for c in core.containers.values() if c.app_id == app]) == 4
    assert core.scheduler.queues["a"].used == ZERO and core.scheduler.queues["b"].used == Resource(4096, 4)
    # A container ending gives back to queue b, not a; the AM's exit frees b's AM charge.
    executor = next(c for c in held if not c.is_am)
    heartbeat(core, "n1:1", [api.ContainerStatus(container_id=executor.container_id, state="COMPLETE", exit_status=0)])
    consistent(core)
    core.am_finish(claims, api.AmFinishRequest(final_status="SUCCEEDED"))
    heartbeat(core, "n1:1", [api.ContainerStatus(container_id=c.container_id, state="COMPLETE", exit_status=0)
                             for c in core.containers.values() if c.app_id == app])
    consistent(core)
    assert core.scheduler.queues["b"].used == ZERO and core.scheduler.queues["b"].am.used == ZERO


def test_an_app_waiting_at_its_queues_am_limit_moves_to_one_with_room_and_starts() -> None:
    core = make_core(queues=QUEUES, max_am_resource_percent=0.1)
    register(core, "n1:1", mem=16384, vcores=16)
    first = submit(core, queue="a")
    waiting = submit(core, queue="a")             # a's AM limit admits one AM
    assert not core.scheduler.apps[waiting].am_active
    consistent(core)
    core.move_app(waiting, "b")                   # b's AM limit admits it, and its AM is placed
    assert any(c.app_id == waiting and c.is_am for c in core.containers.values())
    assert core.scheduler.queues["b"].am.used == Resource(1024, 1)
    consistent(core)
    # moving the active one back frees a's AM charge for what waits there next
    third = submit(core, queue="a")
    assert not core.scheduler.apps[third].am_active
    core.move_app(first, "b")                     # a running AM moves whatever b's AM limit says
    assert any(c.app_id == third and c.is_am for c in core.containers.values())
    assert core.scheduler.queues["b"].am.used == Resource(2048, 2)
    consistent(core)


def test_a_move_that_cannot_be_made_is_refused_and_changes_nothing() -> None:
    core, big, _ = running_in_a(10240, executors=3)
    before = booked(core)
    with pytest.raises(BadRequest, match="queue 'c': moving .* would exceed its maximum capacity"):
        core.move_app(big, "c")                   # c's ceiling is 20 %: 2048 MB; the app holds 4096
    with pytest.raises(BadRequest, match="unknown queue 'nope'; known queues: a, b, c"):
        core.move_app(big, "nope")
    assert booked(core) == before and core.apps[big].queue == "a"
    core.move_app(big, "a")                       # where it is already: nothing to do
    assert booked(core) == before
    core.kill(big)
    with pytest.raises(BadRequest, match="a finished application cannot be moved"):
        core.move_app(big, "b")
    consistent(core)


async def test_the_rest_api_moves_an_owners_app_and_the_move_survives_a_restart(tmp_path) -> None:
    env = await make_env(tmp_path)
    try:
        await env.register_node("n1:1")
        app_id = await env.submit(user="alice")
        assert (await env.call("GET", f"{BASE}/apps/{app_id}/queue")) == {"queue": "default"}
        err = await env.call("PUT", f"{BASE}/apps/{app_id}/queue", {"queue": "research"}, status=403,
                             **{"user.name": "bob"})
        assert "not allowed to move" in err["RemoteException"]["message"]
        err = await env.call("PUT", f"{BASE}/apps/{app_id}/queue", {"queue": "elsewhere"}, status=400,
                             **{"user.name": "alice"})
        assert "unknown queue 'elsewhere'" in err["RemoteException"]["message"]
        await env.call("PUT", f"{BASE}/apps/{app_id}/queue", {"queu": "research"}, status=400, **{"user.name": "alice"})
        assert (await env.app(app_id))["queue"] == "default"
        moved = await env.call("PUT", f"{BASE}/apps/{app_id}/queue", {"queue": "research"}, **{"user.name": "root"})
        assert moved == {"queue": "research"} and (await env.app(app_id))["queue"] == "research"
    finally:
        await close_env(env)
    env2 = await make_env(tmp_path)
    try:
        assert (await env2.app(app_id))["queue"] == "research"
        assert app_id in env2.rm.core.scheduler.queues["research"].apps
    finally:
        await close_env(env2)
