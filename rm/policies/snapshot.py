"""The cluster snapshot a policy decides on: plain, immutable data (the simulator builds the same)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from protocol.internal_api import NodePlacement, ShapeDirective
from protocol.job_report import JobReport
from protocol.records import ZERO, Resource


@dataclass(frozen=True)
class NodeView:
    node_id: str
    rack: str
    state: str
    capacity: Resource
    used: Resource


@dataclass(frozen=True)
class AppView:
    app_id: str
    queue: str
    user: str
    state: str
    submit_time: float
    resources: Resource                 # currently allocated to the app
    shape: Optional[JobReport] = None   # the AM's latest job report (AllocateRequest.shape)
    elastane: Optional[dict[str, object]] = None   # the app's `elastane` submission extension (job spec)
    am_resource: Resource = ZERO        # the AM container's resource (held once the AM is allocated)
    pending: Resource = ZERO            # demand the scheduler has not granted yet (AM + open asks)
    directive: Optional[ShapeDirective] = None   # the latest directive the RM holds for the app
    # The app's AM request waits for activation by its queue's AM resource limit (rm/am_limit.py):
    # the scheduler will not allocate its AM whatever is free, so freeing resources cannot start it.
    am_limited: bool = False
    # Where the app's executors (its non-AM containers) run now: per node, how many are tagged
    # "worker" and "server" (the PS AM tags its asks with the role; other tags count as workers).
    executors: tuple[NodePlacement, ...] = ()
    # The same containers by the resources they hold per node (node id, resources), in node order:
    # Optimus frees a reshaped job's own executors before placing it anew (containers of one job
    # may differ in size, which the role counts above do not say).
    executors_on: tuple[tuple[str, Resource], ...] = ()
    # The node the AM container runs on (None until it is allocated): the scheduler packs AMs, so a
    # policy that sizes executors to fill nodes must leave each node's actual AMs their room.
    am_node: Optional[str] = None


@dataclass(frozen=True)
class ClusterSnapshot:
    """Everything a policy may look at; `now` is seconds since the epoch (the RM's clock)."""

    now: float
    total: Resource
    used: Resource
    nodes: tuple[NodeView, ...] = field(default_factory=tuple)
    apps: tuple[AppView, ...] = field(default_factory=tuple)
    minimum_allocation_mb: int = 1      # the scheduler rounds container memory up to a multiple of this
