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
    """One queue's AM accounting: resources of active AMs and the apps waiting to be activated.

    `admit` looks again only at what can have changed: the apps added since its last call, unless
    room grew meanwhile (an AM's charge given back, a larger limit), when it looks at every waiting
    app. An app it found blocked still cannot fit while its queue's AMs only grew and the limit did
    not: a full pass per call made a new RM's recovery of thousands of waiting apps (one admission
    each) quadratic, 19 s for 5,000 apps, past an HA lease (tests/unit/test_rm_am_limit.py checks
    the two agree)."""

    fraction: float                      # of the queue's guaranteed capacity
    used: Resource = ZERO                # AM resources of activated apps (allocated or about to be)
    limit: Resource = ZERO               # as of the last `admit`
    pending: dict[str, tuple[int, Resource]] = field(default_factory=dict)  # app -> (seq, AM resource)
    blocked: set[str] = field(default_factory=set)   # pending apps told they hit the limit
    fresh: list[str] = field(default_factory=list)   # added since the last `admit`
    room_grew: bool = True                           # since the last `admit`: look at every app

    def add(self, app_id: str, seq: int, resource: Resource) -> None:
        """An app asks for an AM container (new attempt): it waits for activation."""
        self.pending[app_id] = (seq, resource)
        self.fresh.append(app_id)

    def drop(self, app_id: str) -> None:
        """Forget a pending app (its attempt ended before activation)."""
        self.pending.pop(app_id, None)
        self.blocked.discard(app_id)

    def charge(self, r: Resource) -> None:
        self.used = self.used + r

    def uncharge(self, r: Resource) -> None:
        self.used = self.used - r
        self.room_grew = True

    def admit(self, limit: Resource) -> tuple[list[str], list[str]]:
        """Activate pending apps that fit under `limit`, in submission order.

        Returns (activated, newly_blocked). Activated apps are charged to `used` and leave `pending`;
        newly blocked ones are those that did not fit and had not been told so yet."""
        if self.room_grew or not limit.fits_in(self.limit):
            look = list(self.pending)
        else:
            look = [a for a in dict.fromkeys(self.fresh) if a in self.pending]
        self.fresh.clear()
        self.room_grew = False
        self.limit = limit
        activated: list[str] = []
        newly_blocked: list[str] = []
        for app_id in sorted(look, key=lambda a: self.pending[a][0]):
            r = self.pending[app_id][1]
            if (self.used + r).fits_in(limit) or self.used == ZERO:
                self.used = self.used + r
                del self.pending[app_id]
                self.blocked.discard(app_id)
                activated.append(app_id)
            elif app_id not in self.blocked:
                self.blocked.add(app_id)
                newly_blocked.append(app_id)
        return activated, newly_blocked
