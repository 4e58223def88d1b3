"""Log aggregation's reading back of what the store holds (nodemanager/log_aggregation_service.py
`_step`, nodemanager/log_aggregation.py `recover`): a store that cannot list is a failed try, with
its backoff and report; after an NM restart the node's final file already on the store is kept
when it holds every local log, and a rewritten one still names the app's owner."""
from __future__ import annotations

from pathlib import Path

from local_app_logs import APP, C1, C2, C3, NODE, OTHER, write_stdout
from nodemanager.log_aggregation import LogAggregationPlanner
from nodemanager.log_aggregation_service import LogAggregationService
from protocol.aggregated_logs import RemoteLogDir, app_node_logs, node_file_name, read_log
from protocol.internal_api import LogAggregationStatus as S


class _UnlistableStore(RemoteLogDir):
    def __init__(self, url: str):
        super().__init__(url)
        self.listings = 0

    def names(self, app_id: str) -> list[str]:
        self.listings += 1
        raise OSError("store unreachable")


async def test_a_store_that_cannot_list_is_a_failed_try_backed_off_and_reported(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    write_stdout(logs, APP, C1, "out\n")
    store = _UnlistableStore(str(tmp_path / "remote"))
    now = [100.0]
    svc = LogAggregationService(store, str(logs), NODE, LogAggregationPlanner(0.0, 0.0), lambda: {APP: "alice"},
                                clock=lambda: now[0])
    svc.app_finished(APP)
    await svc.run_once()
    [r] = svc.pending_reports()
    assert r.status == S.FAILED and "failed 1 time(s)" in r.diagnostics and "store unreachable" in r.diagnostics
    assert store.listings == 1
    now[0] = 100.5                      # within the backoff: the store is left alone
    await svc.run_once()
    assert store.listings == 1
    now[0] = 101.0
    await svc.run_once()
    assert store.listings == 2
    [r] = svc.pending_reports()
    assert r.status == S.FAILED and "failed 2 time(s), next try in 2 s" in r.diagnostics
    assert (logs / APP / C1 / "stdout").exists()


async def test_a_restarted_nm_keeps_its_final_files_and_their_owner(tmp_path: Path) -> None:
    """The first run uploaded APP's and OTHER's final files (owners known). After a restart (no
    container records: the owners unknown) the RM says both apps are over: APP's file holds every
    local log and stays as it was; OTHER ran one more container here since, so its file is written
    again, whole, still naming OTHER's owner."""
    logs = tmp_path / "logs"
    remote = tmp_path / "remote"
    write_stdout(logs, APP, C1, "done before the restart\n")
    write_stdout(logs, OTHER, C2, "part one\n")
    store = RemoteLogDir(str(remote))
    first = LogAggregationService(store, str(logs), NODE, LogAggregationPlanner(0.0, 3600.0),
                                  lambda: {APP: "alice", OTHER: "bob"})
    first.app_finished(APP)
    first.app_finished(OTHER)
    await first.run_once()
    app_file = (remote / APP / node_file_name(NODE)).read_bytes()
    write_stdout(logs, OTHER, C3, "part two\n")

    again = LogAggregationService(store, str(logs), NODE, LogAggregationPlanner(0.0, 3600.0), lambda: {})
    again.app_finished(APP)
    again.app_finished(OTHER)
    await again.run_once()
    assert (remote / APP / node_file_name(NODE)).read_bytes() == app_file       # not uploaded again
    [node] = app_node_logs(store, OTHER)
    assert node.final and node.user == "bob"
    assert read_log(store, OTHER, node, C2, "stdout") == b"part one\n"
    assert read_log(store, OTHER, node, C3, "stdout") == b"part two\n"
    assert sorted((r.app_id, r.status) for r in again.pending_reports()) == [(APP, S.SUCCEEDED), (OTHER, S.SUCCEEDED)]
