"""Where an app's log aggregation stands, for the RM's app view (YARN's logAggregationStatus).

Each NM reports per app how its uploads to cluster.toml's remote_app_log_dir go
(protocol.internal_api.LogAggregationReport, sent when it changes and in full at registration);
this book keeps each node's last report and folds them into one status as YARN's RMAppImpl does:
- DISABLED: the cluster has no remote_app_log_dir;
- NOT_START: no node the app ran on has uploaded anything yet (also an app that ran nowhere);
- RUNNING / RUNNING_WITH_FAILURE: some nodes uploaded (rolling uploads while the app runs, final
  ones once it ended), and (for the latter) some node's last upload failed;
- once the app is over and every node has finished: SUCCEEDED, or FAILED if a node's final upload
  failed (the NM keeps its local copies and tries again: a later success turns it SUCCEEDED), or
  TIME_OUT if a node had not finished TIMEOUT_S after the app did (a node lost and not back).
Pure: the time is an argument. In memory only, like YARN's: after an RM restart a finished app's
status is rebuilt from what its nodes report when they register again.
"""
from __future__ import annotations

from typing import AbstractSet, Mapping

from protocol.internal_api import LogAggregationReport
from protocol.internal_api import LogAggregationStatus as S

from .model import App

TIMEOUT_S = 600.0       # YARN's yarn.log-aggregation-status.time-out.ms (10 minutes)
FINISHED = frozenset({S.SUCCEEDED, S.FAILED, S.TIME_OUT})


def app_status(enabled: bool, nodes: AbstractSet[str], reports: Mapping[str, LogAggregationReport], final: bool,
               finished_at: float, now: float, timeout_s: float = TIMEOUT_S) -> S:
    """The app's status from the last report of each node it ran on (a node with none: NOT_START)."""
    if not enabled:
        return S.DISABLED
    per_node = [reports[n].status if n in reports else S.NOT_START for n in nodes | reports.keys()]
    if final and now - finished_at >= timeout_s:
        per_node = [s if s in FINISHED else S.TIME_OUT for s in per_node]
    if all(s == S.NOT_START for s in per_node):
        return S.NOT_START
    if final and all(s in FINISHED for s in per_node):
        return S.FAILED if S.FAILED in per_node else S.TIME_OUT if S.TIME_OUT in per_node else S.SUCCEEDED
    return S.RUNNING_WITH_FAILURE if S.RUNNING_WITH_FAILURE in per_node else S.RUNNING


class LogAggregationBook:
    """Each node's last log aggregation report per app, and the app status they add up to."""

    def __init__(self, enabled: bool, timeout_s: float = TIMEOUT_S):
        self.enabled = enabled
        self.timeout_s = timeout_s
        self.by_app: dict[str, dict[str, LogAggregationReport]] = {}

    def forget(self, app_id: str) -> None:
        """Drop what is kept of an app the RM forgets (rm/core.py `_forget_completed`)."""
        self.by_app.pop(app_id, None)

    def report(self, node_id: str, report: LogAggregationReport) -> None:
        self.by_app.setdefault(report.app_id, {})[node_id] = report

    def status(self, app: App, now: float) -> S:
        return app_status(self.enabled, app.nodes_used, self.by_app.get(app.app_id, {}), app.state.is_final,
                          app.finish_time, now, self.timeout_s)
