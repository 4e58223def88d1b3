"""Per-queue AM resource limit: YARN's maximum-am-resource-percent and application activation.

An ACCEPTED app's AM container is only scheduled once the app is *activated*: its AM resource,
added to what the queue's active AMs already hold, must fit the queue's AM limit
(fraction x the queue's guaranteed share of the cluster, rounded up to the minimum allocation).
As in YARN, a queue whose AMs hold nothing always activates one app, so a limit smaller than one
AM never starves a queue. Apps are considered in submission order, but a smaller AM behind a
blocked one may still be activated (YARN skips, it does not stop). Pure: no I/O, no clock.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from protocol.records import ZERO, Resource

AM_LIMIT_DIAGNOSTICS = ("Application is added to the scheduler and is not yet activated. "
                        "Queue's AM resource limit exceeded.")


def am_resource_limit(total: Resource, capacity_percent: float, fraction: float, min_mb: int) -> Resource:
    """The AM limit of a queue guaranteed `capacity_percent` of `total`: memory rounded up to a
    multiple of `min_mb` and vcores up to a whole core, like YARN's multiplyAndNormalizeUp."""
    share = capacity_percent / 100.0 * fraction
    step = max(1, min_mb)
    mem = math.ceil(total.memory * share / step - 1e-9) * step
    vcores = math.ceil(total.vcores * share - 1e-9)
    return Resource(max(0, mem), max(0, vcores))


def limit_diagnostics(request: Resource, limit: Resource, used: Resource) -> str:
    """YARN's wording for an app held back by the AM limit, with the figures behind it."""
    def fmt(r: Resource) -> str:
        return f"<memory:{r.memory}, vCores:{r.vcores}>"
    return (f"{AM_LIMIT_DIAGNOSTICS} Details : AM Resource Request = {fmt(request)}; "
            f"Queue Resource Limit for AM = {fmt(limit)}; Queue AM Resource Usage = {fmt(used)};")


@dataclass
class AmGate:
    """One queue's AM accounting: resources of active AMs and the apps waiting to be activated."""

    fraction: float                      # of the queue's guaranteed capacity
    used: Resource = ZERO                # AM resources of activated apps (allocated or about to be)
    limit: Resource = ZERO               # as of the last `admit`
    pending: dict[str, tuple[int, Resource]] = field(default_factory=dict)  # app -> (seq, AM resource)
    blocked: set[str] = field(default_factory=set)   # pending apps told they hit the limit

    def add(self, app_id: str, seq: int, resource: Resource) -> None:
        """An app asks for an AM container (new attempt): it waits for activation."""
        self.pending[app_id] = (seq, resource)

    def drop(self, app_id: str) -> None:
        """Forget a pending app (its attempt ended before activation)."""
        self.pending.pop(app_id, None)
        self.blocked.discard(app_id)

    def charge(self, r: Resource) -> None:
        self.used = self.used + r

    def uncharge(self, r: Resource) -> None:
        self.used = self.used - r

    def admit(self, limit: Resource) -> tuple[list[str], list[str]]:
        """Activate pending apps that fit under `limit`, in submission order.

        Returns (activated, newly_blocked). Activated apps are charged to `used` and leave `pending`;
        newly blocked ones are those that did not fit and had not been told so yet."""
        self.limit = limit
        activated: list[str] = []
        newly_blocked: list[str] = []
        for app_id, (_, r) in sorted(self.pending.items(), key=lambda kv: kv[1][0]):
            if (self.used + r).fits_in(limit) or self.used == ZERO:
                self.used = self.used + r
                del self.pending[app_id]
                self.blocked.discard(app_id)
                activated.append(app_id)
            elif app_id not in self.blocked:
                self.blocked.add(app_id)
                newly_blocked.append(app_id)
        return activated, newly_blocked
