"""One container as the NM tracks it: identity, resource, process, dirs, state and outcome."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from protocol.internal_api import ContainerStatus
from protocol.records import ExitStatus, Resource

from .cgroup_base import ContainerCgroup
from .container_state import ContainerEvent, NMContainerState, external_state, transition


@dataclass
class Container:
    """Runtime record of a container; `apply` moves it through the pure state machine."""

    container_id: str
    app_id: str
    attempt_id: str
    user: str
    resource: Resource
    token_expiry: float
    work_dir: str
    log_dir: str
    exit_file: str
    state: NMContainerState = NMContainerState.NEW
    exit_status: int = ExitStatus.INVALID
    diagnostics: str = ""
    pid: Optional[int] = None
    pgid: Optional[int] = None
    start_time: Optional[int] = None     # /proc/<pid>/stat start time, to recognise the pid later
    cgroup: Optional[ContainerCgroup] = None
    kill_status: Optional[int] = None    # exit status decided by a stop (-104/-105/-106/-107)
    kill_diagnostics: str = ""
    recovered: bool = False
    reported: bool = False               # the RM has seen its completion
    launched_at: float = 0.0             # wall clock
    finished_at: Optional[float] = None  # wall clock
    role: str = ""                       # launch environment's ELASTANE_CONTAINER_ROLE (metrics label)
    launch_path: str = ""                # how its process started: shell | cold | zygote | zygote-spare
    launch_ms: dict[str, float] = field(default_factory=dict, repr=False)  # the NM's launch phases
    phase_mark: float = field(default=0.0, repr=False)
    process: Optional[Any] = field(default=None, repr=False)  # launcher.ContainerProcess
    exited: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def apply(self, event: ContainerEvent) -> NMContainerState:
        self.state = transition(self.state, event)
        return self.state

    def launch_phase(self, name: str) -> None:
        """Record the time since the previous phase ended (or the launch began: name "") as `name`,
        for the node API (bench/container_launch.py reads the NM's start path from it)."""
        now = time.perf_counter()
        if name and self.phase_mark:
            self.launch_ms[name] = round((now - self.phase_mark) * 1e3, 3)
        self.phase_mark = now

    def status(self, with_role: bool = False) -> ContainerStatus:
        """Its status; `with_role` for a registration (the RM re-adopts a container with its role)."""
        return ContainerStatus(container_id=self.container_id, state=external_state(self.state).value,
                               exit_status=self.exit_status, diagnostics=self.diagnostics,
                               resource=self.resource, pid=self.pid, role=self.role if with_role else "")

    def to_record(self) -> dict[str, Any]:
        """What the recovery dir keeps of a running container."""
        return {
            "container_id": self.container_id, "app_id": self.app_id, "attempt_id": self.attempt_id,
            "user": self.user, "resource": self.resource.to_json(), "token_expiry": self.token_expiry,
            "work_dir": self.work_dir, "log_dir": self.log_dir, "exit_file": self.exit_file,
            "pid": self.pid, "pgid": self.pgid, "start_time": self.start_time,
            "cgroup": self.cgroup.to_json() if self.cgroup else None, "launched_at": self.launched_at,
            "role": self.role,
            # Set once the container is finished, so a restarted NM can still report it.
            "final": ({"exit_status": self.exit_status, "diagnostics": self.diagnostics,
                       "finished_at": self.finished_at} if self.finished_at is not None else None),
        }

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> "Container":
        res = r["resource"]
        return cls(
            container_id=str(r["container_id"]), app_id=str(r["app_id"]), attempt_id=str(r.get("attempt_id", "")),
            user=str(r.get("user", "")), resource=Resource(int(res["memory"]), int(res["vCores"])),
            token_expiry=float(r.get("token_expiry", 0)), work_dir=str(r["work_dir"]),
            log_dir=str(r["log_dir"]), exit_file=str(r["exit_file"]), pid=r.get("pid"), pgid=r.get("pgid"),
            start_time=r.get("start_time"),
            cgroup=ContainerCgroup.from_json(r["cgroup"]) if r.get("cgroup") else None,
            launched_at=float(r.get("launched_at", 0)), role=str(r.get("role", "")), recovered=True)

    def node_info(self, node_id: str, nm_url: str) -> dict[str, Any]:
        """YARN NM REST `container` object."""
        return {
            "id": self.container_id,
            "appId": self.app_id,
            "state": self.state.value,
            "exitCode": self.exit_status,
            "diagnostics": self.diagnostics,
            "user": self.user,
            "totalMemoryNeededMB": self.resource.memory,
            "totalVCoresNeeded": self.resource.vcores,
            "nodeId": node_id,
            "containerLogsLink": f"{nm_url}/ws/v1/node/containerlogs/{self.container_id}",
            "containerLogFiles": [],
            "pid": self.pid,
            "cgroupDirs": list(self.cgroup.dirs) if self.cgroup else [],
            "launchPath": self.launch_path,
            "launchPhasesMs": dict(self.launch_ms),
        }
