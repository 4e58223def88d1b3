"""Test support for NodeManager process tests: a fake RM and an NM subprocess runner (no tests here)."""
from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from aiohttp import web

from protocol import codec, tokens
from protocol import internal_api as api
from protocol.http_server import json_response, make_app, read_json, require_token
from protocol.nm_client import container_token_payload
from protocol.records import Resource
from polling import async_wait_until

SECRET = "test-secret-" + "ab" * 16
REPO = Path(__file__).resolve().parents[2]
RM_START_MS = 1700000000000
_seq = itertools.count(1)


@dataclass
class FakeNodeRM:
    """A small in-test RM: checks NM tokens, records registrations and heartbeats, sends actions."""

    registrations: list[api.NodeRegisterRequest] = field(default_factory=list)
    heartbeats: list[api.NodeHeartbeatRequest] = field(default_factory=list)
    pending_cleanup: list[str] = field(default_factory=list)
    pending_app_cleanup: list[str] = field(default_factory=list)
    next_action: str = "NORMAL"
    response_id: int = 0
    runner: Optional[web.AppRunner] = None
    url: str = ""
    bad_tokens: int = 0
    heartbeat_interval_ms: int = 100     # the period its answers give the NM (which follows it)

    async def start(self, port: int = 0) -> "FakeNodeRM":
        app = make_app()
        app.router.add_post(api.NODE_REGISTER, self._register)
        app.router.add_post(api.NODE_HEARTBEAT, self._heartbeat)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    def _check(self, request: web.Request, node_id: str) -> None:
        try:
            claims = require_token(request, SECRET, tokens.NM)
        except Exception:
            self.bad_tokens += 1
            raise
        assert claims["node_id"] == node_id, "nm token is for another node"

    async def _register(self, request: web.Request) -> web.Response:
        req = await read_json(request, api.NodeRegisterRequest)
        self._check(request, req.node_id)
        self.registrations.append(req)
        self.response_id = 0
        return json_response(api.NodeRegisterResponse(node_id=req.node_id, heartbeat_interval_ms=self.heartbeat_interval_ms,
                                                      rm_start_ms=RM_START_MS))

    async def _heartbeat(self, request: web.Request) -> web.Response:
        req = await read_json(request, api.NodeHeartbeatRequest)
        self._check(request, req.node_id)
        self.heartbeats.append(req)
        action, self.next_action = self.next_action, "NORMAL"
        cleanup, self.pending_cleanup = self.pending_cleanup, []
        apps, self.pending_app_cleanup = self.pending_app_cleanup, []
        self.response_id = req.response_id + 1
        return json_response(api.NodeHeartbeatResponse(response_id=self.response_id, action=action,
                                                       containers_to_cleanup=cleanup, apps_to_cleanup=apps,
                                                       heartbeat_interval_ms=self.heartbeat_interval_ms))

    def last_status(self, cid: str) -> Optional[api.ContainerStatus]:
        """The newest status of `cid` reported in any heartbeat or registration."""
        for hb in reversed(self.heartbeats):
            for s in hb.container_statuses:
                if s.container_id == cid:
                    return s
        for reg in reversed(self.registrations):
            for s in reg.containers:
                if s.container_id == cid:
                    return s
        return None


@dataclass
class NMProcess:
    """`python -m nodemanager` started by a test and stopped by its pid."""

    proc: subprocess.Popen
    ready_file: Path
    info: dict
    dirs: dict[str, Path]

    @property
    def address(self) -> str:
        return self.info["http_address"]

    @property
    def node_id(self) -> str:
        return self.info["node_id"]

    @property
    def url(self) -> str:
        return self.info["url"]

    def stderr_text(self) -> str:
        return Path(self.dirs["base"], "nm.stderr").read_text()


def write_configs(base: Path, extra_nm: str = "") -> tuple[Path, Path]:
    cluster = base / "cluster.toml"
    cluster.write_text(f'[cluster]\nsecret = "{SECRET}"\n')
    nm = base / "nm.toml"
    nm.write_text("[nm]\nkeep_finished_logs_s = 600.0\n" + extra_nm)
    return nm, cluster


async def start_nm(base: Path, rm: FakeNodeRM, *, cgroups: str = "auto", memory_mb: int = 1024, vcores: int = 2,
                   port: int = 0, extra_nm: str = "", timeout: float = 20.0, wait_ready: bool = True,
                   rm_url: str = "") -> NMProcess:
    """Start an NM against `rm` and wait for its ready file (it is written after registration)."""
    base.mkdir(parents=True, exist_ok=True)
    nm_toml, cluster_toml = write_configs(base, extra_nm)
    dirs = {"base": base, "local": base / "local", "logs": base / "logs", "recovery": base / "recovery"}
    ready = base / "ready.json"
    if ready.exists():
        ready.unlink()
    cmd = [sys.executable, "-m", "nodemanager", "--config", str(nm_toml), "--cluster-config", str(cluster_toml),
           "--rm-address", rm_url or rm.url, "--host", "127.0.0.1", "--port", str(port), "--memory-mb", str(memory_mb),
           "--vcores", str(vcores), "--local-dir", str(dirs["local"]), "--log-dir", str(dirs["logs"]),
           "--recovery-dir", str(dirs["recovery"]), "--cgroups", cgroups, "--heartbeat-interval-ms", "100",
           "--ready-file", str(ready)]
    err = open(base / "nm.stderr", "ab")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=err)
    err.close()

    def ready_or_dead() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"NM exited with {proc.returncode}: {(base / 'nm.stderr').read_text()[-3000:]}")
        return ready.exists()

    if not wait_ready:
        return NMProcess(proc, ready, {}, dirs)
    try:
        await async_wait_until(ready_or_dead, timeout, what="NM ready file")
    except BaseException:
        # SIGTERM first: an NM that got as far as its cgroups removes them on the way out.
        try:
            kill_nm(proc, signal.SIGTERM)
        except subprocess.TimeoutExpired:
            kill_nm(proc)
        raise
    return NMProcess(proc, ready, json.loads(ready.read_text()), dirs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_nm(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        proc.wait(timeout=30)


async def stop_nm(nm: NMProcess, timeout: float = 20.0) -> int:
    """SIGTERM the NM by pid and wait for its exit status."""
    if nm.proc.poll() is None:
        nm.proc.send_signal(signal.SIGTERM)
        await async_wait_until(lambda: nm.proc.poll() is not None, timeout, what="NM exit after SIGTERM")
    return nm.proc.returncode


def new_ids() -> tuple[str, str, str]:
    """A fresh (app_id, attempt_id, container_id) triple in YARN's format."""
    n = next(_seq) + os.getpid() % 1000 * 10
    app = f"application_{RM_START_MS}_{n:04d}"
    attempt = f"appattempt_{RM_START_MS}_{n:04d}_000001"
    cid = f"container_{RM_START_MS}_{n:04d}_01_000001"
    return app, attempt, cid


def container_token(node_id: str, cid: str, app_id: str, attempt_id: str, memory: int = 128, vcores: int = 1,
                    secret: str = SECRET, lifetime: float = 3600.0, user: str = "alice") -> str:
    payload = container_token_payload(cid, node_id, app_id, attempt_id, user, Resource(memory, vcores))
    return tokens.sign(secret, tokens.CONTAINER, payload, lifetime)


def proc_alive(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def group_alive(pgid: int) -> bool:
    """Whether any non-zombie process remains in process group `pgid`."""
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            stat = (p / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def decode_status(obj: Any) -> api.ContainerStatus:
    return codec.decode_as(obj, api.ContainerStatus)
