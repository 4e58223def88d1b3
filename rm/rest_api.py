"""YARN's RM REST API (`/ws/v1/cluster/...`): same paths, field names, states and error bodies."""
from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
from typing import TYPE_CHECKING, Any, TypeVar

from aiohttp import web

from protocol import codec
from protocol.client_auth import request_user
from protocol.ps_job_spec import shape_problem
from protocol.app_timeouts import LIFETIME, LifetimeError, parse_expiry
from protocol.http_server import json_response, read_json
from protocol.internal_api import RunState
from protocol.records import AppState, FinalStatus, NodeState
from protocol.remote_exception import BadRequest, Forbidden, NotFound

from . import rest_views as views
from .policies import describe as describe_policy
from .policies.decision import Decision, JobDecision
from .policy_runner import apply_decision
from .submission import (AppQueueUpdate, AppShapeUpdate, AppStateUpdate, AppTimeoutUpdate, NodeStateUpdate,
                         SubmissionContext, validate)

if TYPE_CHECKING:
    from .model import App
    from .context import RmContext

log = logging.getLogger(__name__)

BASE = "/ws/v1/cluster"


class ClientApi:
    """Handlers of the client REST API, bound to one RM server."""

    def __init__(self, rm: "RmContext"):
        self.rm = rm

    def add_routes(self, app: web.Application) -> None:
        r = app.router
        r.add_get(BASE, self.info)
        r.add_get(BASE + "/", self.info)
        r.add_get(BASE + "/info", self.info)
        r.add_get(BASE + "/metrics", self.metrics)
        r.add_get(BASE + "/scheduler", self.scheduler)
        r.add_get(BASE + "/nodes", self.nodes)
        r.add_get(BASE + "/nodes/{node_id}", self.node)
        r.add_put(BASE + "/nodes/{node_id}/state", self.put_node_state)
        r.add_get(BASE + "/apps", self.apps)
        r.add_post(BASE + "/apps", self.submit)
        r.add_post(BASE + "/apps/new-application", self.new_application)
        r.add_get(BASE + "/apps/{app_id}", self.app)
        r.add_get(BASE + "/apps/{app_id}/state", self.app_state)
        r.add_put(BASE + "/apps/{app_id}/state", self.put_app_state)
        r.add_put(BASE + "/apps/{app_id}/shape", self.put_app_shape)
        r.add_get(BASE + "/apps/{app_id}/appattempts", self.app_attempts)
        r.add_get(BASE + "/apps/{app_id}/queue", self.app_queue)
        r.add_put(BASE + "/apps/{app_id}/queue", self.put_app_queue)
        r.add_get(BASE + "/apps/{app_id}/timeouts", self.app_timeouts)
        r.add_get(BASE + "/apps/{app_id}/timeouts/{type}", self.app_timeout)
        r.add_put(BASE + "/apps/{app_id}/timeout", self.put_app_timeout)
        r.add_get(BASE + "/apps/{app_id}/shape", self.app_shape)
        r.add_get(BASE + "/utilization", self.utilization)

    # ----- identity -------------------------------------------------------------------------
    def user(self, request: web.Request) -> str:
        """The caller: Hadoop simple auth (?user.name=, default dr.who) or a client bearer token."""
        return request_user(self.rm.cluster, request)

    # ----- cluster ----------------------------------------------------------------------------
    async def info(self, request: web.Request) -> web.Response:
        self.user(request)
        return json_response(views.cluster_info(self.rm.core, self.rm.ha_info))

    async def metrics(self, request: web.Request) -> web.Response:
        self.user(request)
        return json_response(views.cluster_metrics(self.rm.core))

    async def scheduler(self, request: web.Request) -> web.Response:
        self.user(request)
        info = views.scheduler_info(self.rm.core)
        # Elastane extension: the elastic policy and its per-app state (Policy.describe, optional).
        info["scheduler"]["schedulerInfo"]["policy"] = {"name": self.rm.cfg.policy,
                                                        "apps": describe_policy(self.rm.policy)}
        return json_response(info)

    async def nodes(self, request: web.Request) -> web.Response:
        self.user(request)
        states = _parse_states(request.query.get("states"), NodeState, "states")
        latest = self.rm.core.utilization.latest
        nodes = [views.node_json(n, latest.get(n.node_id)) for n in self.rm.core.nodes
                 if states is None or n.state in states]
        return json_response({"nodes": {"node": nodes} if nodes else None})

    async def node(self, request: web.Request) -> web.Response:
        self.user(request)
        node_id = request.match_info["node_id"]
        n = self.rm.core.nodes.get(node_id)
        if n is None:
            raise NotFound(f"nodeId, {node_id}, is not found")
        return json_response({"node": views.node_json(n, self.rm.core.utilization.latest.get(node_id))})

    async def put_node_state(self, request: web.Request) -> web.Response:
        """An admin decommissions a node gracefully (DECOMMISSIONING) or recommissions it (RUNNING);
        docs/operating.md, "Decommissioning a node"."""
        user = self.user(request)
        body = await read_json(request, NodeStateUpdate)
        if user not in self.rm.cluster.admins:
            raise Forbidden(f"user {user} may not change a node's state (admins: {', '.join(self.rm.cluster.admins)})")
        node_id = request.match_info["node_id"]
        state = body.state.upper()
        core = self.rm.core
        if state == NodeState.DECOMMISSIONING.value:
            timeout = body.decommission_timeout
            n = core.decommission_node(node_id, None if timeout is None or timeout == -1 else timeout)
        elif state == NodeState.RUNNING.value:
            n = core.recommission_node(node_id)
        else:
            raise BadRequest(f"state: DECOMMISSIONING or RUNNING, got {body.state!r}")
        return json_response({"node": views.node_json(n, core.utilization.latest.get(node_id))})

    async def utilization(self, request: web.Request) -> web.Response:
        """Elastane extension: the utilization time series, oldest point first (?node=, ?since=)."""
        self.user(request)
        q = request.query
        since = None
        if "since" in q:
            try:
                since = int(q["since"])
            except ValueError:
                raise BadRequest(f"since must be epoch milliseconds (an integer), got {q['since']!r}") from None
        node = q.get("node")
        series = self.rm.core.utilization
        if node is not None:
            if not node:
                raise BadRequest("node must be a node id (host:port), got an empty value")
            if self.rm.core.nodes.get(node) is None and not series.has_node(node):
                raise NotFound(f"nodeId, {node}, is not found")
        return json_response(series.to_json(since, node))

    # ----- apps ---------------------------------------------------------------------------------
    async def apps(self, request: web.Request) -> web.Response:
        self.user(request)
        q = request.query
        states = _parse_states(q.get("states") or q.get("state"), AppState, "states")
        final = _parse_states(q.get("finalStatus"), FinalStatus, "finalStatus")
        user = q.get("user")
        queue = q.get("queue")
        # YARN compares application types lower-cased: ?applicationTypes=mapreduce lists MAPREDUCE apps.
        types = ({t.strip().lower() for t in q["applicationTypes"].split(",") if t.strip()}
                 if "applicationTypes" in q else None)
        limit = None
        if "limit" in q:
            try:
                limit = int(q["limit"])
            except ValueError:
                raise BadRequest(f"limit must be a positive integer, got {q['limit']!r}") from None
            if limit <= 0:
                raise BadRequest(f"limit must be a positive integer, got {limit}")
        out = []
        for app in self.rm.core.apps.values():
            if states is not None and app.state not in states:
                continue
            if final is not None and app.final_status not in final:
                continue
            if user and app.user != user:
                continue
            if queue and app.queue != queue:
                continue
            if types is not None and app.app_type.lower() not in types:
                continue
            out.append(self._listed(app, str(request.url.origin())))
            if limit is not None and len(out) >= limit:
                break
        body = {"apps": {"app": out} if out else None}
        try:
            return json_response(body)
        except (TypeError, ValueError):
            # one stored record that cannot be encoded must not take the listing down: find it
            # (only on this rare path: the common one encodes once) and list it by its marker
            out = [self._encodable(entry) for entry in out]
            return json_response({"apps": {"app": out}})

    def _listed(self, app: App, rm_url: str) -> dict[str, Any]:
        """One app's listing entry; an app whose record cannot be rendered is listed by its marker."""
        try:
            return views.app_json(self.rm.core, app, rm_url)
        except Exception as e:   # noqa: BLE001  # any bad record: the others are still listed
            return self._marker(app.app_id, e)

    def _encodable(self, entry: dict[str, Any]) -> dict[str, Any]:
        try:
            codec.dumps(entry)
        except (TypeError, ValueError) as e:
            return self._marker(entry.get("id", "?"), e)
        return entry

    def _marker(self, app_id: str, e: Exception) -> dict[str, Any]:
        """A listing entry for an app whose stored record cannot be rendered: its id, the error,
        what the core still knows of it as plain strings (each encodable), and a log line."""
        log.error("GET /apps: app %s cannot be rendered (listed by its error marker): %s", app_id, e)
        entry: dict[str, Any] = {"id": str(app_id), "renderError": f"{type(e).__name__}: {e}"}
        app = self.rm.core.apps.get(app_id)
        if app is not None:
            entry.update(user=str(app.user), name=str(app.name), queue=str(app.queue),
                         state=str(app.state.value), finalStatus=str(app.final_status.value),
                         applicationType=str(app.app_type))
        return entry

    async def new_application(self, request: web.Request) -> web.Response:
        self.user(request)
        app_id = self.rm.core.new_application()
        return json_response({"application-id": app_id,
                              "maximum-resource-capability": self.rm.core.max_resource().to_json()})

    async def submit(self, request: web.Request) -> web.Response:
        user = self.user(request)
        ctx = await read_json(request, SubmissionContext)
        # In a thread: a job's object-store locations are probed over the network (submission.validate).
        sub = await asyncio.to_thread(validate, ctx)
        self.rm.submit(user, sub)
        location = f"{request.url.origin()}{BASE}/apps/{sub.app_id}"
        return web.Response(status=202, headers={"Location": location})

    def _app(self, request: web.Request) -> App:
        return self.rm.core.get_app(request.match_info["app_id"])

    def _owner_or_admin(self, user: str, app: App, action: str) -> None:
        """The app ACL of every write to an app (YARN's): its owner or an admin; Forbidden naming both."""
        if user != app.user and user not in self.rm.cluster.admins:
            raise Forbidden(f"user {user} is not allowed to {action} {app.app_id} (owner {app.user}; "
                            f"admins: {', '.join(self.rm.cluster.admins)})")

    async def app(self, request: web.Request) -> web.Response:
        self.user(request)
        app = self._app(request)
        try:
            return json_response({"app": views.app_json(self.rm.core, app, str(request.url.origin()))})
        except (TypeError, ValueError) as e:   # a record that cannot be encoded: its marker, 200
            return json_response({"app": self._marker(app.app_id, e)})

    async def app_state(self, request: web.Request) -> web.Response:
        self.user(request)
        return json_response({"state": self._app(request).state.value})

    async def put_app_state(self, request: web.Request) -> web.Response:
        user = self.user(request)
        app = self._app(request)
        body = await read_json(request, AppStateUpdate)
        if body.state.upper() != AppState.KILLED.value:
            raise BadRequest(f"state: only KILLED may be set, got {body.state!r}")
        self._owner_or_admin(user, app, "kill")
        ended = app.state.is_final
        # An app that ended already is left as it is (its state, which the answer confirms, is
        # stored before the answer goes: core.kill).
        self.rm.core.kill(app.app_id, body.diagnostics or f"Application killed by user {user}.")
        if ended:
            return json_response({"state": app.state.value})
        return json_response({"state": app.state.value}, status=202,
                             headers={"Location": str(request.url.with_query(None))})

    async def app_queue(self, request: web.Request) -> web.Response:
        self.user(request)
        return json_response({"queue": self._app(request).queue})

    async def put_app_queue(self, request: web.Request) -> web.Response:
        """YARN's move to queue: the owner or an admin moves an unfinished app, with what it holds,
        to another queue (whose maximum capacity must take it)."""
        user = self.user(request)
        app = self._app(request)
        body = await read_json(request, AppQueueUpdate)
        self._owner_or_admin(user, app, "move")
        self.rm.core.move_app(app.app_id, body.queue)
        return json_response({"queue": app.queue})

    async def app_timeouts(self, request: web.Request) -> web.Response:
        self.user(request)
        app = self._app(request)
        return json_response({"timeouts": {"timeout": [views.timeout_json(app, self.rm.core.clock())]}})

    async def app_timeout(self, request: web.Request) -> web.Response:
        self.user(request)
        app = self._app(request)
        kind = request.match_info["type"]
        if kind.upper() != LIFETIME:
            raise BadRequest(f"timeout type: only {LIFETIME} is supported, got {kind!r}")
        return json_response({"timeout": views.timeout_json(app, self.rm.core.clock())})

    async def put_app_timeout(self, request: web.Request) -> web.Response:
        """YARN's application timeout update: the owner or an admin moves the app's LIFETIME expiry."""
        user = self.user(request)
        app = self._app(request)
        body = await read_json(request, AppTimeoutUpdate)
        if body.timeout.type.upper() != LIFETIME:
            raise BadRequest(f"timeout.type: only {LIFETIME} is supported, got {body.timeout.type!r}")
        self._owner_or_admin(user, app, "update the lifetime of")
        try:
            expiry = parse_expiry(body.timeout.expiry_time)
        except LifetimeError as e:
            raise BadRequest(f"timeout.{e}") from None
        self.rm.core.update_lifetime(app.app_id, expiry)
        return json_response({"timeout": views.timeout_json(app, self.rm.core.clock())})

    async def app_attempts(self, request: web.Request) -> web.Response:
        self.user(request)
        app = self._app(request)
        core = self.rm.core
        rm_url = str(request.url.origin())
        return json_response({"appAttempts": {"appAttempt": [views.attempt_json(core, core.attempts[a], rm_url)
                                                               for a in app.attempts]}})


    async def app_shape(self, request: web.Request) -> web.Response:
        """Elastane extension: the shape the AM reports and the policy's latest directive."""
        self.user(request)
        app = self._app(request)
        shape = views.shape_json(self.rm.core, app)
        shape["policyState"] = describe_policy(self.rm.policy).get(app.app_id)    # e.g. Harmony's job state
        return json_response({"shape": shape})


    async def put_app_shape(self, request: web.Request) -> web.Response:
        """Elastane extension: the owner (or an admin) directs an elastic PS job to a shape, and
        with `nodes` to exactly those nodes; the AM carries it out on its next allocate (as it does
        a policy's directive, which a later policy round may supersede)."""
        user = self.user(request)
        app = self._app(request)
        body = await read_json(request, AppShapeUpdate)
        self._owner_or_admin(user, app, "reshape")
        if app.ps is None:
            raise BadRequest(f"{app.app_id} is not an elastic PS job (application-type {app.app_type}): "
                             "it has no shape to change")
        if app.state.is_final:
            raise BadRequest(f"{app.app_id} is {app.state.value}: its shape can no longer change")
        known = {n.node_id for n in self.rm.core.nodes if n.state is NodeState.RUNNING}
        unknown = [n for n in body.nodes if n not in known]
        if unknown:
            raise BadRequest(f"nodes: {', '.join(unknown)} not RUNNING nodes of this cluster "
                             f"(known: {', '.join(sorted(known)) or 'none'})")
        if len(set(body.nodes)) != len(body.nodes):
            raise BadRequest(f"nodes: each node may be named once, got {', '.join(body.nodes)}")
        problem = shape_problem(app.ps.spec, body.workers, body.servers, pause=body.run_state is RunState.PAUSE)
        if problem is not None:
            raise BadRequest(problem)
        reason = body.reason or f"set by {user}"
        decision = dataclasses.replace(JobDecision.spread(body.workers, body.servers, body.nodes, reason),
                                       run_state=body.run_state)
        apply_decision(self.rm.core, Decision({app.app_id: decision}))
        return await self.app_shape(request)


E = TypeVar("E", bound=enum.Enum)


def _parse_states(raw: str | None, enum_type: type[E], field: str) -> set[E] | None:
    """Parse a comma list of enum values, case-insensitively; 400 naming the bad one."""
    if raw is None:
        return None
    out: set[E] = set()
    for part in raw.split(","):
        p = part.strip().upper()
        if not p:
            continue
        try:
            out.add(enum_type(p))
        except ValueError:
            valid = ", ".join(e.value for e in enum_type)
            raise BadRequest(f"{field}: invalid value {part.strip()!r}; valid values are {valid}") from None
    return out or None
