"""Builds the policy's cluster snapshot from the core and applies its directives (pure)."""
from __future__ import annotations

from protocol import internal_api as api
from protocol.records import ZERO

from .core import ResourceManagerCore
from .policies import AppView, ClusterSnapshot, NodeView, Policy


def build_snapshot(core: ResourceManagerCore) -> ClusterSnapshot:
    """The policy's view of `core` now: nodes, apps known to the scheduler, their demand and limits."""
    nodes = tuple(NodeView(n.node_id, n.rack, n.state.value, n.capability, n.used) for n in core.nodes)
    apps = []
    for sa in core.scheduler.apps.values():
        app = core.apps[sa.app_id]
        pending = sa.am_request or ZERO
        for a in sa.asks.values():
            pending = pending + a.resource.scale(a.count)
        # An AM request not yet activated is held back by the queue's AM limit (am_active is set on
        # activation and the request cleared once the AM container is allocated).
        am_limited = sa.am_request is not None and not sa.am_active
        apps.append(AppView(app.app_id, app.queue, app.user, app.state.value, app.submit_time, sa.used,
                            app.shape, app.elastane, am_resource=app.am.resource, pending=pending,
                            directive=app.directive, am_limited=am_limited))
    used = sum((q.used for q in core.scheduler.queues.values()), ZERO)
    return ClusterSnapshot(now=core.clock(), total=core.nodes.total, used=used, nodes=nodes, apps=tuple(apps),
                           minimum_allocation_mb=core.scheduler.min_mb)


def apply_directives(core: ResourceManagerCore, directives: dict[str, api.ShapeDirective]) -> int:
    """Store new directives on their apps (delivered on the AM's next allocate); returns how many changed."""
    changed = 0
    for app_id, d in directives.items():
        app = core.apps.get(app_id)
        if app is None or app.state.is_final:
            continue
        cur = app.directive
        if cur is not None and (cur.workers, cur.servers, cur.nodes) == (d.workers, d.servers, d.nodes):
            continue
        app.directive_version += 1
        app.directive = api.ShapeDirective(workers=d.workers, servers=d.servers, nodes=list(d.nodes),
                                           reason=d.reason, version=app.directive_version)
        changed += 1
    return changed


def run_policy(core: ResourceManagerCore, policy: Policy) -> int:
    """One policy round: decide on a fresh snapshot and store the directives; returns how many changed."""
    return apply_directives(core, policy.decide(build_snapshot(core)))
