"""Log aggregation when the NM stops (nodemanager/log_aggregation_service.py `stop`): a node that
is decommissioned or sent SIGTERM while an app runs on elsewhere uploads what it holds of the app
as its final file, bounded in time; a later run of the NM takes that file as done."""
from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Iterable

import pytest

from local_app_logs import APP, C1, C2, NODE, OTHER, write_stdout
from nodemanager.log_aggregation import LogAggregationPlanner
from nodemanager.log_aggregation_service import LogAggregationService
from polling import async_wait_until
from protocol.aggregated_logs import RemoteLogDir, app_node_logs, node_file_name, read_log
from protocol.internal_api import LogAggregationStatus as S


async def test_stop_uploads_the_apps_this_node_is_done_with_and_a_later_run_keeps_that_file(tmp_path: Path) -> None:
    """APP runs on elsewhere but its containers here are over: the stop uploads them as the node's
    final file (nothing else ever would with rolling off). OTHER still has a live container here:
    left to the next run. The next run names APP at registration and, once the RM says APP is
    over, keeps the file as it is (no second upload) and frees the local copies."""
    logs = tmp_path / "logs"
    write_stdout(logs, APP, C1, "last words\n")
    write_stdout(logs, OTHER, C2, "still running\n")
    store = RemoteLogDir(str(tmp_path / "remote"))
    svc = LogAggregationService(store, str(logs), NODE, LogAggregationPlanner(0.0, 0.0),
                                lambda: {APP: "alice", OTHER: "bob"})
    svc.start()
    await svc.stop(live_apps={OTHER})
    [node] = app_node_logs(store, APP)
    assert node.final and node.node_file == node_file_name(NODE) and node.user == "alice"
    assert read_log(store, APP, node, C1, "stdout") == b"last words\n"
    assert app_node_logs(store, OTHER) == []
    assert (logs / APP / C1 / "stdout").exists()        # the app is not over: its local copies stay
    uploaded = (tmp_path / "remote" / APP / node_file_name(NODE)).read_bytes()

    # The NM runs again (its containers' records gone): it holds APP's logs until the RM's word.
    again = LogAggregationService(store, str(logs), NODE, LogAggregationPlanner(0.0, 0.0), lambda: {})
    again.start()
    try:
        assert again.held_apps() == [APP, OTHER]
        again.app_finished(APP)
        await async_wait_until(lambda: not (logs / APP).exists(), 15, "APP's local logs freed")
        assert [(r.app_id, r.status) for r in again.pending_reports()] == [(APP, S.SUCCEEDED)]
        assert (tmp_path / "remote" / APP / node_file_name(NODE)).read_bytes() == uploaded
    finally:
        await again.stop(live_apps={OTHER})


class _StuckStore(RemoteLogDir):
    """A store whose writes hang until `release` (a store that stopped answering)."""

    def __init__(self, url: str):
        super().__init__(url)
        self.entered = threading.Event()
        self.release = threading.Event()

    def write(self, app_id: str, name: str, pieces: Iterable[bytes]) -> None:
        self.entered.set()
        self.release.wait(60)
        raise OSError("the store never answered")


def test_a_stuck_store_holds_the_stop_no_longer_than_its_bound(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """The last upload hangs in the store: `stop` gives up after its bound, says whose logs stay
    behind, and the daemon's asyncio.run returns (its thread does not wait for the stuck write)."""
    logs = tmp_path / "logs"
    write_stdout(logs, APP, C1, "last words\n")
    store = _StuckStore(str(tmp_path / "remote"))

    async def daemon() -> None:
        svc = LogAggregationService(store, str(logs), NODE, LogAggregationPlanner(0.0, 0.0), lambda: {APP: "alice"})
        svc.start()
        await svc.stop(timeout_s=0.2)

    ended = threading.Event()

    def run() -> None:
        asyncio.run(daemon())
        ended.set()

    caplog.set_level(logging.WARNING, logger="nodemanager.log_aggregation_service")
    threading.Thread(target=run, daemon=True).start()
    try:
        assert ended.wait(10), "the stop did not end while the store hung"
        assert store.entered.is_set()           # the last upload was tried
        [msg] = [r.getMessage() for r in caplog.records if "not aggregated" in r.getMessage()]
        assert APP in msg and str(logs) in msg
        assert (logs / APP / C1 / "stdout").exists()
    finally:
        store.release.set()
