"""The RM web UI's scheduler page, `/cluster/scheduler`: queues with their capacity and use, the
active policy and its recent decisions (the RM's decision log) with their reasons."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .. import rest_views as views
from .layout import Column, escape, live_table, page

if TYPE_CHECKING:
    from ..context import RmContext

SCHEDULER = "/ws/v1/cluster/scheduler"

QUEUE_COLUMNS = (
    Column("Queue", "queueName"), Column("Capacity", "capacity", "pct"), Column("Max capacity", "maxCapacity", "pct"),
    Column("Used (of capacity)", "usedCapacity", "pct"), Column("Used (of cluster)", "absoluteUsedCapacity", "pct"),
    Column("Apps", "numApplications", "int"), Column("Active", "numActiveApplications", "int"),
    Column("Pending", "numPendingApplications", "int"), Column("Containers", "numContainers", "int"),
    Column("Memory used", "resourcesUsed.memory", "mb"), Column("VCores used", "resourcesUsed.vCores", "int"),
    Column("AM limit", "AMResourceLimit.memory", "mb"),
)
DECISION_COLUMNS = (
    Column("When", "time", "age"), Column("Application", "appId", "app"), Column("Version", "version", "int"),
    Column("Workers", "workers", "int"), Column("Servers", "servers", "int"),
    Column("Placement", "placement", "placement"), Column("Group", "group"), Column("Run state", "runState"),
    Column("Reason", "reason"),
)


def render_scheduler_page(rm: "RmContext", now_ms: float) -> str:
    """The scheduler page."""
    info = views.scheduler_info(rm.core)["scheduler"]["schedulerInfo"]
    root = ["scheduler", "schedulerInfo"]
    queues = live_table("queues", SCHEDULER, [*root, "queues", "queue"], QUEUE_COLUMNS, info["queues"]["queue"],
                        now_ms, empty="no queues")
    decisions = live_table("decisions", SCHEDULER, [*root, "elastanePolicy", "decisions"], DECISION_COLUMNS,
                           info["elastanePolicy"]["decisions"], now_ms, sort_key="time", descending=True,
                           empty="no directive changed yet")
    body = (f"<h1>Scheduler</h1><p>Capacity scheduler, policy <b>{escape(rm.core.cfg.policy)}</b> "
            f"(every {rm.policy_interval_s:g} s).</p><h2>Queues</h2>{queues}"
            f"<h2>Recent decisions</h2><p>The directives the policy (or an operator's "
            f"<code>elastane ps scale</code>) changed, newest first.</p>{decisions}")
    return page("Scheduler", body, active="/cluster/scheduler")


__all__ = ["DECISION_COLUMNS", "QUEUE_COLUMNS", "render_scheduler_page"]
