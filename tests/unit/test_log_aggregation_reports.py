"""The NM's side of log aggregation's talk with the RM (nodemanager/log_aggregation.py's reports,
log_aggregation_service.py's start, rm_link.py): per-app reports (YARN's LogAggregationReport)
change with the uploads and wait until the RM took them; a restarted NM takes up the log dirs a
previous run left, names them at registration, and aggregates and frees them when the RM says
the app is over."""
from __future__ import annotations

import asyncio
from pathlib import Path

from nodemanager.container_manager import ContainerManager
from nodemanager.enforcement import Enforcement
from nodemanager.log_aggregation import LocalLogFile, LogAggregationPlanner
from nodemanager.log_aggregation_service import LogAggregationService, app_log_dirs
from nodemanager.recovery_store import RecoveryStore
from nodemanager.rm_link import RMLink
from nodemanager.container import Container
from nodemanager.container_state import ContainerEvent as E
from nm_harness import SECRET, FakeNodeRM
from polling import async_wait_until
from protocol.aggregated_logs import RemoteLogDir, app_node_logs, node_file_name, read_log
from protocol.config import NMConfig
from protocol.internal_api import LogAggregationReport
from protocol.internal_api import LogAggregationStatus as S
from protocol.records import Resource

APP = "application_1700000000000_0007"
OTHER = "application_1700000000000_0008"
C1 = "container_1700000000000_0007_01_000002"
NODE = "127.0.0.1:45454"


def _files(size: int) -> list[LocalLogFile]:
    return [LocalLogFile(C1, "stdout", "/logs/stdout", size)]


def test_reports_follow_the_uploads_and_wait_until_the_rm_took_them() -> None:
    p = LogAggregationPlanner(roll_interval_s=10.0, retention_s=0.0)
    st = p.seen(APP, "alice", now=0.0)
    assert p.pending_reports() == [] and p.all_reports() == []            # NOT_START is the RM's default
    up = p.next_upload(st, _files(5), now=10.0)
    assert up is not None
    p.failed(up, now=10.0, error="store down")
    [r] = p.pending_reports()
    assert r.status == S.RUNNING_WITH_FAILURE and "roll upload failed 1 time(s)" in r.diagnostics
    assert "store down" in r.diagnostics
    up = p.next_upload(st, _files(5), now=11.0)
    assert up is not None
    p.uploaded(up, now=11.0)
    assert p.pending_reports() == [LogAggregationReport(APP, S.RUNNING)]   # replaces the failure
    p.delivered(p.pending_reports())
    assert p.pending_reports() == [] and p.all_reports() == [LogAggregationReport(APP, S.RUNNING)]
    # The app ends; its final upload fails (FAILED: the node tries again), then goes through.
    p.finished(APP, "alice", now=20.0)
    up = p.next_upload(st, _files(9), now=20.0)
    assert up is not None and up.kind == "final"
    p.failed(up, now=20.0, error="store down")
    sent = p.pending_reports()
    assert [x.status for x in sent] == [S.FAILED]
    p.uploaded(up, now=22.0)
    p.delivered(sent)                       # the RM took the FAILED one meanwhile: SUCCEEDED still waits
    assert p.pending_reports() == [LogAggregationReport(APP, S.SUCCEEDED)]
    # Freed and forgotten before the RM heard: the report still goes.
    assert p.to_free(now=22.0) == [APP]
    p.freed(APP)
    assert p.forget(set()) == [APP]
    assert p.pending_reports() == [LogAggregationReport(APP, S.SUCCEEDED)]
    assert p.all_reports() == [LogAggregationReport(APP, S.SUCCEEDED)]
    p.delivered(p.pending_reports())
    assert p.pending_reports() == [] and p.all_reports() == []


def test_a_report_overtaken_on_its_way_is_followed_by_the_current_one() -> None:
    """A failed roll's report is on its way when the retry succeeds, back to what the RM was told
    before (RUNNING): once the RM took the failure, RUNNING goes again (the RM ends with it)."""
    p = LogAggregationPlanner(roll_interval_s=10.0, retention_s=0.0)
    st = p.seen(APP, "alice", now=0.0)
    up = p.next_upload(st, _files(5), now=10.0)
    assert up is not None
    p.uploaded(up, now=10.0)
    p.delivered(p.pending_reports())                 # the RM shows RUNNING
    up = p.next_upload(st, _files(8), now=20.0)
    assert up is not None
    p.failed(up, now=20.0, error="store down")
    on_its_way = p.pending_reports()
    assert [r.status for r in on_its_way] == [S.RUNNING_WITH_FAILURE]
    up = p.next_upload(st, _files(8), now=21.0)
    assert up is not None
    p.uploaded(up, now=21.0)
    p.delivered(on_its_way)
    assert p.pending_reports() == [LogAggregationReport(APP, S.RUNNING)]
    p.delivered(p.pending_reports())
    assert p.pending_reports() == []


def test_only_app_directories_are_taken_up(tmp_path: Path) -> None:
    for d in (APP, OTHER, "application_1_1", "junk", "lost+found"):
        (tmp_path / d).mkdir()
    (tmp_path / "application_1700000000000_0009").write_text("a file")
    assert app_log_dirs(str(tmp_path)) == [APP, OTHER]
    assert app_log_dirs(str(tmp_path / "absent")) == []


async def test_a_restarted_nm_names_its_leftover_logs_and_aggregates_them_when_told(tmp_path: Path) -> None:
    """An NM whose previous run left APP's logs (its containers' records gone: reported) and
    OTHER's container (recovered, still known): both are named at registration; the RM says APP
    is over; APP's logs are aggregated, reported SUCCEEDED and freed, OTHER's stay."""
    logs = tmp_path / "logs"
    (logs / APP / C1).mkdir(parents=True)
    (logs / APP / C1 / "stdout").write_text("out before the restart\n")
    cfg = NMConfig(local_dir=str(tmp_path / "local"), log_dir=str(logs), recovery_dir=str(tmp_path / "rec"),
                   keep_finished_logs_s=0.0)
    manager = ContainerManager(cfg, NODE, "127.0.0.1", 45454, Resource(1024, 2), Enforcement(None),
                               RecoveryStore(cfg.recovery_dir))
    other = "container_1700000000000_0008_01_000001"
    c = Container(other, OTHER, "", "bob", Resource(128, 1), 0.0, str(tmp_path / "local" / OTHER / other),
                  str(logs / OTHER / other), manager.store.exit_file(other))
    for e in (E.LOCALIZED, E.LAUNCHED):
        c.apply(e)
    manager.containers[other] = c
    store = RemoteLogDir(str(tmp_path / "remote"))
    svc = LogAggregationService(store, str(logs), NODE, LogAggregationPlanner(0.0, 0.0),
                                lambda: {x.app_id: x.user for x in manager.containers.values()})
    manager.on_app_finished = svc.app_finished
    manager.logs_held = svc.holds
    rm = await FakeNodeRM().start()
    link = RMLink(rm.url, SECRET, NODE, NODE, Resource(1024, 2), "/default-rack", manager, 50, 3600.0,
                  log_aggregation=svc)
    svc.start()
    task = asyncio.get_running_loop().create_task(link.run())
    try:
        await async_wait_until(lambda: rm.registrations, 15, "the registration")
        assert rm.registrations[0].applications == [APP, OTHER]
        rm.pending_app_cleanup = [APP]
        await async_wait_until(lambda: any(r.app_id == APP and r.status == S.SUCCEEDED
                                           for hb in rm.heartbeats for r in hb.log_aggregation),
                               15, "APP's SUCCEEDED report in a heartbeat")
        [node] = app_node_logs(store, APP)
        assert node.final and node.node_file == node_file_name(NODE)
        assert read_log(store, APP, node, C1, "stdout") == b"out before the restart\n"
        await async_wait_until(lambda: not (logs / APP).exists(), 15, "APP's local logs freed")
        assert link.held_apps() == [OTHER] and svc.pending_reports() == []
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await svc.stop()
        await link.close()
        await rm.stop()
        manager.store.close()
