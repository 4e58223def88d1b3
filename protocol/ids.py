"""YARN-format identifiers: application, attempt, container."""
from __future__ import annotations

import re
from dataclasses import dataclass

_APP_RE = re.compile(r"^application_(\d+)_(\d{4,})$")
_ATTEMPT_RE = re.compile(r"^appattempt_(\d+)_(\d{4,})_(\d{6,})$")
_CONTAINER_RE = re.compile(r"^container_(?:e(\d+)_)?(\d+)_(\d{4,})_(\d{2,})_(\d{6,})$")


@dataclass(frozen=True, order=True)
class ApplicationId:
    cluster_ts: int
    seq: int

    def __str__(self) -> str:
        return f"application_{self.cluster_ts}_{self.seq:04d}"

    @classmethod
    def parse(cls, s: str) -> "ApplicationId":
        m = _APP_RE.match(s)
        if not m:
            raise ValueError(f"invalid application id {s!r}")
        return cls(int(m.group(1)), int(m.group(2)))


def is_application_id(name: str) -> bool:
    """`name` is an application id in its one canonical spelling (a dir named for an app)."""
    try:
        return str(ApplicationId.parse(name)) == name
    except ValueError:
        return False


@dataclass(frozen=True, order=True)
class AttemptId:
    app: ApplicationId
    attempt: int

    def __str__(self) -> str:
        return f"appattempt_{self.app.cluster_ts}_{self.app.seq:04d}_{self.attempt:06d}"

    @classmethod
    def parse(cls, s: str) -> "AttemptId":
        m = _ATTEMPT_RE.match(s)
        if not m:
            raise ValueError(f"invalid application attempt id {s!r}")
        return cls(ApplicationId(int(m.group(1)), int(m.group(2))), int(m.group(3)))


@dataclass(frozen=True, order=True)
class ContainerId:
    """YARN's container id. `epoch` is the RM's HA term (rm/ha/): YARN writes a non-zero one as
    `container_e<epoch>_...` (two digits at least), so two terms never hand out the same id even
    for an attempt the old active had not stored yet; 0 (no HA) keeps the plain form."""

    attempt: AttemptId
    seq: int
    epoch: int = 0

    def __str__(self) -> str:
        a = self.attempt
        e = f"e{self.epoch:02d}_" if self.epoch else ""
        return f"container_{e}{a.app.cluster_ts}_{a.app.seq:04d}_{a.attempt:02d}_{self.seq:06d}"

    @classmethod
    def parse(cls, s: str) -> "ContainerId":
        m = _CONTAINER_RE.match(s)
        if not m:
            raise ValueError(f"invalid container id {s!r}")
        app = ApplicationId(int(m.group(2)), int(m.group(3)))
        return cls(AttemptId(app, int(m.group(4))), int(m.group(5)), int(m.group(1) or 0))

    @property
    def app(self) -> ApplicationId:
        return self.attempt.app
