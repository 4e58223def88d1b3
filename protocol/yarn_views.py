"""The RM's YARN REST views as their readers see them: TypedDicts of the JSON objects that
rm/rest_views.py writes (GET /ws/v1/cluster/apps, /nodes, /apps/{id}/appattempts, /apps/{id}/shape).

They stay dicts -- YARN's wire form, with keys clients of YARN's API know -- so they are TypedDicts,
not Structs. `total=False`: a reader goes through `.get` for what an older RM may not send. The
Elastane extensions that are records of their own keep their own type: an app's `shape` and a
shape view's `current` are `protocol.job_report.JobReport.to_json()` (decode with
`JobReport.decode`).
"""
from __future__ import annotations

from typing import Optional, TypedDict

from protocol.json_types import JsonObject


class AppView(TypedDict, total=False):
    """One app (YARN's `app` object, rest_views.app_json)."""

    id: str
    user: str
    name: str
    queue: str
    state: str
    finalStatus: str
    progress: float
    trackingUI: str
    trackingUrl: str
    diagnostics: str
    clusterId: int
    applicationType: str
    applicationTags: str
    priority: int
    startedTime: int
    launchTime: int
    finishedTime: int
    elapsedTime: int
    amContainerLogs: str
    amHostHttpAddress: str
    amRPCAddress: str
    allocatedMB: int
    allocatedVCores: int
    reservedMB: int
    reservedVCores: int
    runningContainers: int
    memorySeconds: int
    vcoreSeconds: int
    queueUsagePercentage: float
    clusterUsagePercentage: float
    logAggregationStatus: str
    unmanagedApplication: bool
    amNodeLabelExpression: str
    maxAppAttempts: int
    timeouts: JsonObject              # {"timeout": [{"type": "LIFETIME", "expiryTime", "remainingTimeInSeconds"}]}
    elastane: JsonObject              # the submission's extension (a PS job's spec under "ps-job")
    shape: JsonObject                 # the AM's last JobReport (JobReport.to_json)
    resourceUtilization: JsonObject


class NodeView(TypedDict, total=False):
    """One node (YARN's `node` object, rest_views.node_json)."""

    rack: str
    state: str
    id: str
    nodeHostName: str
    nodeLabels: list[str]
    nodeHTTPAddress: str
    nodeHttpAddress: str              # not written by this RM: the spelling of YARN's attempt record, read as a fallback
    lastHealthUpdate: int
    lastHeartbeat: int
    version: str
    healthReport: str
    numContainers: int
    usedMemoryMB: int
    availMemoryMB: int
    usedVirtualCores: int
    availableVirtualCores: int
    totalResource: dict[str, int]
    resourceUtilization: JsonObject


class AttemptView(TypedDict, total=False):
    """One app attempt (YARN's `appAttempt` object, rest_views.attempt_json)."""

    id: int
    appAttemptId: str
    startTime: int
    finishedTime: int
    containerId: str
    nodeHttpAddress: str
    nodeId: str
    logsLink: str
    blacklistedNodes: str
    appAttemptState: str
    diagnosticsInfo: str


class PlacementView(TypedDict):
    node: str
    workers: int
    servers: int


class DirectiveView(TypedDict, total=False):
    """The policy's latest directive for a PS job (a shape view's `directive`)."""

    workers: int
    servers: int
    nodes: list[str]
    reason: str
    version: int
    group: Optional[str]
    runState: str
    executorResource: Optional[dict[str, int]]
    placement: list[PlacementView]


class ShapeView(TypedDict, total=False):
    """Elastane's GET /ws/v1/cluster/apps/{id}/shape (rest_views.shape_json), and the `shape` a
    PUT of a directive answers with."""

    appId: str
    policy: str
    current: Optional[JsonObject]      # JobReport.to_json of the AM's last report
    directive: Optional[DirectiveView]
    directiveDelivered: bool
    history: list[JsonObject]
    samples: list[JsonObject]
    decisions: list[JsonObject]


NewApplicationView = TypedDict("NewApplicationView", {
    "application-id": str,
    "maximum-resource-capability": dict[str, int],
}, total=False)
"""POST /ws/v1/cluster/apps/new-application's answer."""
