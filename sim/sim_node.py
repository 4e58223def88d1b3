"""A simulated NodeManager: registers with the core, heartbeats its containers, obeys cleanups.

It holds the containers started on it (by the simulated AMs, as a real AM starts them through the
NM's API) and reports each RUNNING on every heartbeat and COMPLETE once, after it stopped it (the
RM asked for a cleanup, the app was cleaned up, or the container exited on its own) -- the same
statuses a real NM sends (nodemanager/), so the core's release bookkeeping runs as on a cluster.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from protocol import internal_api as api
from protocol.json_types import JsonObject
from protocol.records import ContainerState, ExitStatus, Resource

if TYPE_CHECKING:
    from rm.core import ResourceManagerCore


class SimNode:
    """One simulated NM (`node_id` is "host:port" as real NMs name themselves)."""

    def __init__(self, node_id: str, capability: Resource, rack: str = "/default-rack",
                 labels: tuple[str, ...] = ()):
        self.node_id = node_id
        self.labels = labels         # node labels it registers with (protocol/node_labels.py)
        self.capability = capability
        self.rack = rack
        self.response_id = 0
        self.running: dict[str, str] = {}        # container id -> app id
        self._completed: list[api.ContainerStatus] = []

    @property
    def claims(self) -> JsonObject:
        """What the NM's token would say (the core checks the node id against it)."""
        return {"node_id": self.node_id}

    def register(self, core: "ResourceManagerCore") -> None:
        core.register_node(self.claims, api.NodeRegisterRequest(
            node_id=self.node_id, http_address=self.node_id, capability=self.capability, rack=self.rack,
            node_labels=list(self.labels)))

    def start(self, container_id: str, app_id: str) -> None:
        """An AM (or the RM's AM launcher) started this container here."""
        self.running[container_id] = app_id

    def exit(self, container_id: str, exit_status: int = ExitStatus.SUCCESS, diagnostics: str = "") -> None:
        """The container's process ended on its own (e.g. an AM after it unregistered)."""
        if self.running.pop(container_id, None) is not None:
            self._completed.append(api.ContainerStatus(container_id=container_id,
                                                       state=ContainerState.COMPLETE.value,
                                                       exit_status=exit_status, diagnostics=diagnostics))

    def heartbeat(self, core: "ResourceManagerCore") -> None:
        statuses = [api.ContainerStatus(container_id=cid, state=ContainerState.RUNNING.value)
                    for cid in self.running]
        statuses += self._completed
        self._completed = []
        resp = core.node_heartbeat(self.claims, api.NodeHeartbeatRequest(
            node_id=self.node_id, response_id=self.response_id, used=Resource(0, 0), container_statuses=statuses))
        if resp.action == "RESYNC":
            self.response_id = 0
            self.register(core)
            return
        self.response_id = resp.response_id
        for cid in resp.containers_to_cleanup:
            self.exit(cid, ExitStatus.KILLED_BY_APPMASTER, "Container killed on request")
        for app_id in resp.apps_to_cleanup:
            for cid in [c for c, a in self.running.items() if a == app_id]:
                self.exit(cid, ExitStatus.KILLED_AFTER_APP_COMPLETION, "Container of a finished application")


__all__ = ["SimNode"]
