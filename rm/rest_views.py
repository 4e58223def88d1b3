"""JSON renderings of RM state in YARN's RM REST API shapes (field names as Hadoop's)."""
from __future__ import annotations

import urllib.parse
from typing import Any, Optional

from protocol.app_timeouts import LIFETIME, format_expiry
from protocol import ps_job_spec
from protocol.records import ZERO, AppState, NodeState

from .app_lifetime import remaining_s
from .core import ResourceManagerCore
from .model import App, Attempt, Node
from .utilization_series import LatestReport
from .web.logs_page import container_logs_url

RM_VERSION = "3.3.6-elastane-0.1.0"
DECISIONS_SHOWN = 50     # of the decision log, in GET /ws/v1/cluster/scheduler


def _ms(t: float) -> int:
    return int(t * 1000) if t else 0


def cluster_info(core: ResourceManagerCore, ha: Optional[dict[str, object]] = None) -> dict[str, object]:
    """YARN's clusterInfo; `ha`: an HA RM's fields (haState, the etcd store, its id, epoch and
    reason: rm/ha/ha_http.py `HaEndpoints.info_fields`) in place of a single RM's."""
    info: dict[str, object] = {
        "id": core.cluster_ts, "startedOn": core.cluster_ts, "state": "STARTED", "haState": "ACTIVE",
        "rmStateStoreName": "org.elastane.rm.store.SqliteStateStore",
        "resourceManagerVersion": RM_VERSION, "resourceManagerBuildVersion": RM_VERSION,
        "resourceManagerVersionBuiltOn": "", "hadoopVersion": RM_VERSION, "hadoopBuildVersion": RM_VERSION,
        "hadoopVersionBuiltOn": "", "haZooKeeperConnectionState": "ResourceManager HA is not enabled.",
        "scheduler": "capacityScheduler", "policy": core.cfg.policy,
    }
    if core.policy_resync is not None:
        # Elastane extension: the policy's resync after a recovery (rm/policy_resync.py), with the
        # reshapes of its first rounds (reshapesAfterFailover).
        info["policyResync"] = core.policy_resync.info()
    if ha:
        info.update(ha)
    return {"clusterInfo": info}


def cluster_metrics(core: ResourceManagerCore) -> dict[str, object]:
    by_state = {s: 0 for s in AppState}
    for app in core.apps.values():
        by_state[app.state] += 1
    nodes = core.nodes.counts()
    total = core.nodes.total
    allocated = sum((q.used for q in core.scheduler.queues.values()), ZERO)
    pending = sum(a.count for sa in core.scheduler.apps.values() for a in sa.asks.values())
    return {"clusterMetrics": {
        "appsSubmitted": len(core.apps),
        "appsCompleted": by_state[AppState.FINISHED] + by_state[AppState.FAILED] + by_state[AppState.KILLED],
        "appsPending": sum(by_state[s] for s in (AppState.NEW, AppState.NEW_SAVING, AppState.SUBMITTED,
                                                 AppState.ACCEPTED)),
        "appsRunning": by_state[AppState.RUNNING], "appsFailed": by_state[AppState.FAILED],
        "appsKilled": by_state[AppState.KILLED],
        "reservedMB": 0, "availableMB": max(0, total.memory - allocated.memory), "allocatedMB": allocated.memory,
        "totalMB": total.memory,
        "reservedVirtualCores": 0, "availableVirtualCores": max(0, total.vcores - allocated.vcores),
        "allocatedVirtualCores": allocated.vcores, "totalVirtualCores": total.vcores,
        "containersAllocated": len(core.containers), "containersReserved": 0, "containersPending": pending,
        "totalNodes": len(core.nodes.nodes), "activeNodes": nodes.get(NodeState.RUNNING, 0),
        "lostNodes": nodes.get(NodeState.LOST, 0), "unhealthyNodes": nodes.get(NodeState.UNHEALTHY, 0),
        "decommissioningNodes": nodes.get(NodeState.DECOMMISSIONING, 0), "decommissionedNodes": nodes.get(NodeState.DECOMMISSIONED, 0),
        "rebootedNodes": nodes.get(NodeState.REBOOTED, 0), "shutdownNodes": nodes.get(NodeState.SHUTDOWN, 0),
    }}


def _pct(part: float, whole: float) -> float:
    return round(100.0 * part / whole, 4) if whole > 0 else 0.0


def scheduler_info(core: ResourceManagerCore) -> dict[str, Any]:
    total = core.nodes.total
    queues = []
    all_used = ZERO
    for q in core.scheduler.queues.values():
        all_used = all_used + q.used
        apps = [core.apps[aid] for aid in q.apps if aid in core.apps]
        # As YARN: pending = held back by the queue's AM limit, active = the rest.
        pending = len(q.am.pending)
        am_limit = core.scheduler.am_limit(q)
        guaranteed = q.capacity / 100.0
        queues.append({
            "type": "capacitySchedulerLeafQueueInfo", "queueName": q.name, "queuePath": f"root.{q.name}",
            "state": "RUNNING", "capacity": q.capacity, "maxCapacity": q.max_capacity,
            "usedCapacity": round(q.used.dominant_share(total) / guaranteed * 100.0, 4) if total != ZERO else 0.0,
            "absoluteCapacity": q.capacity, "absoluteMaxCapacity": q.max_capacity,
            "absoluteUsedCapacity": round(q.used.dominant_share(total) * 100.0, 4),
            "numApplications": len(apps), "numActiveApplications": len(apps) - pending,
            "numPendingApplications": pending,
            "maxAMResourcePercent": q.am.fraction,
            "AMResourceLimit": am_limit.to_json(), "userAMResourceLimit": am_limit.to_json(),
            "usedAMResource": q.am.used.to_json(),
            "numContainers": sum(1 for c in core.containers.values() if c.app_id in q.apps),
            "resourcesUsed": q.used.to_json(),
            "users": {"user": [{"username": u, "resourcesUsed": r.to_json()} for u, r in sorted(q.user_used.items())
                               if r != ZERO]} if any(r != ZERO for r in q.user_used.values()) else None,
            **queue_preemption_json(core, q.name),
        })
    return {"scheduler": {"schedulerInfo": {
        "type": "capacityScheduler", "queueName": "root", "capacity": 100.0, "maxCapacity": 100.0,
        "usedCapacity": round(all_used.dominant_share(total) * 100.0, 4),
        "queues": {"queue": queues},
        # Elastane extension: the active policy and its recent directive changes, newest first.
        "elastanePolicy": {"name": core.cfg.policy,
                           "decisions": [r.to_json() for r in core.decisions.recent(DECISIONS_SHOWN)]},
    }}}


def node_json(n: Node, latest: Optional[LatestReport] = None) -> dict[str, object]:
    free = n.free
    out: dict[str, object] = {
        "rack": n.rack, "state": n.state.value, "id": n.node_id, "nodeHostName": n.host,
        "nodeLabels": sorted(n.labels),   # YARN's node info names them so too
        "nodeHTTPAddress": n.http_address, "lastHealthUpdate": _ms(n.last_health_update),
        # Elastane extension: YARN's lastHealthUpdate moves only when the health report changes.
        "lastHeartbeat": _ms(n.last_heartbeat),
        "version": n.version, "healthReport": n.health_report, "numContainers": len(n.containers),
        "usedMemoryMB": n.used.memory, "availMemoryMB": max(0, free.memory),
        "usedVirtualCores": n.used.vcores, "availableVirtualCores": max(0, free.vcores),
        "totalResource": n.capability.to_json(),
    }
    if latest is not None:
        out["resourceUtilization"] = node_utilization_json(latest)
    return out


def node_utilization_json(latest: LatestReport) -> dict[str, object]:
    """YARN's node `resourceUtilization` (CPU in cores) from the node's last report, plus Elastane's
    network, spill and host figures and when the RM received it (`lastUpdate`, epoch ms)."""
    u, p = latest.report, latest.point
    return {
        "nodePhysicalMemoryMB": round(u.memory_mb), "nodeVirtualMemoryMB": round(u.memory_mb),
        "nodeCPUUsage": round(u.cpu_cores, 3),
        "aggregatedContainersPhysicalMemoryMB": round(p.memory_mb),
        "aggregatedContainersVirtualMemoryMB": round(p.memory_mb),
        "containersCPUUsage": round(p.cpu_cores, 3),
        "hostCores": u.host_cores, "hostMemoryTotalMB": round(u.memory_total_mb),
        "netRxBytesPerSec": round(u.net_rx_bytes_per_s, 1), "netTxBytesPerSec": round(u.net_tx_bytes_per_s, 1),
        "spillBytes": u.spill_bytes, "numContainersMeasured": len(latest.containers), "lastUpdate": latest.t_ms,
    }


def app_diagnostics(app: App) -> str:
    """The app's diagnostics, then what capacity preemption did to it (when, why, how much)."""
    notes = [f"Preemption: {n}" for n in app.preemption.notes]
    return "\n".join([app.diagnostics, *notes] if app.diagnostics else notes)


def queue_preemption_json(core: ResourceManagerCore, name: str) -> dict[str, object]:
    """Elastane's capacity-preemption view of a queue: its ideal share at the last reclaim round,
    what it waits for, what is being taken back from it now, and YARN's preempted counters summed
    over its apps (shrunk live, given back on a preemption message, killed)."""
    share = core.queue_shares.get(name)
    rec = core.queue_preemption.get(name)
    out: dict[str, object] = {
        "guaranteedResource": share.guaranteed.to_json() if share else None,
        "idealResource": share.ideal.to_json() if share else None,
        "pendingResource": share.pending.to_json() if share else None,
        "beingReclaimed": core.reclaim_book.being_reclaimed(name).to_json(),
        "preemptionDisabled": any(q.name == name and q.disable_preemption for q in core.cfg.queues),
    }
    if rec is not None:
        out.update(rec.to_json())
        out.update({"numContainersShrunk": rec.shrunk, "numContainersReleasedOnPreemption": rec.released,
                    "numContainersKilledByPreemption": rec.killed})
    return out


def app_json(core: ResourceManagerCore, app: App, rm_url: str = "") -> dict[str, object]:
    """YARN's app view; `rm_url` (the address the caller reached the RM at) prefixes links to the
    RM's own pages."""
    at: Attempt | None = core.attempts.get(app.current_attempt or "")
    now = core.clock()
    used = core.scheduler.apps[app.app_id].used if app.app_id in core.scheduler.apps else ZERO
    live = [core.containers[c] for c in (at.containers if at else ()) if c in core.containers]
    mem_s = app.memory_seconds + sum(c.resource.memory * (now - c.allocated_at) for c in live)
    vc_s = app.vcore_seconds + sum(c.resource.vcores * (now - c.allocated_at) for c in live)
    end = app.finish_time or now
    total = core.nodes.total
    am_http = at.am_node_http_address if at is not None and at.am_container_id else ""
    am_logs = am_logs_link(core, app, at, rm_url)
    if app.state == AppState.RUNNING and app.tracking_url:
        tracking_ui = "ApplicationMaster"
    elif app.state.is_final:
        tracking_ui = "History"
    else:
        tracking_ui = "UNASSIGNED"
    q = core.scheduler.queues.get(app.queue)
    out: dict[str, object] = {
        "id": app.app_id, "user": app.user, "name": app.name, "queue": app.queue, "state": app.state.value,
        "finalStatus": app.final_status.value, "progress": round(app.progress * 100.0, 2),
        "trackingUI": tracking_ui, "trackingUrl": app.tracking_url, "diagnostics": app_diagnostics(app),
        "clusterId": core.cluster_ts, "applicationType": app.app_type, "applicationTags": "",
        "priority": 0, "startedTime": _ms(app.start_time or app.submit_time), "launchTime": _ms(app.start_time),
        "finishedTime": _ms(app.finish_time),
        "elapsedTime": int(max(0.0, end - (app.start_time or app.submit_time)) * 1000),
        "amContainerLogs": am_logs, "amHostHttpAddress": am_http,
        "amRPCAddress": f"{at.host}:{at.rpc_port}" if at is not None and at.host else "",
        "allocatedMB": used.memory, "allocatedVCores": used.vcores, "reservedMB": 0, "reservedVCores": 0,
        "runningContainers": len(live), "memorySeconds": int(mem_s), "vcoreSeconds": int(vc_s),
        "queueUsagePercentage": _pct(used.memory, total.memory * (q.capacity / 100.0) if q else 0),
        "clusterUsagePercentage": _pct(used.memory, total.memory),
        **app.preemption.to_json(), "logAggregationStatus": core.log_aggregation.status(app, now).value,
        "unmanagedApplication": False,
        "amNodeLabelExpression": "", "maxAppAttempts": app.max_attempts,
        "timeouts": {"timeout": [timeout_json(app, now)]},
    }
    elastane = elastane_json(app)
    if elastane is not None:
        out["elastane"] = elastane
    if app.shape is not None:
        out["shape"] = app.shape.to_json()
    use = core.utilization.apps.get(app.app_id)
    if use is not None and not app.state.is_final:
        # Elastane extension: what its running containers use, from the nodes' latest reports.
        out["resourceUtilization"] = use.to_json()
    return out


def timeout_json(app: App, now: float) -> dict[str, object]:
    """YARN's appTimeout view of the app's LIFETIME: its expiry (UNLIMITED) and the seconds left (-1)."""
    return {"type": LIFETIME, "expiryTime": format_expiry(app.lifetime_expiry),
            "remainingTimeInSeconds": remaining_s(app.lifetime_expiry, now, app.state.is_final)}


def elastane_json(app: App) -> Optional[dict[str, object]]:
    """The app's `elastane` object as the REST API shows it: the extension as submitted, with an
    ELASTANE_PS app's job spec under "ps-job" as the RM holds it (the typed spec encoded, defaults
    applied and the AM's local resources merged: the spec its AM runs)."""
    if app.ps is None:
        return app.extension
    return {ps_job_spec.ELASTANE_FIELD: app.ps.spec.to_json(), **(app.extension or {})}


def am_logs_link(core: ResourceManagerCore, app: App, at: Optional[Attempt], rm_url: str = "") -> str:
    """YARN's amContainerLogs / logsLink: the AM container's page on its NM while the app runs
    there; with log aggregation on, the RM's page of its aggregated logs once the app is over or
    the node is gone (YARN sends those links to its JobHistory server). `rm_url` is the address
    the caller reached the RM at ("" for a link relative to the RM)."""
    if at is None or not at.am_container_id:
        return ""
    node = core.nodes.get(at.am_node_id)
    if core.log_aggregation.enabled and (app.state.is_final or node is None or node.state == NodeState.LOST):
        return rm_url + container_logs_url(app.app_id, at.am_container_id)
    # Each a path segment: a simple-auth user name may hold '/', '?' or '#'.
    cid, user = (urllib.parse.quote(x, safe="") for x in (at.am_container_id, app.user))
    return f"http://{at.am_node_http_address}/node/containerlogs/{cid}/{user}"


def attempt_json(core: ResourceManagerCore, at: Attempt, rm_url: str = "") -> dict[str, object]:
    app = core.apps[at.app_id]
    return {
        "id": at.number, "appAttemptId": at.attempt_id, "startTime": _ms(at.start_time),
        "finishedTime": _ms(at.finish_time), "containerId": at.am_container_id,
        "nodeHttpAddress": at.am_node_http_address, "nodeId": at.am_node_id,
        "logsLink": am_logs_link(core, app, at, rm_url),
        "blacklistedNodes": "", "appAttemptState": at.state.value, "diagnosticsInfo": at.diagnostics,
    }


def shape_json(core: ResourceManagerCore, app: App) -> dict[str, object]:
    """Elastane extension, GET /ws/v1/cluster/apps/{id}/shape: the shape the AM reports, the
    policy's latest directive, the shape changes, the sampled reports and the app's recent directive
    changes (times in ms since the epoch, as YARN's times)."""
    d = app.directive
    return {
        "appId": app.app_id, "policy": core.cfg.policy,
        "current": None if app.shape is None else app.shape.to_json(),
        "directive": None if d is None else {
            "workers": d.workers, "servers": d.servers, "nodes": d.nodes, "reason": d.reason,
            "version": d.version, "group": d.group, "runState": d.run_state.value,
            "executorResource": None if d.executor_resource is None else d.executor_resource.to_json(),
            "placement": [{"node": p.node, "workers": p.workers, "servers": p.servers} for p in d.placement]},
        "directiveDelivered": d is not None and app.delivered_directive_version >= d.version,
        "history": [{"time": _ms(c.t), "before": None if c.before is None else
                     {"workers": c.before[0], "servers": c.before[1]},
                     "after": {"workers": c.after[0], "servers": c.after[1]}}
                    for c in app.shape_history.changes],
        # For the web UI's live charts: the sampled reports and this app's directive changes.
        "samples": [s.to_json() for s in app.shape_history.samples],
        "decisions": [r.to_json() for r in core.decisions.for_app(app.app_id)],
    }
