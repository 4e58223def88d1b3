"""The RM keeps at most max_completed_apps completed apps (YARN's
yarn.resourcemanager.max-completed-applications): the oldest beyond it is forgotten in memory and
deleted from the state store; running apps and apps whose containers are still about never are."""
from __future__ import annotations

from pathlib import Path

from protocol import internal_api as api
from protocol.config import ClusterConfig, RMConfig
from rm.server import ResourceManagerServer
from rm.store import SqliteStateStore
from rm_testing import SECRET, FakeClock, heartbeat, launch_and_register, make_core, register, submit


def test_the_oldest_completed_app_is_forgotten_beyond_the_limit_and_a_running_one_is_kept() -> None:
    clock = FakeClock()
    core = make_core(clock, max_completed_apps=2)
    running = submit(core)
    done = []
    for _ in range(3):
        app_id = submit(core)
        core.kill(app_id)           # killed before its AM got a container: nothing left on a node
        clock.advance(1.0)
        done.append(app_id)
    # Each completed app is kept for the NM and AM expiries after it ended (10 s each here).
    assert set(core.apps) == {running, *done} and core.take_removed() == set()
    clock.advance(7.5)
    core.tick()                     # done[0] ended 10.5 s ago, done[1] 9.5 s ago
    assert set(core.apps) == {running, done[1], done[2]}
    assert core.take_removed() == {done[0]}
    assert not any(at.app_id == done[0] for at in core.attempts.values())
    clock.advance(100.0)
    core.tick()                     # the limit is met: nothing more goes
    assert set(core.apps) == {running, done[1], done[2]} and core.take_removed() == set()
    assert not core.apps[running].state.is_final


def test_an_app_whose_containers_are_still_reported_waits_until_they_are_gone() -> None:
    clock = FakeClock()
    core = make_core(clock, max_completed_apps=0)
    register(core, "n1:1")
    app_id = submit(core)
    claims = launch_and_register(core, app_id)
    core.kill(app_id)
    am_cid = core.attempts[claims["attempt_id"]].am_container_id
    clock.advance(5.0)
    heartbeat(core, "n1:1")         # its AM may still call and its NM report within the expiries
    assert core.allocate(claims, api.AllocateRequest(response_id=1)).action == "SHUTDOWN"
    heartbeat(core, "n1:1", [api.ContainerStatus(container_id=am_cid, state="COMPLETE", exit_status=-106)])
    core.tick()
    assert app_id in core.apps
    clock.advance(6.0)
    core.tick()
    assert app_id not in core.apps and core.take_removed() == {app_id}


def test_forgotten_apps_leave_the_store_and_a_smaller_limit_applies_at_recovery(tmp_path: Path) -> None:
    clock = FakeClock()
    store = SqliteStateStore(tmp_path)
    rm = ResourceManagerServer(RMConfig(state_dir=str(tmp_path), max_completed_apps=3),
                               ClusterConfig(secret=SECRET), clock=clock, store=store, run_timers=False)
    rm.attach_launcher("http://127.0.0.1:1")       # AM dirs under <state_dir>/apps
    ids = []
    for _ in range(4):
        app_id = submit(rm.core)
        rm.core.kill(app_id)
        clock.advance(1.0)
        ids.append(app_id)
        (tmp_path / "apps" / app_id / "checkpoints" / "epoch-1").mkdir(parents=True)   # what its AM left
        rm.flush()
    assert sorted(r.app_id for r, _ in store.load()) == sorted(ids)     # within the expiries: all kept
    clock.advance(20.0)
    rm.core.tick()
    rm.flush()
    assert sorted(r.app_id for r, _ in store.load()) == sorted(ids[1:])
    # The forgotten app's AM dir (checkpoints and all) goes with it; the kept apps' stay.
    assert sorted(p.name for p in (tmp_path / "apps").iterdir()) == sorted(ids[1:])
    store.close()

    store2 = SqliteStateStore(tmp_path)         # the next RM keeps fewer: the oldest go at recovery
    rm2 = ResourceManagerServer(RMConfig(state_dir=str(tmp_path), max_completed_apps=1),
                                ClusterConfig(secret=SECRET), clock=clock, store=store2, run_timers=False)
    assert set(rm2.core.apps) == {ids[3]}
    rm2.flush()
    assert [r.app_id for r, _ in store2.load()] == [ids[3]]
    store2.close()
