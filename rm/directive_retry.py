"""Re-issues a directive that its job acted on and did not reach (pure: time arrives as an argument).

An AM carries out each directive version once. When the containers of a change do not all come
within the launch timeout, it trains at what came (a restart or an EPS add that started short,
docs/internals.md) and reports the directive as acted on. The policies plan on the directive's
shape (rm/policies/eps_jobs.RunningJob), so a policy that decides the same shape again changes
nothing: the RM numbers a directive only when it changes, and the job stayed short until its
policy's decision moved. Measured on the default trace (docs/simulator.md, "SSP jobs and
directives"), 17-26 of DRF's ~700 reshapes a seed started short.

So the RM sends the same directive again under a new version once the job has been short of it
for a while: `FIRST_RETRY_S` after it settled short, then twice as long after each retry that
came short again (at most `MAX_RETRY_S`), and only while the nodes have room for what the job
lacks (`lacking` against the nodes' free resources: on the nodes the directive names, or
anywhere), because a full cluster would otherwise make the job pay a change (for a kill-mode or
SSP job, a checkpoint and a relaunch that waits out the launch timeout) for nothing. A retry due
while there is no room waits for it, uncounted. A job that reaches its directive, or gets a new
one, starts the count over. The count is in memory only: a new active RM starts it over, at worst
one early retry.

A directive the job cannot carry out at all (more workers than its input splits) is not one it
came short of: its AM acts on it as no change and says why (`JobReport.directive_refused`), and
sending it again would only be refused again, so it is never due.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import msgspec

from protocol.internal_api import NodePlacement, RunState, ShapeDirective
from protocol.job_report import JobReport
from protocol.records import Resource

from .policies.eps_jobs import units

FIRST_RETRY_S = 60.0
MAX_RETRY_S = 960.0
SENT_AGAIN = "sent again: the job acted on it and came short"    # a re-sent directive's reason says so


def short_of(directive: ShapeDirective | None, report: JobReport | None) -> bool:
    """The job has acted on `directive` (a RUN one), changes nothing now, and has another shape --
    not one it refused (`JobReport.directive_refused`: a change it cannot make, which the same
    directive sent again would not make either)."""
    if directive is None or report is None or directive.run_state is not RunState.RUN:
        return False
    return (not report.changing and report.directive_version >= directive.version
            and not report.refused(directive.version)
            and (report.workers, report.servers) != (directive.workers, directive.servers))


@dataclass
class ShortRetry:
    """One app's retry count: since when it has been short of `version`, and how many retries of
    the same shape came short before."""

    version: int = 0
    since: float | None = None
    retries: int = 0

    def delay(self) -> float:
        return min(MAX_RETRY_S, FIRST_RETRY_S * 2.0 ** self.retries)


@dataclass
class DirectiveRetries:
    """Every app's `ShortRetry`; `due` says which directives to send again now."""

    apps: dict[str, ShortRetry] = field(default_factory=dict)

    def due(self, app_id: str, directive: ShapeDirective | None, report: JobReport | None, now: float,
            room: Callable[[], bool] = lambda: True) -> bool:
        """Observe one app at `now`; True when its directive should go out again (counted as a
        retry: the caller numbers it anew and tells `renumbered`). `room`, asked only once a retry
        is due: the nodes have room for what the job lacks; without it the retry waits."""
        st = self.apps.get(app_id)
        if directive is None or (st is not None and st.version != directive.version):
            self.apps.pop(app_id, None)             # a new directive from the policy: count anew
            st = None
            if directive is None:
                return False
        if not short_of(directive, report):
            if st is not None:
                acted = report is not None and not report.changing and report.directive_version >= directive.version
                if acted:
                    del self.apps[app_id]           # reached it
                else:
                    st.since = None                 # a retry under way: wait for how it ends
            return False
        if st is None:
            st = self.apps[app_id] = ShortRetry(directive.version)
        if st.since is None:
            st.since = now
            return False
        if now - st.since < st.delay() or not room():
            return False
        st.retries += 1
        st.since = None
        return True

    def renumbered(self, app_id: str, version: int) -> None:
        """The app's directive went out again as `version`: the same shape, the count kept."""
        st = self.apps.get(app_id)
        if st is not None:
            st.version = version

    def forget(self, app_id: str) -> None:
        self.apps.pop(app_id, None)


def lacking(directive: ShapeDirective, report: JobReport, held: tuple[NodePlacement, ...]) -> dict[str, int]:
    """Executors the job lacks of its directive, per node it names (`held`: the job's executors
    per node now), or under "" for a directive that names none."""
    if not directive.placement:
        return {"": max(0, directive.workers - report.workers) + max(0, directive.servers - report.servers)}
    have = {p.node: p for p in held}
    out: dict[str, int] = {}
    for p in directive.placement:
        h = have.get(p.node)
        n = max(0, p.workers - (h.workers if h else 0)) + max(0, p.servers - (h.servers if h else 0))
        if n:
            out[p.node] = n
    return out


def has_room(lacks: dict[str, int], executor: Resource, free: dict[str, Resource]) -> bool:
    """`free` (per RUNNING node) holds the lacking executors: each named node its own, "" (anywhere)
    the sum of every node's whole executors."""
    for node, n in lacks.items():
        fits = (sum(units(f, executor) for f in free.values()) if node == "" else
                units(free.get(node, Resource(0, 0)), executor))
        if fits < n:
            return False
    return True


def again(directive: ShapeDirective, version: int, retries: int) -> ShapeDirective:
    """`directive` sent again as `version`, its reason the policy's with why (once, however many
    times it has gone out)."""
    policy_reason = directive.reason.partition(SENT_AGAIN)[0].rstrip("; ")
    why = f"{SENT_AGAIN} (retry {retries})"
    return msgspec.structs.replace(directive, version=version,
                                   reason=f"{policy_reason}; {why}" if policy_reason else why)


__all__ = ["FIRST_RETRY_S", "MAX_RETRY_S", "SENT_AGAIN", "DirectiveRetries", "ShortRetry", "again", "has_room", "lacking", "short_of"]
