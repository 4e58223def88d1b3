"""RmContext: what the RM's HTTP handlers and web pages use of the server.

rm.rest_api (the client API), rm.internal_handlers (the AM/NM/admin API) and the web pages (rm/web/)
type against this Protocol instead of the whole rm.server.ResourceManagerServer, which satisfies it.
Read-only properties, so a test can hand in any object with these members."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Protocol

if TYPE_CHECKING:
    from protocol.config import ClusterConfig, RMConfig

    from .core import ResourceManagerCore
    from .policies import Policy
    from .submission import ValidSubmission


class RmContext(Protocol):
    @property
    def cfg(self) -> RMConfig:
        """The RM's settings (policy name, attempt limits...)."""

    @property
    def cluster(self) -> ClusterConfig:
        """The cluster's settings (secret, admins)."""

    @property
    def core(self) -> ResourceManagerCore:
        """The RM's state and its transitions: apps, nodes, queues, decisions, utilization."""

    @property
    def policy(self) -> Policy:
        """The scheduling policy the RM runs."""

    @property
    def policy_interval_s(self) -> float:
        """How often the policy runs."""

    def submit(self, user: str, sub: ValidSubmission) -> None:
        """Admit a validated submission (stored before it is accepted)."""

    @property
    def ha_info(self) -> Optional[dict[str, object]]:
        """An HA RM's fields of /ws/v1/cluster/info (rm/ha/); None for a single RM."""
