"""Records shared by every daemon: resources, states and YARN's container exit statuses."""
from __future__ import annotations

import enum

import msgspec


class Resource(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename={"vcores": "vCores"}):
    """A resource vector, YARN-style (`{"memory": MB, "vCores": n}`); extensible to gpus."""

    memory: int = 0
    vcores: int = 0

    def __add__(self, other: "Resource") -> "Resource":
        return Resource(self.memory + other.memory, self.vcores + other.vcores)

    def __sub__(self, other: "Resource") -> "Resource":
        return Resource(self.memory - other.memory, self.vcores - other.vcores)

    def scale(self, n: int) -> "Resource":
        return Resource(self.memory * n, self.vcores * n)

    def fits_in(self, other: "Resource") -> bool:
        return self.memory <= other.memory and self.vcores <= other.vcores

    def is_nonnegative(self) -> bool:
        return self.memory >= 0 and self.vcores >= 0

    def dominant_share(self, total: "Resource") -> float:
        """DRF dominant share of this usage against a cluster total."""
        shares = []
        if total.memory > 0:
            shares.append(self.memory / total.memory)
        if total.vcores > 0:
            shares.append(self.vcores / total.vcores)
        return max(shares) if shares else 0.0

    def to_json(self) -> dict[str, int]:
        return {"memory": self.memory, "vCores": self.vcores}


ZERO = Resource(0, 0)


class AppState(str, enum.Enum):
    NEW = "NEW"
    NEW_SAVING = "NEW_SAVING"
    SUBMITTED = "SUBMITTED"
    ACCEPTED = "ACCEPTED"
    RUNNING = "RUNNING"
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    KILLED = "KILLED"

    @property
    def is_final(self) -> bool:
        return self in (AppState.FINISHED, AppState.FAILED, AppState.KILLED)


class FinalStatus(str, enum.Enum):
    UNDEFINED = "UNDEFINED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    KILLED = "KILLED"


class AttemptState(str, enum.Enum):
    NEW = "NEW"
    SUBMITTED = "SUBMITTED"
    SCHEDULED = "SCHEDULED"
    ALLOCATED = "ALLOCATED"
    LAUNCHED = "LAUNCHED"
    RUNNING = "RUNNING"
    FINISHING = "FINISHING"
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    KILLED = "KILLED"


class NodeState(str, enum.Enum):
    NEW = "NEW"
    RUNNING = "RUNNING"
    UNHEALTHY = "UNHEALTHY"
    DECOMMISSIONING = "DECOMMISSIONING"
    DECOMMISSIONED = "DECOMMISSIONED"
    LOST = "LOST"
    REBOOTED = "REBOOTED"
    SHUTDOWN = "SHUTDOWN"


class ContainerState(str, enum.Enum):
    """Container state as NMs report it (YARN's ContainerState)."""

    NEW = "NEW"
    RUNNING = "RUNNING"
    COMPLETE = "COMPLETE"


class ExitStatus:
    """YARN's ContainerExitStatus codes; a process's own exit code is reported as is."""

    SUCCESS = 0
    INVALID = -1000
    ABORTED = -100
    DISKS_FAILED = -101
    PREEMPTED = -102
    KILLED_EXCEEDED_VMEM = -103
    KILLED_EXCEEDED_PMEM = -104
    KILLED_BY_APPMASTER = -105
    KILLED_BY_RESOURCEMANAGER = -106
    KILLED_AFTER_APP_COMPLETION = -107

    NAMES = {
        0: "SUCCESS",
        -1000: "INVALID",
        -100: "ABORTED",
        -101: "DISKS_FAILED",
        -102: "PREEMPTED",
        -103: "KILLED_EXCEEDED_VMEM",
        -104: "KILLED_EXCEEDED_PMEM",
        -105: "KILLED_BY_APPMASTER",
        -106: "KILLED_BY_RESOURCEMANAGER",
        -107: "KILLED_AFTER_APP_COMPLETION",
    }

    @classmethod
    def describe(cls, code: int) -> str:
        return cls.NAMES.get(code, f"exit code {code}")
