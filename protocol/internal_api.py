"""Messages of the internal API (`/internal/v1/...`): NM <-> RM, AM <-> RM, AM/RM -> NM.

Every call carries a bearer token (protocol.tokens): NMs an `nm` token they mint with the cluster
secret, AMs the `am` token the RM put in their environment, container start/stop the `container`
token the RM signed at allocation. Field names are snake_case JSON; resources use YARN's
`{"memory", "vCores"}`.

RM endpoints
  POST /internal/v1/node/register   NodeRegisterRequest  -> NodeRegisterResponse   (nm token)
  POST /internal/v1/node/heartbeat  NodeHeartbeatRequest -> NodeHeartbeatResponse  (nm token)
  POST /internal/v1/am/register     AmRegisterRequest    -> AmRegisterResponse     (am token)
  POST /internal/v1/am/allocate     AllocateRequest      -> AllocateResponse       (am token)
  POST /internal/v1/am/finish       AmFinishRequest      -> AmFinishResponse       (am token)
NM endpoints
  POST /internal/v1/containers/start        StartContainerRequest -> ContainerStatus (container token)
  POST /internal/v1/containers/{id}/stop    (empty body)          -> ContainerStatus (container token)
  GET  /internal/v1/containers/{id}         -> ContainerStatus                      (container token)
"""
from __future__ import annotations

import enum
from typing import Optional, Sequence

import msgspec

from .job_report import JobReport
from .local_resources import LocalResource
from .records import Resource

NODE_REGISTER = "/internal/v1/node/register"
NODE_HEARTBEAT = "/internal/v1/node/heartbeat"
AM_REGISTER = "/internal/v1/am/register"
AM_ALLOCATE = "/internal/v1/am/allocate"
AM_FINISH = "/internal/v1/am/finish"
CONTAINER_START = "/internal/v1/containers/start"


def container_stop_path(container_id: str) -> str:
    return f"/internal/v1/containers/{container_id}/stop"


def container_status_path(container_id: str) -> str:
    return f"/internal/v1/containers/{container_id}"


class _Msg(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=False):
    pass


# ----- containers -----------------------------------------------------------------------------

class ContainerStatus(_Msg):
    """What an NM knows of one container. `exit_status` is a YARN code (<0) or the process's own."""

    container_id: str
    state: str  # protocol.records.ContainerState value
    exit_status: int = -1000
    diagnostics: str = ""
    resource: Optional[Resource] = None
    pid: Optional[int] = None
    # The container's launch role (ELASTANE_CONTAINER_ROLE: "am", "worker", "server"; "" for none), sent
    # in a NodeRegisterRequest only: an RM that restarted or failed over re-adopts the container of
    # a kept attempt with it as its tag (YARN's NMContainerStatus allocation tags).
    role: str = ""


class WarmStart(_Msg):
    """What a container's command runs, as a module of the NM's Python and its argv: an NM whose
    executor zygote preloaded `module` forks the container from it instead of running the command
    (nodemanager.warm_launcher); any other NM runs the command."""

    module: str
    argv: list[str] = []


class LaunchContext(_Msg):
    """YARN's ContainerLaunchContext, reduced to what Elastane uses (plus the optional warm start)."""

    commands: list[str]
    environment: dict[str, str] = {}
    # YARN's local resources: fetched onto the node and linked into the working dir under their
    # key before the command starts (nodemanager.localizer).
    local_resources: dict[str, LocalResource] = {}
    warm_start: Optional[WarmStart] = None
    # True: CPU by weight only (cgroup cpu.weight / cpu.shares, no quota) whatever the NM's
    # cpu_enforcement, memory still a hard limit: Harmony's co-location model, where the node's
    # arbiter runs one COMP at a time and that COMP should get the whole node.
    cpu_weighted: bool = False


class StartContainerRequest(_Msg):
    container_token: str
    launch_context: LaunchContext


# ----- NM <-> RM ------------------------------------------------------------------------------

class NodeHealth(_Msg):
    healthy: bool = True
    report: str = ""


class LogAggregationStatus(str, enum.Enum):
    """YARN's LogAggregationStatus: of one app on one node (an NM's report), or over all the nodes
    that ran it (the RM's app view; DISABLED when cluster.toml has no remote_app_log_dir, TIME_OUT
    for nodes that had not finished long after the app did)."""

    DISABLED = "DISABLED"
    NOT_START = "NOT_START"
    RUNNING = "RUNNING"
    RUNNING_WITH_FAILURE = "RUNNING_WITH_FAILURE"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    TIME_OUT = "TIME_OUT"


class LogAggregationReport(_Msg):
    """YARN's LogAggregationReport: where one app's log aggregation stands on the reporting node."""

    app_id: str
    status: LogAggregationStatus
    diagnostics: str = ""


class NodeRegisterRequest(_Msg):
    node_id: str                 # "host:port" of the NM's HTTP server, as YARN names nodes
    http_address: str            # "host:port" where /ws/v1/node and /internal/v1/containers are served
    capability: Resource
    rack: str = "/default-rack"
    containers: list[ContainerStatus] = []   # running containers found again after an NM restart
    version: str = ""
    node_labels: list[str] = []  # the labels the node carries (protocol/node_labels.py)
    # YARN's runningApplications: the apps the node still holds containers or not yet aggregated
    # logs of. The RM puts those that are over (or unknown to it) in the next heartbeat's
    # apps_to_cleanup: a node restarted, or back from LOST, missed the word when they ended.
    applications: list[str] = []
    # Every app's log aggregation report but NOT_START's (the RM's default): after an NM restart or
    # an RM resync the RM's picture is rebuilt from these.
    log_aggregation: list[LogAggregationReport] = []


class NodeRegisterResponse(_Msg):
    node_id: str
    heartbeat_interval_ms: int
    rm_start_ms: int
    action: str = "NORMAL"       # "NORMAL" | "SHUTDOWN"
    diagnostics: str = ""


class ContainerUtilization(_Msg, gc=False):
    """What one container used at the NM's last sample: CPU in cores (cgroup accounting, else its
    process tree's /proc times), memory in MB (cgroup usage less inactive page cache, else RSS), and
    bytes under its working dir's `spill/`. `role` is the launch environment's
    ELASTANE_CONTAINER_ROLE ("" when it had none)."""

    container_id: str
    app_id: str
    cpu_cores: float = 0.0
    memory_mb: float = 0.0
    spill_bytes: int = 0
    role: str = ""


class NodeUtilization(_Msg, gc=False):
    """A node's measured use, sent with heartbeats (YARN's nodeUtilization + containersUtilization).
    The host figures (`cpu_cores` busy out of `host_cores`, `memory_mb` used out of
    `memory_total_mb`, network rates over every interface but loopback) cover the whole machine;
    the `containers_*` sums and `containers` are this NM's own. Every report carries the sums;
    the per-container list comes when the NM's set of containers changed and every few seconds
    (None in between: the last list stands), which keeps the heartbeat's payload small. Both
    Structs are untracked by the garbage collector (`gc=False`: they hold no cycles), which
    halves what decoding a report costs the RM's heartbeat path."""

    sampled_ms: int = 0          # epoch ms of the sample
    cpu_cores: float = 0.0
    host_cores: int = 0
    memory_mb: float = 0.0
    memory_total_mb: float = 0.0
    net_rx_bytes_per_s: float = 0.0
    net_tx_bytes_per_s: float = 0.0
    spill_bytes: int = 0         # sum over the containers
    containers_cpu_cores: float = 0.0
    containers_memory_mb: float = 0.0
    # A tuple, not a list: the RM keeps each node's last list, and a tuple of untracked Structs is
    # left alone by the garbage collector (a list would be scanned at every collection).
    containers: Optional[tuple[ContainerUtilization, ...]] = None


class NodeHeartbeatRequest(_Msg):
    node_id: str
    response_id: int
    used: Resource
    container_statuses: list[ContainerStatus] = []
    health: NodeHealth = msgspec.field(default_factory=NodeHealth)
    utilization: Optional[NodeUtilization] = None   # None: an NM that does not measure (or not yet)
    # The log aggregation reports that changed since the RM last took them (YARN's
    # logAggregationReportsForApps); usually none.
    log_aggregation: list[LogAggregationReport] = []


class NodeHeartbeatResponse(_Msg):
    response_id: int
    action: str = "NORMAL"       # "NORMAL" | "RESYNC" (register again) | "SHUTDOWN"
    containers_to_cleanup: list[str] = []
    apps_to_cleanup: list[str] = []
    heartbeat_interval_ms: int = 1000
    diagnostics: str = ""


# ----- AM <-> RM ------------------------------------------------------------------------------

class AmRegisterRequest(_Msg):
    host: str = ""
    rpc_port: int = -1
    tracking_url: str = ""


class AllocatedContainer(_Msg):
    container_id: str
    node_id: str
    node_http_address: str
    resource: Resource
    container_token: str
    ask_id: int = 0
    tag: str = ""


class AmRegisterResponse(_Msg):
    app_id: str
    attempt_id: str
    maximum_resource: Resource
    queue: str
    user: str
    # An app that keeps containers across attempts: the failed attempt's containers that run on,
    # now this attempt's (YARN's getContainersFromPreviousAttempts).
    containers_from_previous_attempts: list[AllocatedContainer] = []
    # The RM's policy places a new PS job before it starts (Harmony: a node of its own to be
    # profiled on, or none yet): its AM starts no executor until its first directive that runs it.
    policy_places_new_jobs: bool = False


class ResourceAsk(_Msg):
    """One row of the AM's ask table. `count` is the total still wanted for this `ask_id`
    (it replaces the previous count, as YARN's ResourceRequest does, so a lost reply is harmless)."""

    ask_id: int
    count: int
    resource: Resource
    priority: int = 0
    nodes: list[str] = []        # preferred node ids or host names; empty = anywhere
    relax_locality: bool = True
    tag: str = ""                # free-form label the AM gets back (e.g. "worker", "server")


class RunState(str, enum.Enum):
    """Whether a policy wants an elastic job running, paused (checkpointed, executors released) or
    resumed from its checkpoint (Harmony)."""

    RUN = "run"
    PAUSE = "pause"
    RESUME = "resume"


class NodePlacement(_Msg):
    """How many of a job's workers and servers a policy places on one node."""

    node: str
    workers: int = 0
    servers: int = 0


def counts_on_nodes(placement: Sequence[NodePlacement], role: str) -> dict[str, int]:
    """A placement's count of `role` ("worker" or "server", an executor's role) per node, nodes
    with none left out: what one strict ask per node asks for."""
    if role not in ("worker", "server"):
        raise ValueError(f"no executor role {role!r}: \"worker\" or \"server\"")
    counts = {p.node: p.workers if role == "worker" else p.servers for p in placement}
    return {node: n for node, n in counts.items() if n > 0}


class ShapeDirective(_Msg):
    """A policy's word to an elastic job: have `workers` and `servers`, placed as `placement` says
    (empty: anywhere), in `group` (Harmony's co-location group, None: none), in `run_state`.
    `nodes` is the placement's nodes in order, kept for readers that know only node names."""

    workers: int
    servers: int
    nodes: list[str] = []
    reason: str = ""
    version: int = 0
    placement: list[NodePlacement] = []
    group: Optional[str] = None
    run_state: RunState = RunState.RUN
    # The resource of each of the job's executor containers (Harmony sizes a group's containers so
    # the group fits its nodes); None: the job spec's executor size.
    executor_resource: Optional[Resource] = None


class PreemptionContainer(_Msg):
    """A container the RM will kill (YARN's PreemptionContainer in a StrictPreemptionContract)."""

    container_id: str
    resource: Resource


class PreemptionMessage(_Msg):
    """YARN's PreemptionMessage, strict contract only: the RM takes these containers back at
    `deadline_ms` (epoch ms) unless the AM releases them first; `reason` says which queue's
    guarantee needs them. Sent with every allocate response while the warning stands."""

    containers: list[PreemptionContainer]
    deadline_ms: int
    reason: str = ""


class AllocateRequest(_Msg):
    response_id: int
    asks: list[ResourceAsk] = []
    releases: list[str] = []
    progress: float = 0.0
    # An elastic AM's job report (shape, progress, measurements) for the policies; typed, so a bad
    # field is refused at decode with its path (`$.shape.workers`).
    shape: Optional[JobReport] = None


class NodeReport(_Msg):
    node_id: str
    state: str
    http_address: str = ""


class AllocateResponse(_Msg):
    response_id: int
    allocated: list[AllocatedContainer] = []
    completed: list[ContainerStatus] = []
    updated_nodes: list[NodeReport] = []
    available: Resource = msgspec.field(default_factory=Resource)
    num_cluster_nodes: int = 0
    shape_directive: Optional[ShapeDirective] = None
    action: str = "NORMAL"       # "NORMAL" | "RESYNC" | "SHUTDOWN" (app killed / attempt failed)
    # Containers the RM will preempt unless the AM gives them back first (capacity preemption,
    # rm/policies/queue_reclaim.py); None: none.
    preemption: Optional[PreemptionMessage] = None
    # A fresh AM token when the one the call came with is past half its lifetime (rolled as YARN
    # rolls AMRMTokens): the AM sends it from its next call on. "": keep the current one.
    am_token: str = ""


class AmFinishRequest(_Msg):
    final_status: str            # records.FinalStatus value
    diagnostics: str = ""
    tracking_url: str = ""


class AmFinishResponse(_Msg):
    unregistered: bool
