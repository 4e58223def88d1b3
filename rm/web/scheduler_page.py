"""The RM web UI's scheduler page, `/cluster/scheduler`: queues with their capacity and use, their
capacity preemption (guaranteed / used / pending / ideal / being reclaimed), the active policy and its recent decisions (the RM's decision log) with their reasons."""
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
# Capacity preemption per queue (docs/preemption.md): its guarantee, what it holds and waits for,
# its ideal share at the last reclaim round and what is being taken back from it now.
RECLAIM_COLUMNS = (
    Column("Queue", "queueName"),
    Column("Guaranteed memory", "guaranteedResource.memory", "mb"),
    Column("Guaranteed vcores", "guaranteedResource.vCores", "int"),
    Column("Used memory", "resourcesUsed.memory", "mb"), Column("Used vcores", "resourcesUsed.vCores", "int"),
    Column("Pending memory", "pendingResource.memory", "mb"), Column("Pending vcores", "pendingResource.vCores", "int"),
    Column("Ideal memory", "idealResource.memory", "mb"), Column("Ideal vcores", "idealResource.vCores", "int"),
    Column("Being reclaimed memory", "beingReclaimed.memory", "mb"),
    Column("Being reclaimed vcores", "beingReclaimed.vCores", "int"),
    Column("Preempted memory", "preemptedResourceMB", "mb"),
    Column("Executors shrunk", "numContainersShrunk", "int"),
    Column("Containers killed", "numContainersKilledByPreemption", "int"),
    Column("Opted out", "preemptionDisabled"),
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
    reclaim = live_table("reclaim", SCHEDULER, [*root, "queues", "queue"], RECLAIM_COLUMNS, info["queues"]["queue"],
                         now_ms, empty="no queues")
    decisions = live_table("decisions", SCHEDULER, [*root, "elastanePolicy", "decisions"], DECISION_COLUMNS,
                           info["elastanePolicy"]["decisions"], now_ms, sort_key="time", descending=True,
                           empty="no directive changed yet")
    body = (f"<h1>Scheduler</h1><p>Capacity scheduler, policy <b>{escape(rm.core.cfg.policy)}</b> "
            f"(every {rm.policy_interval_s:g} s).</p><h2>Queues</h2>{queues}"
            f"<h2>Capacity preemption</h2><p>Mode <b>{escape(rm.core.cfg.preemption)}</b>: each round, a queue "
            f"over its ideal share gives back to queues below theirs, elastic jobs by a live shrink first."
            f"</p>{reclaim}"
            f"<h2>Recent decisions</h2><p>The directives the policy (or an operator's "
            f"<code>elastane ps scale</code>) changed, newest first.</p>{decisions}")
    return page("Scheduler", body, active="/cluster/scheduler")


__all__ = ["DECISION_COLUMNS", "QUEUE_COLUMNS", "RECLAIM_COLUMNS", "render_scheduler_page"]
