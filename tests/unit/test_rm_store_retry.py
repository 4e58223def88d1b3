"""The RM keeps the changes a state-store write could not save and writes them at the next flush
(rm/server.py `flush`): a store that is down for a moment (etcd electing a leader) loses nothing."""
from __future__ import annotations

from protocol.config import ClusterConfig, RMConfig
from rm.server import ResourceManagerServer
from rm.store import AppRecord, AttemptRecord, SqliteStateStore
from rm_testing import SECRET, FakeClock, submit


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
