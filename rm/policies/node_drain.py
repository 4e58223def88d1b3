"""Elastic PS jobs move off a DECOMMISSIONING node, live (graceful decommission, docs/operating.md).

YARN drains a node by waiting for its containers to end, and kills those left at the timeout.
A PS job here can do better: its AM moves executors between nodes without a restart (EPS), so
after every policy round each running elastic job with executors on a draining node is directed
to the same shape with those executors placed on RUNNING nodes that have room (most room first),
its other executors staying where they are. Executors that fit nowhere are given up where the
job's minimums allow (a shrink, as the queue reclaim shrinks jobs); what is left stays, and goes at
the decommission's timeout as any container. The node is DECOMMISSIONED once the AM has removed
them (rm/nm_protocol.py `_drain`).

A job the queue reclaim shrinks this round is shrunk first -- executors on the draining nodes
given up before any other -- and only what the shrink keeps moves, under the shrink's reason
(which the reclaim knows its directives by).

Pure: the policy's snapshot, its Decision and where each job's executors are by role in, the
Decision with the moves laid over it out. A job the policy itself placed off the draining nodes
this round keeps the policy's word; one in the middle of a change, or already directed off them,
is left alone (no directive churn while the AM carries the move out).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from protocol.internal_api import NodePlacement, RunState
from protocol.records import NodeState, Resource

from .decision import Decision, JobDecision
from .eps_jobs import classify, units
from .snapshot import ClusterSnapshot

# app id -> node id -> (workers, servers) of the app's current executors there
RolesOn = Mapping[str, Mapping[str, tuple[int, int]]]


def draining_nodes(snapshot: ClusterSnapshot) -> frozenset[str]:
    return frozenset(n.node_id for n in snapshot.nodes if n.state == NodeState.DECOMMISSIONING)


def drain_moves(snapshot: ClusterSnapshot, decision: Decision, roles_on: RolesOn) -> Decision:
    """`decision` with the moves off the draining nodes laid over it (module doc)."""
    draining = draining_nodes(snapshot)
    if not draining:
        return decision
    room = {n.node_id: n.capacity - n.used + n.releasing for n in snapshot.nodes if n.state == NodeState.RUNNING}
    apps = {a.app_id: a for a in snapshot.apps}
    jobs = dict(decision.jobs)
    for j in classify(snapshot).running:
        on = roles_on.get(j.app_id, {})
        stuck = {node: wc for node, wc in on.items() if node in draining and wc != (0, 0)}
        if not stuck or j.report.changing:
            continue
        decided = jobs.get(j.app_id)
        if decided is not None and decided.placement and not any(p.node in draining for p in decided.placement):
            continue            # the policy moved it this round
        if decided is not None and decided.run_state is not RunState.RUN:
            continue            # paused this round: its executors leave every node, the draining ones too
        d = apps[j.app_id].directive
        if (decided is None and d is not None and d.placement and (d.workers, d.servers) == (j.workers, j.servers)
                and not any(p.node in draining for p in d.placement)):
            continue            # already told: its AM is moving them
        counts = {node: list(wc) for node, wc in on.items() if node not in draining}
        shrink = None
        if decided is not None and decided.run_state is RunState.RUN and decided.workers <= j.workers \
                and decided.servers <= j.servers and (decided.workers, decided.servers) != (j.workers, j.servers):
            # A shrink this round (the queue reclaim's): it is carried out first, taking executors
            # off the draining nodes before any other, and only what it keeps moves -- laid over
            # it at the job's full shape, the move asked for room owed to another queue, and the
            # shrink, never sent, ran out its grace and had the executors killed.
            shrink = decided
            stuck = _shrunk(stuck, counts, (j.workers - decided.workers, j.servers - decided.servers))
        left = [0, 0]           # executors that fit nowhere, per role
        for _node, (w, s) in sorted(stuck.items()):
            for role, n in ((0, w), (1, s)):
                for _ in range(n):
                    target = _roomiest(room, j.executor)
                    if target is None:
                        left[role] += 1
                        continue
                    room[target] = room[target] - j.executor
                    counts.setdefault(target, [0, 0])[role] += 1
        workers = sum(c[0] for c in counts.values())
        servers = sum(c[1] for c in counts.values())
        # Those that fit nowhere: given up down to the job's minimums; the rest stay where they are.
        keep = (max(0, max(1, j.spec.min_workers) - workers), max(0, max(1, j.spec.min_servers) - servers))
        for role in (0, 1):
            stay = min(left[role], keep[role])
            for node, (w, s) in sorted(stuck.items()):
                here = min(stay, (w, s)[role])
                if here:
                    counts.setdefault(node, [0, 0])[role] += here
                    stay -= here
        workers = sum(c[0] for c in counts.values())
        servers = sum(c[1] for c in counts.values())
        placement = tuple(NodePlacement(node, w, s) for node, (w, s) in sorted(counts.items()) if w or s)
        gone = sorted({node for node, _ in on.items() if node in draining})
        why = (f"node{'s' if len(gone) > 1 else ''} {', '.join(gone)} decommissioning: its executors move off it"
               + (f" ({sum(left) - sum(keep)} given up: no room elsewhere)" if sum(left) > sum(keep) else ""))
        # A shrink's reason comes first: the reclaim knows its directives by it (their restore);
        # the rest of its decision (group, executor size) stays.
        jobs[j.app_id] = (JobDecision(workers, servers, placement, reason=why) if shrink is None else
                          replace(shrink, workers=workers, servers=servers, placement=placement,
                                  reason=f"{shrink.reason}; {why}"))
    return Decision(jobs)


def _shrunk(stuck: dict[str, tuple[int, int]], counts: dict[str, list[int]],
            drop: tuple[int, int]) -> dict[str, tuple[int, int]]:
    """Take `drop` (workers, servers) off the job: from the draining nodes' `stuck` executors
    first, then from the others' `counts` (in place); the draining nodes' executors left."""
    left = {node: list(wc) for node, wc in stuck.items()}
    for role in (0, 1):
        n = drop[role]
        for where in (left, counts):
            for node in sorted(where):
                take = min(n, where[node][role])
                where[node][role] -= take
                n -= take
    return {node: (w, s) for node, (w, s) in left.items() if w or s}


def _roomiest(room: dict[str, Resource], executor: Resource) -> str | None:
    """The RUNNING node with room for most executors of this size (ties: by id), None if none has."""
    best, most = None, 0
    for node, free in sorted(room.items()):
        n = units(free, executor)
        if n > most:
            best, most = node, n
    return best


__all__ = ["RolesOn", "drain_moves", "draining_nodes"]
