"""The cluster snapshot a policy decides on: plain, immutable data (the simulator builds the same)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from protocol.records import Resource


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
    shape: Optional[dict] = None        # what the AM reported in AllocateRequest.shape
    elastane: Optional[dict] = None     # the app's `elastane` submission extension (job spec)


@dataclass(frozen=True)
class ClusterSnapshot:
    """Everything a policy may look at; `now` is seconds since the epoch (the RM's clock)."""

    now: float
    total: Resource
    used: Resource
    nodes: tuple[NodeView, ...] = field(default_factory=tuple)
    apps: tuple[AppView, ...] = field(default_factory=tuple)
