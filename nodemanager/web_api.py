"""The NM's HTTP API: the container API (`/internal/v1/containers`) and YARN's `/ws/v1/node`."""
from __future__ import annotations

import asyncio
import html
import os
import time
import urllib.parse
from typing import Any, BinaryIO, Callable, Optional

from aiohttp import web

from protocol import codec, tokens
from protocol.aggregated_logs import AggregatedLogError, LogStream, NodeLogs, RemoteLogDir, find_container, iter_log
from protocol.client_auth import check_log_reader, request_user
from protocol.config import ClusterConfig
from protocol.http_server import json_response, make_app, read_json
from protocol.ids import ContainerId
from protocol.internal_api import CONTAINER_START, NodeUtilization, StartContainerRequest
from protocol.prometheus_text import CONTENT_TYPE
from protocol.records import ExitStatus, Resource
from protocol.remote_exception import ApiError, BadRequest, NotFound, Unauthorized

from . import prometheus
from .container import Container
from .container_manager import ContainerManager
from .container_state import NMContainerState
from .log_aggregation_service import regular_files


class NodeWebApi:
    """Request handlers; every container call is authorised by the RM-signed container token."""

    def __init__(self, manager: ContainerManager, secret: str, node_id: str, url: Callable[[], str],
                 node_info: Callable[[], dict[str, Any]],
                 arbiter_view: Optional[Callable[[int], dict[str, Any]]] = None,
                 utilization: Callable[[], Optional[NodeUtilization]] = lambda: None,
                 remote_logs: Optional[RemoteLogDir] = None, cluster: Optional[ClusterConfig] = None):
        self.manager = manager
        # Who may read container logs (cluster.toml's client_auth; None: anyone, as under simple auth).
        self.cluster = cluster
        # Aggregated logs (cluster.toml's remote_app_log_dir): the log calls answer from there for a
        # container whose logs are no longer on this node -- or were never on it: any NM serves any.
        self.remote_logs = remote_logs
        self.arbiter_view = arbiter_view
        self.utilization = utilization
        self.secret = secret
        self.node_id = node_id
        self.url = url
        self.node_info = node_info

    def app(self) -> web.Application:
        app = make_app()
        r = app.router
        r.add_post(CONTAINER_START, self.start_container)
        r.add_post("/internal/v1/containers/{id}/stop", self.stop_container)
        r.add_get("/internal/v1/containers/{id}", self.container_status)
        r.add_get("/ws/v1/node", self.get_node_info)
        r.add_get("/ws/v1/node/info", self.get_node_info)
        r.add_get("/ws/v1/node/apps", self.get_apps)
        r.add_get("/ws/v1/node/containers", self.get_containers)
        r.add_get("/ws/v1/node/containers/{id}", self.get_container)
        r.add_get("/ws/v1/node/containers/{id}/logs", self.get_log_files)
        r.add_get("/ws/v1/node/containerlogs/{id}", self.get_log_files)
        r.add_get("/ws/v1/node/containerlogs/{id}/{filename}", self.get_log_file)
        r.add_get("/node/containerlogs/{id}/{user}", self.log_page)    # the RM's amContainerLogs links
        r.add_get("/ws/v1/node/arbiter", self.get_arbiter)
        r.add_get("/metrics/prometheus", self.prometheus)
        return app

    async def prometheus(self, request: web.Request) -> web.Response:
        m = self.manager
        running = sum(1 for c in m.containers.values() if c.state is NMContainerState.RUNNING)
        text = prometheus.render(self.node_id, m.capability, m.used(), running, self.utilization(), time.time())
        return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE})

    # ----- token checks -------------------------------------------------------------------------

    def _verify(self, token: str | None, allow_expired: bool = False) -> dict[str, Any]:
        """Claims of a valid container token for this node (past its expiry too with
        `allow_expired`); 401 otherwise."""
        if not token:
            raise Unauthorized("missing container token")
        try:
            claims = tokens.verify(self.secret, token, tokens.CONTAINER, allow_expired=allow_expired)
        except tokens.TokenError as e:
            raise Unauthorized(f"invalid container token: {e}") from None
        if claims.get("node_id") != self.node_id:
            raise Unauthorized(f"container token is for node {claims.get('node_id')!r}, this is {self.node_id!r}")
        return claims

    def _verify_for(self, request: web.Request, cid: str) -> dict[str, Any]:
        """For a stop or status call: a token past its expiry still serves for a container this NM
        has (it was started with a then valid token; the signature binds node, container and app),
        so an AM can stop and watch containers that outlive container_token_lifetime_s. A start
        (`start_container`) needs an unexpired one."""
        known = self.manager.containers.get(cid)
        claims = self._verify(tokens.token_from_header(request.headers.get("Authorization")),
                              allow_expired=known is not None)
        if claims.get("container_id") != cid:
            raise Unauthorized(f"container token is for {claims.get('container_id')!r}, not {cid}")
        if known is not None and claims.get("app_id") != known.app_id:
            raise Unauthorized(f"container token is for app {claims.get('app_id')!r}, {cid} is of {known.app_id}")
        return claims

    # ----- container API ------------------------------------------------------------------------

    async def start_container(self, request: web.Request) -> web.Response:
        header_token = tokens.token_from_header(request.headers.get("Authorization"))
        if header_token is not None:
            self._verify(header_token)  # a forged header is refused before the body is looked at
        req = await read_json(request, StartContainerRequest)
        if header_token is not None and header_token != req.container_token:
            raise Unauthorized("the bearer token and the body's container_token differ")
        claims = self._verify(req.container_token)
        try:
            resource = codec.decode_as(claims.get("resource"), Resource)
        except codec.DecodeError as e:
            raise BadRequest(f"container token resource: {e}") from None
        c = await self.manager.start(claims, resource, req.launch_context)
        return json_response(c.status())

    async def stop_container(self, request: web.Request) -> web.Response:
        cid = request.match_info["id"]
        self._verify_for(request, cid)
        c = await self.manager.stop(cid, ExitStatus.KILLED_BY_APPMASTER, "Container killed by the ApplicationMaster.")
        if c is None:
            raise NotFound(f"container {cid} is not known on node {self.node_id}")
        return json_response(c.status())

    async def container_status(self, request: web.Request) -> web.Response:
        cid = request.match_info["id"]
        self._verify_for(request, cid)
        return json_response(self._get(cid).status())

    # ----- YARN NM REST -------------------------------------------------------------------------

    def _get(self, cid: str) -> Container:
        c = self.manager.containers.get(cid)
        if c is None:
            raise NotFound(f"container {cid} is not known on node {self.node_id}")
        return c

    async def get_node_info(self, request: web.Request) -> web.Response:
        return json_response({"nodeInfo": self.node_info()})

    async def get_apps(self, request: web.Request) -> web.Response:
        apps: dict[str, dict[str, Any]] = {}
        for c in self.manager.containers.values():
            a = apps.setdefault(c.app_id, {"id": c.app_id, "user": c.user, "state": "FINISHED",
                                           "containerids": []})
            a["containerids"].append(c.container_id)
            if c.finished_at is None:
                a["state"] = "RUNNING"
        return json_response({"apps": {"app": list(apps.values())}})

    async def get_arbiter(self, request: web.Request) -> web.Response:
        """The Harmony arbiter's holders, queues and latest grants (`?limit=N`, default 1000)."""
        if self.arbiter_view is None:
            raise NotFound(f"node {self.node_id} runs no arbiter")
        try:
            limit = int(request.query.get("limit", "1000"))
        except ValueError:
            raise BadRequest(f"limit must be an integer, got {request.query.get('limit')!r}") from None
        if limit < 0:
            raise BadRequest(f"limit must be >= 0, got {limit}")
        return json_response({"arbiter": self.arbiter_view(limit)})

    def _container_json(self, c: Container) -> dict[str, Any]:
        d = c.node_info(self.node_id, self.url())
        d["containerLogFiles"] = [f["fileName"] for f in _log_files(c.log_dir)]
        return d

    async def get_containers(self, request: web.Request) -> web.Response:
        return json_response({"containers": {"container": [self._container_json(c)
                                                           for c in self.manager.containers.values()]}})

    async def get_container(self, request: web.Request) -> web.Response:
        return json_response({"container": self._container_json(self._get(request.match_info["id"]))})

    def _local_logs(self, cid: str) -> Optional[list[dict[str, Any]]]:
        """The container's log files on this node; None when it has none here (unknown or freed)."""
        c = self.manager.containers.get(cid)
        files = _log_files(c.log_dir) if c is not None else []
        return files if files else None

    def _caller(self, request: web.Request) -> str:
        """Who asks for logs ("" when they are open to all: no cluster config); under client_auth =
        "token", 401 without a known client token. Each log call asks first, before it reads
        anything: an unauthenticated client must not make this NM read the aggregated logs' store."""
        return request_user(self.cluster, request) if self.cluster is not None else ""

    def _check_reader(self, user: str, cid: str, owner: Optional[str]) -> None:
        """Under client_auth = "token", only the container's app's owner or an admin reads its logs
        (protocol/client_auth.py); open under simple auth."""
        if self.cluster is None:
            return
        check_log_reader(self.cluster, user, owner, cid)

    def _local_owner(self, cid: str) -> Optional[str]:
        c = self.manager.containers.get(cid)
        return c.user if c is not None else None

    async def _aggregated(self, cid: str) -> tuple[NodeLogs, dict[str, int]]:
        """(the node's aggregated logs, file name -> size) of the container; 404 if there are none.
        The caller is to be authenticated already (`_caller`): this reads the store."""
        where = f" nor in the aggregated logs at {self.remote_logs.url}" if self.remote_logs else ""
        found = None
        if self.remote_logs is not None:
            try:
                found = await asyncio.to_thread(find_container, self.remote_logs, cid)
            except (AggregatedLogError, OSError) as e:
                raise ApiError(f"cannot read the aggregated logs of {cid}: {e}") from None
        if found is None:
            raise NotFound(f"container {cid} is not known on node {self.node_id}{where}")
        return found

    async def get_log_files(self, request: web.Request) -> web.Response:
        cid = request.match_info["id"]
        user = self._caller(request)
        local = self._local_logs(cid)
        if local is None and (self.remote_logs is not None or cid not in self.manager.containers):
            node, files = await self._aggregated(cid)
            self._check_reader(user, cid, node.user)
            infos = [{"fileName": n, "fileSize": size, "lastModifiedTime": 0} for n, size in sorted(files.items())]
            return json_response({"containerLogsInfo": {"containerLogInfo": infos, "logAggregationType": "AGGREGATED",
                                                        "containerId": cid, "nodeId": node.node_id}})
        self._check_reader(user, cid, self._local_owner(cid))
        return json_response({"containerLogsInfo": {"containerLogInfo": local or [],
                                                    "logAggregationType": "LOCAL",
                                                    "containerId": cid,
                                                    "nodeId": self.node_id}})

    async def get_log_file(self, request: web.Request) -> web.StreamResponse:
        cid = request.match_info["id"]
        user = self._caller(request)
        name = request.match_info["filename"]
        if name in ("", ".", "..") or "/" in name or "\x00" in name:
            raise BadRequest(f"invalid log file name {name!r}")
        start = request.query.get("start", "0")
        try:
            n = int(start)
        except ValueError:
            raise BadRequest(f"start must be an integer, got {start!r}") from None
        c = self.manager.containers.get(cid)
        path = os.path.join(c.log_dir, name) if c is not None else ""
        local: Optional[_LocalLog] = None
        if path and os.path.isfile(path) and not os.path.islink(path):
            self._check_reader(user, cid, self._local_owner(cid))
            try:
                local = await asyncio.to_thread(_read_from, path, n)
            except FileNotFoundError:   # expired meanwhile (its app's retention ran out): as if absent
                local = None
        if local is not None:
            # Streamed a piece at a time: a log may be many GB, and a reader must not cost the NM its size.
            stream = LogStream(local, length=local.length)
            await stream.start()
            return await stream.respond(request)
        if not (self.remote_logs is not None or c is None):
            raise NotFound(f"log file {name} not found for container {cid}")
        return await (await self._aggregated_file(user, cid, name, n)).respond(request)

    async def _aggregated_file(self, user: str, cid: str, name: str, start: int) -> LogStream:
        """The aggregated log `name` of `cid` from byte `start` for the authenticated `user`, its
        first piece read (404 when it is not there, 500 when it cannot be read), for the caller to
        stream."""
        store = self.remote_logs
        node, files = await self._aggregated(cid)     # 404 naming the store when the container is not there
        self._check_reader(user, cid, node.user)
        assert store is not None
        if name not in files:
            raise NotFound(f"log file {name} not found for container {cid} in the aggregated logs at {store.url}")
        try:
            stream = LogStream(iter_log(store, str(ContainerId.parse(cid).app), node, cid, name, start))
            await stream.start()
        except (AggregatedLogError, OSError) as e:
            raise ApiError(f"cannot read the aggregated log {name} of {cid}: {e}") from None
        return stream

    async def log_page(self, request: web.Request) -> web.Response:
        """A plain HTML page listing the container's log files with links (YARN's NM log page):
        the target of the RM's amContainerLogs links, local or aggregated alike."""
        cid = request.match_info["id"]
        user = self._caller(request)
        local = self._local_logs(cid)
        if local is not None:
            self._check_reader(user, cid, self._local_owner(cid))
            files = [(f["fileName"], int(f["fileSize"])) for f in local]
            kind = f"on node {self.node_id}"
        else:
            node, sizes = await self._aggregated(cid)
            self._check_reader(user, cid, node.user)
            files = sorted(sizes.items())
            kind = f"aggregated from node {node.node_id}"
        esc = html.escape

        def seg(s: str) -> str:        # a path segment: a file named "a?b" or "%2e%2e" links to itself
            return esc(urllib.parse.quote(s, safe=""))
        rows = "".join(f'<li><a href="/ws/v1/node/containerlogs/{seg(cid)}/{seg(n)}">{esc(n)}</a> ({size} bytes)</li>'
                       for n, size in files)
        body = (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>Logs of {esc(cid)}</title></head>"
                f"<body><h1>Logs of {esc(cid)}</h1><p>{esc(kind)}</p><ul>{rows}</ul></body></html>")
        return web.Response(text=body, content_type="text/html")


LOG_PIECE_BYTES = 256 << 10     # a local log file is read and sent this much at a time


class _LocalLog:
    """A local log file open from a byte offset to the size it had when opened (a log still being
    written ends there, as one GET), read a piece at a time: an iterator of its pieces."""

    def __init__(self, f: BinaryIO, pos: int, size: int):
        self._f = f
        self.length = size - pos          # the bytes this read serves (its Content-Length)
        self._left = self.length

    def __iter__(self) -> "_LocalLog":
        return self

    def __next__(self) -> bytes:
        if self._left <= 0:
            self.close()
            raise StopIteration
        piece = self._f.read(min(LOG_PIECE_BYTES, self._left))
        if not piece:
            self.close()
            raise OSError(f"the log file shrank while it was read ({self._left} of {self.length} bytes unread)")
        self._left -= len(piece)
        return piece

    def close(self) -> None:
        self._f.close()


def _read_from(path: str, start: int) -> _LocalLog:
    """The file open from byte `start`; a negative `start` gives the last -start bytes (YARN's
    `start`). Opened here (FileNotFoundError when it is gone), read as it is iterated."""
    # O_NOFOLLOW: a container's log dir is the container's to write, links included.
    f = os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb")
    try:
        size = os.fstat(f.fileno()).st_size
        pos = 0
        if start < 0:
            pos = max(0, size + start)
        elif start > 0:
            pos = min(start, size)        # past the end: nothing (a huge offset would not fit a seek)
        f.seek(pos)
    except BaseException:
        f.close()
        raise
    return _LocalLog(f, pos, size)


def _log_files(log_dir: str) -> list[dict[str, Any]]:
    return [{"fileName": n, "fileSize": st.st_size, "lastModifiedTime": int(st.st_mtime * 1000)}
            for n, st in regular_files(log_dir)]
