"""Helpers for testing the RM in-process (tests only): a fake clock, a core factory, NM/AM message builders."""
from __future__ import annotations

import time
from typing import Any

import msgspec

from protocol import internal_api as api
from protocol import tokens
from protocol.config import ClusterConfig, QueueConfig, RMConfig
from protocol.ps_job_spec import PSJobSpec
from protocol.records import Resource

from rm.core import ResourceManagerCore
from rm.model import AmSpec

SECRET = "test-secret-0123456789"


class FakeClock:
    """A settable clock for liveness tests (no sleeps)."""

    def __init__(self, t: float | None = None):
        # Starts at the real time so the tokens the core signs are valid for real verifiers.
        self.t = time.time() if t is None else t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def make_core(clock: FakeClock | None = None, queues: list[QueueConfig] | None = None,
              **cfg_kw: Any) -> ResourceManagerCore:
    cfg = RMConfig(**cfg_kw) if queues is None else RMConfig(queues=queues, **cfg_kw)
    return ResourceManagerCore(cfg, ClusterConfig(secret=SECRET, admins=["root"]), clock or FakeClock())


def nm_claims(node_id: str) -> dict[str, Any]:
    return {"node_id": node_id}


def register(core: ResourceManagerCore, node_id: str, mem: int = 8192, vcores: int = 8,
             rack: str = "/default-rack") -> api.NodeRegisterResponse:
    return core.register_node(nm_claims(node_id), api.NodeRegisterRequest(
        node_id=node_id, http_address=node_id, capability=Resource(mem, vcores), rack=rack))


def heartbeat(core: ResourceManagerCore, node_id: str, statuses: list[api.ContainerStatus] | None = None,
              healthy: bool = True, response_id: int | None = None) -> api.NodeHeartbeatResponse:
    """Heartbeat as an NM that got the RM's last response (`response_id` echoes it) unless told otherwise."""
    if response_id is None:
        node = core.nodes.get(node_id)
        response_id = node.response_id if node is not None else 0
    return core.node_heartbeat(nm_claims(node_id), api.NodeHeartbeatRequest(
        node_id=node_id, response_id=response_id, used=Resource(0, 0), container_statuses=statuses or [],
        health=api.NodeHealth(healthy=healthy)))


def submit(core: ResourceManagerCore, user: str = "alice", queue: str = "default", mem: int = 1024,
           vcores: int = 1, max_attempts: int = 2) -> str:
    app_id = core.new_application()
    core.submit(app_id, user, "job", queue, "YARN", AmSpec(["true"], {}, {}, Resource(mem, vcores)),
                max_attempts)
    core.app_saved(app_id)
    return app_id


def ps_spec(fields: dict[str, Any]) -> PSJobSpec:
    """A PS job spec from its JSON fields, as rm/submission.py hands it to `core.submit` (decoded;
    the data checks of `ps_job_spec.validate` are left to the tests of submission)."""
    return msgspec.convert(fields, PSJobSpec)


def am_claims(core: ResourceManagerCore, app_id: str) -> dict[str, Any]:
    app = core.apps[app_id]
    return {"app_id": app_id, "attempt_id": app.current_attempt, "user": app.user}


def launch_and_register(core: ResourceManagerCore, app_id: str) -> dict[str, Any]:
    """Process the AM launch effect for `app_id` and register its AM; returns its token claims."""
    for eff in core.take_effects():
        core.am_launched(eff.attempt_id)
    claims = am_claims(core, app_id)
    core.am_register(claims, api.AmRegisterRequest(tracking_url="http://am:1"))
    return claims


def ask(ask_id: int, count: int, mem: int = 1024, vcores: int = 1, **kw: Any) -> api.ResourceAsk:
    return api.ResourceAsk(ask_id=ask_id, count=count, resource=Resource(mem, vcores), **kw)


def sign_nm(node_id: str, secret: str = SECRET) -> str:
    return tokens.sign(secret, tokens.NM, {"node_id": node_id}, 3600)
