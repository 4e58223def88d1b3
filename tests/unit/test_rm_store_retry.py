"""The RM keeps the changes a state-store write could not save and writes them at the next flush
(rm/server.py `flush`): a store that is down for a moment (etcd electing a leader) loses nothing."""
from __future__ import annotations

from protocol.config import ClusterConfig, RMConfig
from rm.server import ResourceManagerServer
from rm.store import AppRecord, AttemptRecord, SqliteStateStore
from protocol import internal_api as api
from rm_testing import SECRET, FakeClock, make_core, submit
from test_rm_api import BASE, close_env, make_env, submission


class FlakyStore(SqliteStateStore):
    """SQLite whose next `failures` writes fail, as a store that cannot be reached."""

    failures = 0

    def save_app(self, app: AppRecord, attempts: list[AttemptRecord]) -> None:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("store unreachable")
        super().save_app(app, attempts)


def test_a_failed_write_is_retried_at_the_next_flush(tmp_path):
    store = FlakyStore(tmp_path)
    rm = ResourceManagerServer(RMConfig(state_dir=str(tmp_path)), ClusterConfig(secret=SECRET), clock=FakeClock(),
                               store=store, run_timers=False)
    app_id = submit(rm.core)            # the core's change, not stored yet
    store.failures = 2
    rm.flush()
    assert store.load() == [] and app_id in rm.core.dirty
    rm.flush()
    assert store.load() == [] and app_id in rm.core.dirty
    rm.flush()                          # the store is back
    assert [r.app_id for r, _ in store.load()] == [app_id] and not rm.core.dirty
    store.close()


def test_an_app_the_store_refuses_does_not_keep_the_others_from_being_saved(tmp_path):
    store = SqliteStateStore(tmp_path)
    rm = ResourceManagerServer(RMConfig(state_dir=str(tmp_path)), ClusterConfig(secret=SECRET), clock=FakeClock(),
                               store=store, run_timers=False)
    bad, good = submit(rm.core), submit(rm.core)
    real = store.save_app

    def save_app(app: AppRecord, attempts: list[AttemptRecord]) -> None:
        if app.app_id == bad:          # e.g. a record over etcd's request limit
            raise ValueError("request too large")
        real(app, attempts)
    store.save_app = save_app          # type: ignore[method-assign]
    rm.flush()
    assert [r.app_id for r, _ in store.load()] == [good] and set(rm.core.dirty) == {bad}
    store.close()


def test_diagnostics_keep_their_newest_64_kib() -> None:
    from rm.model import MAX_DIAGNOSTICS_CHARS, bounded_diagnostics     # noqa: PLC0415
    core = make_core()
    app_id = submit(core)
    core.kill(app_id, "x" * 500_000 + "the end")       # the REST body may carry 16 MiB
    d = core.apps[app_id].diagnostics
    assert d.startswith("[diagnostics truncated") and d.endswith("the end")
    assert len(d) < MAX_DIAGNOSTICS_CHARS + 100
    assert bounded_diagnostics("short") == "short"


async def test_a_change_the_store_could_not_take_is_answered_503_and_kept_until_it_can(tmp_path, monkeypatch):
    """An AM's finish confirmed before it is stored would be undone by a restart or the next
    active (the app runs again): the RM answers 503 until the write succeeds, keeping the change."""
    env = await make_env(tmp_path)
    try:
        await env.register_node("n1:1")
        app_id = await env.submit()
        am_token = await env.launch_am()
        await env.call("POST", api.AM_REGISTER, {}, token=am_token)
        real = env.rm.store.save_app
        down = [True]

        def save_app(app: AppRecord, attempts: list[AttemptRecord]) -> None:
            if down[0]:
                raise ConnectionError("store unreachable")
            real(app, attempts)
        monkeypatch.setattr(env.rm.store, "save_app", save_app)
        out = await env.call("POST", api.AM_FINISH, {"final_status": "SUCCEEDED"}, token=am_token, status=503)
        assert "could not be stored yet" in out["RemoteException"]["message"] and app_id in env.rm.core.dirty
        # A retry while the store is still down changes nothing, but would confirm the same
        # unstored state: it waits for the store too (so does a repeated kill).
        await env.call("POST", api.AM_FINISH, {"final_status": "SUCCEEDED"}, token=am_token, status=503)
        await env.call("PUT", f"{BASE}/apps/{app_id}/state", {"state": "KILLED"}, status=503, **{"user.name": "alice"})
        await env.call("GET", BASE + "/apps")           # what changed nothing is answered meanwhile
        down[0] = False
        out = await env.call("POST", api.AM_FINISH, {"final_status": "SUCCEEDED"}, token=am_token)
        assert out["unregistered"] is True and app_id not in env.rm.core.dirty
        assert {r.app_id: r.final_status for r, _ in env.rm.store.load()}[app_id] == "SUCCEEDED"
    finally:
        await close_env(env)


async def test_a_submission_whose_write_timed_out_after_it_landed_leaves_no_record(tmp_path):
    """etcd can commit a write whose answer never reaches the RM (a timeout): the client is told
    503 (not saved), so the record must not bring the app back at the next restart or failover."""
    env = await make_env(tmp_path)
    try:
        real = env.rm.store.save_app

        def landed_then_timed_out(app: AppRecord, attempts: list[AttemptRecord]) -> None:
            real(app, attempts)
            raise TimeoutError("no answer from etcd within 1.7 s")
        env.rm.store.save_app = landed_then_timed_out     # type: ignore[method-assign]
        new = await env.call("POST", BASE + "/apps/new-application")
        out = await env.call("POST", BASE + "/apps", submission(new["application-id"]), status=503)
        assert "no answer from etcd" in out["RemoteException"]["message"]
        assert env.rm.store.load() == [] and env.rm.core.apps == {}
        del env.rm.store.save_app
        # The client's retry of the same id is taken (the id is its own again) and stored once.
        await env.call("POST", BASE + "/apps", submission(new["application-id"]), status=202)
        assert [r.app_id for r, _ in env.rm.store.load()] == [new["application-id"]]
    finally:
        await close_env(env)
