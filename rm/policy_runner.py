"""Builds the policy's cluster snapshot from the core and applies its Decision as directives (pure).

Two ways to run a round: `run_policy` decides and applies at once (the simulator, tests); the RM
server decides off its event loop (rm/server.py): `start_round` takes the snapshot and the core's
`policy_version` on the loop, `decide_on_copy` runs in a worker thread on a copy of the policy,
and `finish_round` applies the Decision on the loop only if the core has not moved since the
snapshot -- else the Decision and the copy (with whatever state the policy advanced for it: Dorm's
solved-for key, EPS's trials) are dropped and the live policy decides again on a fresh snapshot.

After an RM restart or failover both ways are held (`policy_held`) while the recovered cluster is
still coming back, and the first rounds after it count their reshapes (rm/policy_resync.py).
"""
from __future__ import annotations

import copy
import dataclasses
import functools
from dataclasses import dataclass
from typing import Optional

from protocol.internal_api import NodePlacement
from protocol.records import ZERO, AppState, AttemptState, NodeState, Resource

from .core import ResourceManagerCore
from .directive_retry import again, has_room, lacking
from .model import App
from .policies import AppView, ClusterSnapshot, Decision, NodeView, Policy
from .policies.node_drain import drain_moves, draining_nodes
from .policies.snapshot import ENDED_WINDOW_S
from .policy_resync import PolicyResync, reshapes
from .reclaim_runner import reclaim_and_guard
from .state_machines import attempt_is_final


def executors_of(core: ResourceManagerCore, app: App) -> tuple[NodePlacement, ...]:
    """Per node (sorted), the workers and servers the app's current attempt holds (AM excluded)."""
    attempt = core.attempts.get(app.current_attempt or "")
    if attempt is None:
        return ()
    counts: dict[str, list[int]] = {}
    for cid in attempt.containers:
        c = core.containers.get(cid)
        if c is None or c.is_am:
            continue
        counts.setdefault(c.node_id, [0, 0])[1 if c.tag == "server" else 0] += 1
    return tuple(NodePlacement(node=n, workers=w, servers=s) for n, (w, s) in sorted(counts.items()))


def build_snapshot(core: ResourceManagerCore) -> ClusterSnapshot:
    """The policy's view of `core` now: nodes, apps known to the scheduler, their demand and limits."""
    nodes = tuple(NodeView(n.node_id, n.rack, n.state, n.capability, n.used,
                           sum((r.resource for r in n.releasing.values()), ZERO)) for n in core.nodes)
    apps = []
    executors_on: dict[str, dict[str, Resource]] = {}
    am_node: dict[str, str] = {}
    for c in core.containers.values():
        if c.is_am:
            am_node[c.app_id] = c.node_id
        else:
            on = executors_on.setdefault(c.app_id, {})
            on[c.node_id] = on.get(c.node_id, ZERO) + c.resource
    for sa in core.scheduler.apps.values():
        app = core.apps[sa.app_id]
        pending = sa.am_request or ZERO
        for a in sa.asks.values():
            pending = pending + a.resource.scale(a.count)
        # An AM request not yet activated is held back by the queue's AM limit (am_active is set on
        # activation and the request cleared once the AM container is allocated).
        am_limited = sa.am_request is not None and not sa.am_active
        apps.append(AppView(app.app_id, app.queue, app.user, app.state, app.submit_time, sa.used,
                            app.shape, app.ps, am_resource=app.am.resource, pending=pending,
                            directive=app.directive, am_limited=am_limited, executors=executors_of(core, app),
                            executors_on=tuple(sorted(executors_on.get(app.app_id, {}).items())),
                            am_node=am_node.get(app.app_id)))
    used = sum((q.used for q in core.scheduler.queues.values()), ZERO)
    return executor_partition(core, ClusterSnapshot(now=core.clock(), total=core.nodes.total, used=used, nodes=nodes,
                                                    apps=tuple(apps), minimum_allocation_mb=core.scheduler.min_mb,
                                                    ended=recently_ended(core)))


def recently_ended(core: ResourceManagerCore) -> dict[str, str]:
    """Final status by app id of the apps that ended in the last ENDED_WINDOW_S, newest first
    (`core.completed` is in finish order: only its tail is read)."""
    since = core.clock() - ENDED_WINDOW_S
    out: dict[str, str] = {}
    for app_id in reversed(core.completed):
        app = core.apps.get(app_id)
        if app is None:
            continue
        if (app.finish_time or 0.0) < since:
            break
        out[app_id] = app.final_status.value
    return out


def executor_partition(core: ResourceManagerCore, snapshot: ClusterSnapshot) -> ClusterSnapshot:
    """The snapshot as the policies plan executors on it: the unlabelled nodes only. A labelled
    node is an exclusive partition (protocol/node_labels.py) no executor may go to, so a policy that
    saw it would place jobs where the scheduler never will; with an `am_node_label` the AMs live
    there too, so they take no room from the policy's nodes (am_resource and am_node cleared).
    Unchanged on a cluster without labels."""
    labelled = {n.node_id for n in core.nodes if n.labels}
    if not labelled and not core.cfg.am_node_label:
        return snapshot
    nodes = tuple(v for v in snapshot.nodes if v.node_id not in labelled)
    running = [core.nodes.nodes[v.node_id] for v in nodes if v.node_id in core.nodes.running]
    # As NodeTracker.total: what the partition's draining and unhealthy nodes still run counts in.
    kept = set(core.nodes.held())
    held = [core.nodes.nodes[v.node_id] for v in nodes if v.node_id in kept]
    apps = snapshot.apps
    if core.cfg.am_node_label:
        # An AM granted on a labelled node is out of the partition: out of what its app holds too
        # (the policies take `resources - am_resource` as the executors' room; with am_resource
        # cleared, an AM left in `resources` was one AM's worth of phantom room per running job).
        apps = tuple(dataclasses.replace(
            a, am_resource=ZERO, am_node=None,
            resources=a.resources - a.am_resource if a.am_node in labelled else a.resources) for a in apps)
    return dataclasses.replace(snapshot, nodes=nodes, apps=apps,
                               total=sum((n.capability for n in running), sum((n.used for n in held), ZERO)),
                               used=sum((n.used for n in running + held), ZERO))


def apply_decision(core: ResourceManagerCore, decision: Decision) -> int:
    """Turn each job decision into its app's directive (delivered on the AM's next allocate),
    numbering it only when it changes what the app's current directive says (shape, placement,
    group or run state; a new reason alone is not a change); returns how many changed. A changed
    app is written to the state store with its directive (a new active RM knows it)."""
    changed = 0
    for app_id, jd in decision.jobs.items():
        app = core.apps.get(app_id)
        if app is None or app.state.is_final or jd.same_as(app.directive):
            continue
        app.directive_version += 1
        app.directive = jd.directive(app.directive_version)
        core.decisions.record(core.clock(), app_id, app.directive)
        core.dirty.add(app_id)
        changed += 1
    changed += send_short_again(core)
    if changed:
        core.policy_changed()
    return changed


def send_short_again(core: ResourceManagerCore) -> int:
    """Number anew the directives their jobs acted on and came short of, where the backoff says so
    (rm/directive_retry.py); returns how many."""
    retries, now, n = core.directive_retries, core.clock(), 0
    for app_id in [a for a in retries.apps if a not in core.apps or core.apps[a].state.is_final]:
        retries.forget(app_id)
    free: dict[str, Resource] = {}       # per RUNNING node, counted at the first retry that is due

    def room(app: App) -> bool:
        d, report = app.directive, app.shape
        executor = (d.executor_resource if d is not None else None) or (app.ps.executor if app.ps else None)
        if d is None or report is None or executor is None:
            return False
        if not free:
            free.update((node.node_id, node.capability - node.used) for node in core.nodes
                        if node.state == NodeState.RUNNING)
        return has_room(lacking(d, report, executors_of(core, app)), executor, free)

    for app in core.apps.values():
        if app.state != AppState.RUNNING or app.directive is None:
            continue
        if retries.due(app.app_id, app.directive, app.shape, now, functools.partial(room, app)):
            app.directive_version += 1
            app.directive = again(app.directive, app.directive_version, retries.apps[app.app_id].retries)
            retries.renumbered(app.app_id, app.directive_version)
            core.decisions.record(now, app.app_id, app.directive)
            core.dirty.add(app.app_id)
            n += 1
    return n


def resync_waiting(core: ResourceManagerCore, rs: PolicyResync) -> list[str]:
    """What the recovered cluster still lacks before the policy may decide (rm/policy_resync.py):
    the stored state's nodes not registered again, kept attempts whose AM has not registered again
    and allocated (a PS job's with its job report)."""
    known = set(core.nodes.nodes)
    out = [f"node {n} to register again" for n in sorted(rs.nodes - known)]
    for aid in sorted(rs.attempts):
        at = core.attempts.get(aid)
        app = core.apps.get(at.app_id) if at is not None else None
        if (at is None or app is None or app.state.is_final or app.current_attempt != aid
                or attempt_is_final(at.state) or at.state == AttemptState.FINISHING):
            continue    # ended or replaced: nothing of it to wait for
        if not at.registered:
            out.append(f"the AM of {app.app_id} to register again")
        elif at.response_id == 0 or (app.ps is not None and app.shape is None):
            out.append(f"the first {'job report' if app.ps is not None else 'allocate'} of {app.app_id}'s AM")
    return out


def policy_held(core: ResourceManagerCore) -> bool:
    """Whether this policy round is held for the resync after a recovery; releases the hold once
    nothing is missing or its deadline has passed (counted as a held round when held)."""
    rs = core.policy_resync
    if rs is None or not rs.holding:
        return False
    now = core.clock()
    rs.waiting_for = resync_waiting(core, rs)
    if rs.waiting_for and now < rs.deadline:
        rs.held_rounds += 1
        core.counters["policy_rounds_held"] += 1
        return True
    running = frozenset(n.node_id for n in core.nodes if n.state == NodeState.RUNNING)
    why = (f"after {now - rs.started_at:.1f}s, still missing: {'; '.join(rs.waiting_for)}" if rs.waiting_for
           else f"everything back after {now - rs.started_at:.1f}s")
    rs.release(now, why, running)
    return False


def apply_round(core: ResourceManagerCore, decision: Decision) -> int:
    """`apply_decision` for a policy round: in the counted rounds after a recovery, the directives
    that change a running job's shape are counted first (`reshapes_after_failover`)."""
    rs = core.policy_resync
    if rs is None or not rs.counting:
        return apply_decision(core, decision)
    n = 0
    for app_id, jd in decision.jobs.items():
        app = core.apps.get(app_id)
        if (app is not None and app.state == AppState.RUNNING and not jd.same_as(app.directive)
                and reshapes(jd, app.directive, app.shape)):
            n += 1
    changed = apply_decision(core, decision)
    rs.rounds += 1
    rs.reshapes += n
    core.counters["reshapes_after_failover"] += n
    return changed


def run_policy(core: ResourceManagerCore, policy: Policy) -> int:
    """One policy round: decide on a fresh snapshot, run the capacity reclaim on the same snapshot
    (rm/reclaim_runner.py: the Decision guarded, the reclaim's shrinks laid over it) and store the
    directives; returns how many changed (0, deciding nothing, while held after a recovery)."""
    if policy_held(core):
        return 0
    snapshot = build_snapshot(core)
    return apply_round(core, with_drain(core, snapshot, reclaim_and_guard(core, snapshot, policy.decide(snapshot))))


def with_drain(core: ResourceManagerCore, snapshot: ClusterSnapshot, decision: Decision) -> Decision:
    """`decision` with the elastic jobs' moves off DECOMMISSIONING nodes laid over it
    (rm/policies/node_drain.py); the containers are walked only while a node drains."""
    if not draining_nodes(snapshot):
        return decision
    return drain_moves(snapshot, decision, executor_roles(core))


def executor_roles(core: ResourceManagerCore) -> dict[str, dict[str, tuple[int, int]]]:
    """Per PS app, per node, its current attempt's (workers, servers) by their containers' tags."""
    out: dict[str, dict[str, list[int]]] = {}
    for c in core.containers.values():
        if c.is_am or c.tag not in ("worker", "server"):
            continue
        app = core.apps.get(c.app_id)
        if app is None or app.ps is None or app.current_attempt != c.attempt_id:
            continue
        out.setdefault(c.app_id, {}).setdefault(c.node_id, [0, 0])[c.tag == "server"] += 1
    return {a: {n: (w, s) for n, (w, s) in nodes.items()} for a, nodes in out.items()}


@dataclass(frozen=True)
class PolicyRound:
    """A round started on the loop: the snapshot the policy decides on and the core's
    `policy_version` when it was taken."""

    version: int
    snapshot: ClusterSnapshot


@dataclass(frozen=True)
class Decided:
    """What a round's decide produced: the Decision and the policy copy that took it (its state
    advanced by this decide; the caller keeps it only if the Decision is applied)."""

    policy: Policy
    decision: Decision


def start_round(core: ResourceManagerCore) -> PolicyRound:
    """Snapshot the core for a decide that runs elsewhere (call on the core's thread)."""
    return PolicyRound(core.policy_version, build_snapshot(core))


def decide_on_copy(policy: Policy, snapshot: ClusterSnapshot) -> Decided:
    """Decide on a deep copy of `policy` (safe in a worker thread: the live policy, which the RM's
    pages read, is not touched, and a dropped Decision leaves it as it was)."""
    trial = copy.deepcopy(policy)
    return Decided(trial, trial.decide(snapshot))


def is_stale(core: ResourceManagerCore, rnd: PolicyRound) -> bool:
    """The core has changed in a way the round's snapshot does not show."""
    return core.policy_version != rnd.version


def finish_round(core: ResourceManagerCore, rnd: PolicyRound, decision: Decision) -> Optional[int]:
    """Apply `decision` if the core has not moved past `rnd`'s snapshot, with the capacity reclaim
    run on that snapshot (as `run_policy`): how many directives changed; None when it has moved
    (the Decision is dropped, nothing changes)."""
    if is_stale(core, rnd):
        return None
    return apply_round(core, with_drain(core, rnd.snapshot, reclaim_and_guard(core, rnd.snapshot, decision)))
