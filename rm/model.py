"""The RM's in-memory records: nodes, applications, attempts, containers (mutable, no I/O)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from protocol import internal_api as api
from protocol.job_report import JobReport
from protocol.local_resources import LocalResource
from protocol.records import ZERO, AppState, AttemptState, FinalStatus, NodeState, Resource

from .policies.snapshot import PSJobView
from .preemption_record import PreemptionRecord
from .shape_history import ShapeHistory

# YARN's yarn.app.attempt.diagnostics.limit.kc (64 KiB): an app's or attempt's diagnostics keep
# their newest text up to this many characters. Unbounded, a kill's or an AM's finish text (the
# REST body may be 16 MiB) went into the state store, where etcd refuses a request over 1.5 MiB.
MAX_DIAGNOSTICS_CHARS = 64 * 1024
_TRUNCATED = "[diagnostics truncated: the newest {n} characters follow]\n"


def bounded_diagnostics(text: str) -> str:
    """`text`, or its newest MAX_DIAGNOSTICS_CHARS characters after a marker saying so."""
    if len(text) <= MAX_DIAGNOSTICS_CHARS:
        return text
    return _TRUNCATED.format(n=MAX_DIAGNOSTICS_CHARS) + text[-MAX_DIAGNOSTICS_CHARS:]


@dataclass
class Container:
    """A container the scheduler handed out; lives until its NM reports it complete or it is reclaimed."""

    container_id: str
    app_id: str
    attempt_id: str
    node_id: str
    node_http_address: str
    resource: Resource
    allocated_at: float
    token: str
    ask_id: int = 0
    tag: str = ""
    is_am: bool = False
    launched: bool = False


@dataclass
class PendingRelease:
    """A container the RM has given up on but whose NM may still run it: its resources stay
    charged to the node until the NM reports it COMPLETE or shows it does not have it."""

    resource: Resource
    sent_in: int = 0    # response id of the heartbeat response that asked the NM to clean it up (0 = not yet)


@dataclass
class Node:
    """A NodeManager as the RM tracks it.

    `used` counts the containers the scheduler placed here plus those in `releasing`, so a
    killed container's resources are not handed out before its NM has freed them (YARN's rule)."""

    node_id: str
    http_address: str
    rack: str
    capability: Resource
    state: NodeState
    last_heartbeat: float
    used: Resource = ZERO
    containers: set[str] = field(default_factory=set)
    health_report: str = ""
    last_health_update: float = 0.0
    response_id: int = 0
    version: str = ""
    to_cleanup: list[str] = field(default_factory=list)
    apps_to_cleanup: list[str] = field(default_factory=list)
    releasing: dict[str, PendingRelease] = field(default_factory=dict)
    # The node's labels (exclusive partitions, protocol/node_labels.py), as it registered them.
    labels: frozenset[str] = frozenset()
    # DECOMMISSIONING: when its containers are killed if they have not ended (None: never).
    decommission_deadline: Optional[float] = None

    def hold_release(self, container_id: str, resource: Resource) -> None:
        """Keep a released container charged here and ask the NM to clean it up."""
        self.releasing[container_id] = PendingRelease(resource)
        self.to_cleanup.append(container_id)

    def finish_release(self, container_id: str) -> bool:
        """The NM no longer holds the container: give its resources back to the node."""
        pr = self.releasing.pop(container_id, None)
        if pr is None:
            return False
        self.used = self.used - pr.resource
        return True

    def drop_releases(self) -> None:
        """Forget every pending release (the node is lost: its capacity leaves the pool anyway)."""
        for cid in list(self.releasing):
            self.finish_release(cid)

    @property
    def host(self) -> str:
        return self.node_id.rsplit(":", 1)[0]

    @property
    def free(self) -> Resource:
        return self.capability - self.used

    @property
    def schedulable(self) -> bool:
        return self.state == NodeState.RUNNING


@dataclass
class AmSpec:
    """What the RM needs to launch an app's AM (from the submission's am-container-spec)."""

    commands: list[str]
    environment: dict[str, str]
    local_resources: dict[str, LocalResource]    # checked at submission (rm/submission.py)
    resource: Resource


@dataclass
class Attempt:
    """One application attempt: one AM container plus the containers it was given."""

    attempt_id: str
    app_id: str
    number: int
    state: AttemptState
    start_time: float
    finish_time: float = 0.0
    diagnostics: str = ""
    # False when the platform ended it (the RM restarted, its node was lost, its AM container was
    # preempted or ABORTED): it does not use up one of the app's max-app-attempts.
    counts_as_failure: bool = True
    am_container_id: str = ""
    am_node_id: str = ""
    am_node_http_address: str = ""
    host: str = ""
    rpc_port: int = -1
    tracking_url: str = ""
    registered: bool = False
    container_seq: int = 0
    response_id: int = 0
    containers: set[str] = field(default_factory=set)
    to_deliver: list[Container] = field(default_factory=list)
    completed: list[api.ContainerStatus] = field(default_factory=list)
    updated_nodes: list[api.NodeReport] = field(default_factory=list)
    last_response: Optional[api.AllocateResponse] = None   # re-sent when a retried request repeats its id
    # Kept across an RM restart or failover (work-preserving recovery, ResourceManagerCore.recover):
    # its AM still runs but has not registered with this RM yet; it must within am_expiry_s, or the
    # attempt fails (not counted) and a new one starts.
    awaiting_resync: bool = False
    # Containers the AM released while this RM had not yet heard of them (their NM had not
    # re-registered): cleaned up, not re-adopted, when their NM reports them (YARN's pendingRelease).
    pending_release: set[str] = field(default_factory=set)
    # An app that keeps containers across attempts: the failed attempt's containers this attempt
    # took over (its register reply lists those still running; YARN's
    # getContainersFromPreviousAttempts).
    previous_containers: list[str] = field(default_factory=list)


@dataclass
class App:
    """An application as the RM tracks it (YARN's RMApp)."""

    app_id: str
    user: str
    name: str
    queue: str
    app_type: str
    am: AmSpec
    max_attempts: int
    submit_time: float
    seq: int
    # YARN's keep-containers-across-application-attempts (rm/submission.py): a failed attempt's
    # containers pass to the next attempt instead of being cleaned up.
    keep_containers: bool = False
    # An ELASTANE_PS app's job: the PSJobSpec decoded and validated once at submission
    # (rm/submission.py), with what the policies read of it (`ps.spec` is the spec itself: what the
    # state store persists, the REST API shows and the AM is launched with). None for other apps.
    ps: Optional[PSJobView] = None
    # The rest of the submission's Elastane extension (its `elastane` object without the PS job
    # spec), kept as given and shown back by the REST API; None when there was none.
    extension: Optional[dict[str, object]] = None
    state: AppState = AppState.NEW
    final_status: FinalStatus = FinalStatus.UNDEFINED
    diagnostics: str = ""
    start_time: float = 0.0
    finish_time: float = 0.0
    tracking_url: str = ""
    progress: float = 0.0
    attempts: list[str] = field(default_factory=list)
    shape: Optional[JobReport] = None     # the AM's latest job report (AllocateRequest.shape)
    shape_history: ShapeHistory = field(default_factory=ShapeHistory)   # in memory only (web UI)
    directive: Optional[api.ShapeDirective] = None
    directive_version: int = 0
    delivered_directive_version: int = 0
    memory_seconds: float = 0.0
    vcore_seconds: float = 0.0
    nodes_used: set[str] = field(default_factory=set)
    # When the RM kills it if it has not finished (epoch s; None: never): its lifetime from
    # submission, or an owner's later update (rm/app_lifetime.py).
    lifetime_expiry: Optional[float] = None
    # What capacity preemption took back from it (rm/policies/queue_reclaim.py); in memory only.
    preemption: PreemptionRecord = field(default_factory=PreemptionRecord)

    @property
    def current_attempt(self) -> Optional[str]:
        return self.attempts[-1] if self.attempts else None
