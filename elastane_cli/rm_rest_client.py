"""Async client of the RM's YARN REST API (and the NMs' /ws/v1/node API) for the CLI.

Errors come out as CLI errors: a 400 / 404 from a daemon is bad input (exit 2), an unreachable
daemon or any other failure is an operation failure (exit 1). Answers are typed as the RM writes
them (protocol.yarn_views; the rest JSON), unwrapped from YARN's envelopes once here.
"""
from __future__ import annotations

import asyncio
import os
from typing import Callable, Sequence, cast

import aiohttp

from protocol.client_auth import CLIENT_TOKEN_ENV
from protocol.remote_exception import ApplicationIdNotHandedOut
from protocol.http_client import Body, JsonHttpClient, RemoteError
from protocol.rm_failover import FailoverJsonClient
from protocol.json_types import JsonInObject, JsonObject, JsonValue
from protocol.yarn_views import AppView, AttemptView, NewApplicationView, NodeView, ShapeView

from .errors import CliError, OperationFailed, UsageError

APPS = "/ws/v1/cluster/apps"
NODES = "/ws/v1/cluster/nodes"


def _items(body: JsonValue, outer: str, inner: str) -> list[JsonObject]:
    """YARN wraps lists as {"apps": {"app": [...]}} and sends {"apps": null} when empty."""
    if not isinstance(body, dict):
        return []
    wrapped = body.get(outer) or {}
    items = wrapped.get(inner) if isinstance(wrapped, dict) else None
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


def _unwrap(body: JsonValue, key: str) -> JsonObject:
    """`body[key]` of an answer YARN wraps as {key: {...}} (the body itself when it is not wrapped;
    {} for an empty answer)."""
    if not isinstance(body, dict):
        return {}
    inner = body.get(key, body)
    return inner if isinstance(inner, dict) else {}


def _object(body: JsonValue) -> JsonObject:
    return body if isinstance(body, dict) else {}


def _node_segment(node_id: str) -> str:
    """`node_id` as one segment of a URL path; UsageError when it is not one. A node id is
    host:port: one with '/', '?', '#', '%', whitespace or a dot segment would reach another
    resource than this node's (`../apps/x`) or be cut short by the URL (`n1:1?x`)."""
    bad = sorted({c for c in node_id if c in "/?#%" or c.isspace()})
    if not node_id or node_id in (".", "..") or bad:
        why = f"contains {', '.join(repr(c) for c in bad)}" if bad else "is not a node id"
        raise UsageError(f"node id {node_id!r} {why}: give a node id host:port as `elastane node list` shows it")
    return node_id


def translate(err: BaseException, what: str, url: str) -> CliError:
    """Map an HTTP client exception to the CLI error (and exit code) it stands for."""
    if isinstance(err, RemoteError):
        if err.status in (400, 404):
            return UsageError(err.message or str(err))
        return OperationFailed(f"{what} answered HTTP {err.status} {err.exception}: {err.message}")
    if isinstance(err, (aiohttp.ClientConnectionError, ConnectionError, OSError)):
        return OperationFailed(f"cannot reach the {what} at {url}: {err}")
    if isinstance(err, asyncio.TimeoutError):
        return OperationFailed(f"the {what} at {url} did not answer in time")
    if isinstance(err, aiohttp.ClientError):
        return OperationFailed(f"error talking to the {what} at {url}: {err}")
    raise err


class RmRestClient:
    """The YARN RM REST calls the CLI makes, as `user` (Hadoop simple auth: ?user.name=), and with
    a client token (default $ELASTANE_CLIENT_TOKEN) as its bearer, for a cluster whose
    client_auth is "token" (protocol/client_auth.py); the NMs' log calls carry it too."""

    def __init__(self, rm_url: str, user: str, timeout_s: float = 30.0, token: str | None = None):
        self.rm_url = rm_url.rstrip("/")
        self.user = user
        self.token = token if token is not None else (os.environ.get(CLIENT_TOKEN_ENV) or None)
        # `--rm http://rm1:8088,http://rm2:8088`: the RMs of an HA cluster, tried in turn
        # (protocol/rm_failover.py); one URL: that RM only.
        urls = [u.strip() for u in self.rm_url.split(",") if u.strip()]
        self._http = (FailoverJsonClient(urls, token=self.token, timeout_s=timeout_s, user=user) if len(urls) > 1
                      else JsonHttpClient(self.rm_url, token=self.token, timeout_s=timeout_s, user=user))
        self._nm: dict[str, JsonHttpClient] = {}
        self._timeout_s = timeout_s

    async def _call(self, method: str, path: str, body: Body = None,
                    params: dict[str, str] | None = None) -> JsonValue:
        try:
            return await self._http.request(method, path, body, params=params)
        except (RemoteError, aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            raise translate(e, "ResourceManager", self.rm_url) from None

    # ----- cluster ----------------------------------------------------------------------------

    async def cluster_info(self) -> JsonObject:
        return _unwrap(await self._call("GET", "/ws/v1/cluster/info"), "clusterInfo")

    async def cluster_metrics(self) -> JsonObject:
        return _unwrap(await self._call("GET", "/ws/v1/cluster/metrics"), "clusterMetrics")

    async def nodes(self) -> list[NodeView]:
        return cast(list[NodeView], _items(await self._call("GET", NODES), "nodes", "node"))

    async def put_node_state(self, node_id: str, state: str, timeout_s: float | None = None) -> NodeView:
        """Decommission (DECOMMISSIONING, killing its containers after `timeout_s`; None: wait for
        them) or recommission (RUNNING) a node; an admin's call. The node's record as it is now."""
        body: dict[str, str | float] = {"state": state}
        if timeout_s is not None:
            body["decommissionTimeout"] = timeout_s
        return cast(NodeView, _unwrap(await self._call("PUT", f"{NODES}/{_node_segment(node_id)}/state", body),
                                      "node"))

    async def utilization(self, node: str | None = None) -> JsonObject:
        """The RM's utilization series (GET /ws/v1/cluster/utilization; `node` limits it to one)."""
        return _object(await self._call("GET", "/ws/v1/cluster/utilization", params={"node": node} if node else None))

    async def policy_state(self) -> JsonObject:
        """The active policy and what it says of each job (`schedulerInfo.policy`: Harmony's job
        states and groups; {} for policies that say nothing)."""
        info = _unwrap(_unwrap(await self._call("GET", "/ws/v1/cluster/scheduler"), "scheduler"), "schedulerInfo")
        return _object(info.get("policy"))

    # ----- apps -------------------------------------------------------------------------------

    async def apps(self, states: str | None = None, queue: str | None = None, user: str | None = None,
                   limit: int | None = None) -> list[AppView]:
        params = {k: str(v) for k, v in
                  (("states", states), ("queue", queue), ("user", user), ("limit", limit)) if v is not None}
        return cast(list[AppView], _items(await self._call("GET", APPS, params=params), "apps", "app"))

    async def app(self, app_id: str) -> AppView:
        return cast(AppView, _unwrap(await self._call("GET", f"{APPS}/{app_id}"), "app"))

    async def app_attempts(self, app_id: str) -> list[AttemptView]:
        return cast(list[AttemptView],
                    _items(await self._call("GET", f"{APPS}/{app_id}/appattempts"), "appAttempts", "appAttempt"))

    async def kill(self, app_id: str) -> JsonObject:
        return _object(await self._call("PUT", f"{APPS}/{app_id}/state", {"state": "KILLED"}))

    async def move_to_queue(self, app_id: str, queue: str) -> str:
        """Move the app to `queue` (YARN's move to queue; owner or admin); the queue it is in now."""
        body = _object(await self._call("PUT", f"{APPS}/{app_id}/queue", {"queue": queue}))
        return str(body.get("queue", ""))

    async def put_lifetime(self, app_id: str, expiry_time: str) -> JsonObject:
        """Move the app's LIFETIME expiry (YARN's timeout update; owner or admin); its new timeout."""
        body = await self._call("PUT", f"{APPS}/{app_id}/timeout",
                                {"timeout": {"type": "LIFETIME", "expiryTime": expiry_time}})
        return _unwrap(body, "timeout")

    async def put_shape(self, app_id: str, workers: int, servers: int, reason: str = "",
                        nodes: Sequence[str] = (), run_state: str = "run") -> ShapeView:
        """Direct an elastic PS job to `workers` and `servers`, spread round-robin over `nodes` when
        given, in `run_state` ("run", "pause", "resume"); the app ACL applies: owner or admin."""
        body = await self._call("PUT", f"{APPS}/{app_id}/shape",
                                {"workers": workers, "servers": servers, "reason": reason,
                                 "nodes": list(nodes), "runState": run_state})
        return cast(ShapeView, _unwrap(body, "shape"))

    async def app_shape(self, app_id: str) -> ShapeView:
        """The job report the app's AM last sent, its directive and shape history (Elastane extension)."""
        return cast(ShapeView, _unwrap(await self._call("GET", f"{APPS}/{app_id}/shape"), "shape"))

    async def new_application(self) -> NewApplicationView:
        return cast(NewApplicationView, _object(await self._call("POST", f"{APPS}/new-application")))

    async def submit(self, submission: JsonInObject) -> None:
        await self._call("POST", APPS, submission)

    async def submit_new(self, build: Callable[[str], JsonInObject]) -> str:
        """new-application, then POST /apps of `build(app_id)`; the application id. When the RM
        that takes the submission did not hand that id out -- the one that did failed over or
        restarted in between (new-application ids live in an RM's memory) -- once more, with an id
        from the RM that answers now: one lost id, not a failed submission."""
        for attempt in (1, 2):
            new = await self.new_application()
            app_id = new.get("application-id")
            if not app_id:
                raise OperationFailed(f"the RM's new-application answer has no application-id: {new}")
            submission = build(str(app_id))
            try:
                await self._http.request("POST", APPS, submission)
                return str(app_id)
            except RemoteError as e:
                if attempt == 1 and e.exception == ApplicationIdNotHandedOut.exception:
                    continue
                raise translate(e, "ResourceManager", self.rm_url) from None
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
                raise translate(e, "ResourceManager", self.rm_url) from None
        raise AssertionError("unreachable: the second attempt returns or raises")

    # ----- NMs --------------------------------------------------------------------------------

    def _nm_client(self, http_address: str) -> JsonHttpClient:
        c = self._nm.get(http_address)
        if c is None:
            base = http_address if http_address.startswith("http") else f"http://{http_address}"
            c = self._nm[http_address] = JsonHttpClient(base, token=self.token, timeout_s=self._timeout_s,
                                                        user=self.user)
        return c

    async def _nm_call(self, http_address: str, path: str) -> JsonValue:
        try:
            return await self._nm_client(http_address).get(path)
        except (RemoteError, aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            raise translate(e, "NodeManager", http_address) from None

    async def nm_arbiter(self, http_address: str, limit: int = 100_000) -> JsonObject:
        """A node's Harmony arbiter: holders, queues and its latest `limit` grants."""
        body = await self._nm_call(http_address, f"/ws/v1/node/arbiter?limit={limit}")
        return _object(_object(body).get("arbiter"))

    async def nm_containers(self, http_address: str) -> list[JsonObject]:
        return _items(await self._nm_call(http_address, "/ws/v1/node/containers"), "containers", "container")

    async def container_log(self, http_address: str, container_id: str, file: str) -> str:
        body = await self._nm_call(http_address, f"/ws/v1/node/containerlogs/{container_id}/{file}")
        if body is None:
            return ""
        return body if isinstance(body, str) else str(body)

    async def close(self) -> None:
        await self._http.close()
        for c in self._nm.values():
            await c.close()
        self._nm.clear()

    async def __aenter__(self) -> "RmRestClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
