"""YARN's application-submission-context as msgspec Structs, and its validation.

Unknown fields are rejected (400 naming the field). Fields YARN documents that Elastane accepts
but ignores are listed in IGNORED_SUBMISSION_FIELDS / IGNORED_AM_CONTAINER_SPEC_FIELDS.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Optional, TypeVar, Union

import msgspec

from protocol import container_env, ps_job_spec
from protocol.app_timeouts import LIFETIME, LifetimeError, check_lifetime_s
from protocol.durable_storage import DurableStorageError, bucket_of, check_reachable
from protocol.ids import ApplicationId
from protocol.internal_api import RunState
from protocol.local_resources import LocalResource, LocalResourceError, decode_resources
from protocol.records import Resource
from protocol.remote_exception import BadRequest

from .model import AmSpec

# Documented by YARN's RM REST API, accepted and ignored by Elastane (the README cites this list).
IGNORED_SUBMISSION_FIELDS: tuple[str, ...] = (
    "application-tags", "priority", "unmanaged-AM",
    "cancel-tokens-when-complete", "log-aggregation-context", "attempt-failures-validity-interval",
    "reservation-id", "am-black-listing-requests", "node-label-expression",
    "app-node-label-expression", "am-container-node-label-expression", "credentials",
    "application-scheduling-properties",
)
IGNORED_AM_CONTAINER_SPEC_FIELDS: tuple[str, ...] = ("service-data", "credentials", "application-acls")


# The longest `reason` a shape directive takes (PUT .../shape), in characters.
MAX_SHAPE_REASON = 1024


class _In(msgspec.Struct, forbid_unknown_fields=True):
    pass


class KeyValue(_In):
    key: str
    value: str


class Environment(_In):
    # Jersey writes a one-element list as a bare object; accept both.
    entry: Union[list[KeyValue], KeyValue] = []


class LocalResourceEntry(_In):
    key: str
    value: dict[str, object]     # a LocalResource's JSON, decoded by decode_resources


class LocalResources(_In):
    entry: Union[list[LocalResourceEntry], LocalResourceEntry] = []


class ApplicationTimeout(_In):
    """One of a submission's `application-timeouts` (YARN's ApplicationTimeoutType and seconds)."""

    type: str
    value: int


class ApplicationTimeouts(_In):
    # Jersey writes a one-element list as a bare object; accept both.
    timeout: Union[list[ApplicationTimeout], ApplicationTimeout] = []


class Commands(_In):
    command: str


class AmContainerSpec(_In, rename={"local_resources": "local-resources", "service_data": "service-data",
                                    "application_acls": "application-acls"}):
    commands: Optional[Commands] = None    # may be left out for ELASTANE_PS: the RM runs the PS AM
    environment: Optional[Environment] = None
    local_resources: Optional[LocalResources] = None
    service_data: object = None
    credentials: object = None
    application_acls: object = None


_RENAME = {
    "application_id": "application-id", "application_name": "application-name",
    "am_container_spec": "am-container-spec", "max_app_attempts": "max-app-attempts",
    "application_type": "application-type", "application_tags": "application-tags",
    "keep_containers": "keep-containers-across-application-attempts", "unmanaged_am": "unmanaged-AM",
    "cancel_tokens": "cancel-tokens-when-complete", "log_aggregation_context": "log-aggregation-context",
    "attempt_failures_validity_interval": "attempt-failures-validity-interval",
    "reservation_id": "reservation-id", "am_black_listing_requests": "am-black-listing-requests",
    "application_timeouts": "application-timeouts", "node_label_expression": "node-label-expression",
    "app_node_label_expression": "app-node-label-expression",
    "am_container_node_label_expression": "am-container-node-label-expression",
    "application_scheduling_properties": "application-scheduling-properties",
}


class SubmissionContext(_In, rename=_RENAME):
    """POST /ws/v1/cluster/apps body."""

    application_id: str
    am_container_spec: AmContainerSpec
    resource: Resource
    application_name: str = ""
    queue: str = "default"
    max_app_attempts: Optional[int] = None
    application_type: str = "YARN"
    elastane: Optional[dict[str, object]] = None  # Elastane's extension (e.g. a PS job spec)
    # YARN's work-preserving AM restart: a failed attempt's containers go on running and the next
    # attempt gets them (its register reply lists them). Unset: on for ELASTANE_PS apps (their AM
    # adopts its executors, docs/internals.md "AM recovery"), off for every other app, as in YARN.
    keep_containers: Optional[bool] = None
    # YARN's application timeouts: {"timeout": [{"type": "LIFETIME", "value": seconds}]}, the app
    # killed by the RM if it has not finished that long after its submission (rm/app_lifetime.py).
    application_timeouts: Optional[ApplicationTimeouts] = None
    # ---- accepted and ignored (IGNORED_SUBMISSION_FIELDS) ----
    application_tags: object = None
    priority: object = None
    unmanaged_am: object = None
    cancel_tokens: object = None
    log_aggregation_context: object = None
    attempt_failures_validity_interval: object = None
    reservation_id: object = None
    am_black_listing_requests: object = None
    node_label_expression: object = None
    app_node_label_expression: object = None
    am_container_node_label_expression: object = None
    credentials: object = None
    application_scheduling_properties: object = None


class AppStateUpdate(_In):
    """PUT /ws/v1/cluster/apps/{id}/state body."""

    state: str
    diagnostics: str = ""


class NodeStateUpdate(_In):
    """PUT /ws/v1/cluster/nodes/{id}/state body (an admin's; YARN's graceful decommission):
    `state` DECOMMISSIONING, with `decommissionTimeout` seconds after which the node's containers
    are killed (absent or -1: wait for them), or RUNNING to recommission it."""

    state: str
    decommission_timeout: Optional[float] = msgspec.field(default=None, name="decommissionTimeout")


class AppQueueUpdate(_In):
    """PUT /ws/v1/cluster/apps/{id}/queue body (YARN's move to queue): {"queue": "research"}."""

    queue: str


class AppTimeoutValue(_In):
    type: str
    expiry_time: str = msgspec.field(name="expiryTime")


class AppTimeoutUpdate(_In):
    """PUT /ws/v1/cluster/apps/{id}/timeout body (YARN's): {"timeout": {"type": "LIFETIME",
    "expiryTime": "2026-11-30T18:00:00.000+0000"}}, the app's new expiry."""

    timeout: AppTimeoutValue


class AppShapeUpdate(_In):
    """PUT /ws/v1/cluster/apps/{id}/shape body (Elastane extension): an operator's or owner's shape
    directive for an elastic PS job -- `workers` and `servers`, optionally on exactly `nodes`; with
    `runState` "pause" the job checkpoints and gives its executors back, and "resume" (or "run")
    brings a paused job back with this shape."""

    workers: Annotated[int, msgspec.Meta(ge=1)]
    servers: Annotated[int, msgspec.Meta(ge=1)]
    nodes: list[str] = []
    # Stored with the directive, sent to the AM and shown in the decision log: a note, not a document.
    reason: Annotated[str, msgspec.Meta(max_length=MAX_SHAPE_REASON)] = ""
    run_state: RunState = msgspec.field(default=RunState.RUN, name="runState")


@dataclass
class ValidSubmission:
    """A submission that passed the REST-level checks (the core checks queue, id and limits)."""

    app_id: str
    name: str
    queue: str
    app_type: str
    am: AmSpec
    max_attempts: Optional[int]
    # An ELASTANE_PS app's job spec, decoded and validated here, the one time the RM parses it
    # (with the AM container's local resources merged in: the spec the AM is launched with).
    ps_job: Optional[ps_job_spec.PSJobSpec]
    extension: Optional[dict[str, object]]    # the rest of the `elastane` object, as given
    keep_containers: bool = False             # containers outlive a failed attempt (SubmissionContext)
    lifetime_s: Optional[int] = None          # its LIFETIME timeout, seconds (before the queue's default and cap)


E = TypeVar("E")


def _entries(x: Union[list[E], E, None]) -> list[E]:
    """Jersey's entry lists: a list, one bare entry, or none."""
    if x is None:
        return []
    return x if isinstance(x, list) else [x]


def _ps_job(ctx: SubmissionContext) -> Optional[ps_job_spec.PSJobSpec]:
    """The validated PS job spec of an ELASTANE_PS submission (`elastane.ps-job`), else None."""
    ext = ctx.elastane or {}
    # The extension has one key; another (a misspelt "ps_job") would be stored and ignored, and
    # the job run as a plain app.
    unknown = [k for k in ext if k != ps_job_spec.ELASTANE_FIELD]
    if unknown:
        raise BadRequest(f"elastane: unknown field{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(repr(k) for k in unknown)}; "
                         f"the only one is {ps_job_spec.ELASTANE_FIELD!r}")
    field = f"elastane.{ps_job_spec.ELASTANE_FIELD}"
    is_ps = ctx.application_type.upper() == ps_job_spec.APPLICATION_TYPE
    if not is_ps:
        if ps_job_spec.ELASTANE_FIELD in ext:
            raise BadRequest(f"{field} needs application-type {ps_job_spec.APPLICATION_TYPE}")
        return None
    if ps_job_spec.ELASTANE_FIELD not in ext:
        raise BadRequest(f"{field} is required for application-type {ps_job_spec.APPLICATION_TYPE}")
    try:
        # untrusted: the RM reads init_from / data.path only from paths and object stores, never
        # from a URL of any scheme a client names (no requests into the cluster's network for it).
        spec = ps_job_spec.validate(ext[ps_job_spec.ELASTANE_FIELD], untrusted=True)
        ps_job_spec.check_storage(spec)     # object stores: bucket there, credentials good
    except ps_job_spec.JobSpecError as e:
        raise BadRequest(str(e.under(field))) from None
    return spec


def _lifetime(timeouts: Optional[ApplicationTimeouts]) -> Optional[int]:
    """The LIFETIME of a submission's `application-timeouts` (400 naming a bad one)."""
    lifetime: Optional[int] = None
    for t in _entries(timeouts.timeout if timeouts is not None else None):
        if t.type.upper() != LIFETIME:
            raise BadRequest(f"application-timeouts.timeout.type: only {LIFETIME} is supported, got {t.type!r}")
        if lifetime is not None:
            raise BadRequest(f"application-timeouts: {LIFETIME} is given twice")
        try:
            check_lifetime_s(t.value)
        except LifetimeError as e:
            raise BadRequest(f"application-timeouts.timeout.value: {e}") from None
        lifetime = t.value
    return lifetime


def _local_resources(spec: Optional[LocalResources]) -> dict[str, LocalResource]:
    """YARN's `local-resources` entries, each decoded and checked as a LocalResource (400 naming a
    bad one): what the app record keeps and the AM's launch context carries."""
    where = "am-container-spec.local-resources"
    raw: dict[str, object] = {}
    for e in _entries(spec.entry if spec else None):
        if e.key in raw:
            raise BadRequest(f"{where}: local resource {e.key!r} is given twice")
        raw[e.key] = e.value
    try:
        typed = decode_resources(raw)
    except LocalResourceError as e:
        raise BadRequest(f"{where}: {e}") from None
    for name, res in typed.items():
        if bucket_of(res.resource) is not None:   # in an object store: the bucket there, the credentials good
            try:
                check_reachable(res.resource)
            except DurableStorageError as e:
                raise BadRequest(f"{where}: local resource {name!r}: {e}") from None
        if res.type == "PATTERN":
            try:
                re.compile(res.pattern)
            except re.error as e:
                raise BadRequest(f"{where}: local resource {name!r}: bad pattern {res.pattern!r}: {e}") from None
    return typed


def _one_set_of_resources(spec: ps_job_spec.PSJobSpec, am_local: dict[str, LocalResource]
                          ) -> tuple[ps_job_spec.PSJobSpec, dict[str, LocalResource]]:
    """A PS job's files may come in `elastane.ps-job.resources` or, as a YARN client ships them, in
    `am-container-spec.local-resources`: both places are one set, localized for the AM (which
    imports a user's app from its working dir) and passed on to every executor it starts. The same
    name given differently in the two is a 400 naming it."""
    merged = dict(spec.resources)
    for name, res in am_local.items():
        given = merged.get(name)
        if given is not None and given != res:
            raise BadRequest(f"am-container-spec.local-resources: local resource {name!r} differs from "
                             f"elastane.{ps_job_spec.ELASTANE_FIELD}.resources.{name}: give it once, or the same in both")
        merged[name] = res
    return spec.with_resources(merged), merged     # what validate decoded is kept


def validate(ctx: SubmissionContext) -> ValidSubmission:
    """Field checks a schema cannot express; BadRequest names the field."""
    try:
        ApplicationId.parse(ctx.application_id)
    except ValueError as e:
        raise BadRequest(f"application-id: {e}") from None
    ps_spec = _ps_job(ctx)
    if ctx.am_container_spec.commands is not None:
        command = ctx.am_container_spec.commands.command
    elif ps_spec is not None:
        command = ps_job_spec.AM_COMMAND
    else:
        raise BadRequest("am-container-spec.commands is required")
    if not command.strip():
        raise BadRequest("am-container-spec.commands.command must not be empty")
    if ctx.resource.memory <= 0:
        raise BadRequest(f"resource.memory must be positive, got {ctx.resource.memory}")
    if ctx.resource.vcores <= 0:
        raise BadRequest(f"resource.vCores must be positive, got {ctx.resource.vcores}")
    if ctx.max_app_attempts is not None and ctx.max_app_attempts < 1:
        raise BadRequest(f"max-app-attempts must be >= 1, got {ctx.max_app_attempts}")
    if not ctx.queue:
        raise BadRequest("queue must not be empty")
    lifetime = _lifetime(ctx.application_timeouts)
    env_spec = ctx.am_container_spec.environment
    env: dict[str, str] = {}
    for kv in _entries(env_spec.entry if env_spec else None):
        if kv.key in env:    # one would be dropped unseen: the last would win
            raise BadRequest(f"am-container-spec.environment.entry: key {kv.key!r} is given twice")
        env[kv.key] = kv.value
    problem = container_env.environment_problem(env)
    if problem is not None:
        raise BadRequest(f"am-container-spec.environment.entry: {problem}")
    local = _local_resources(ctx.am_container_spec.local_resources)
    if ps_spec is not None:   # the PS AM reads its (validated, normalised) job spec from its env
        ps_spec, local = _one_set_of_resources(ps_spec, local)
        env[ps_job_spec.PS_SPEC_ENV] = msgspec.json.encode(ps_spec).decode()
    am = AmSpec(commands=[command], environment=env, local_resources=local, resource=ctx.resource)
    extension = {k: v for k, v in (ctx.elastane or {}).items() if k != ps_job_spec.ELASTANE_FIELD}
    return ValidSubmission(app_id=ctx.application_id, name=ctx.application_name, queue=ctx.queue,
                           app_type=ctx.application_type, am=am, max_attempts=ctx.max_app_attempts,
                           ps_job=ps_spec, extension=extension if ctx.elastane is not None else None,
                           keep_containers=(ps_spec is not None if ctx.keep_containers is None
                                            else ctx.keep_containers),
                           lifetime_s=lifetime)
