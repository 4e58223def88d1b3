"""ApplicationMaster library: register with the RM, run the allocate loop, launch and stop
containers on NMs, hand events to the app through an asyncio queue, and unregister.

Typical use (see appmaster/distributed_shell.py):

    am = ApplicationMaster.from_env()
    await am.register(host, port, tracking_url)
    am.add_ask(4, Resource(512, 1))
    while True:
        ev = await am.next_event()
        if isinstance(ev, ContainersAllocated): ... await am.launch(c, LaunchContext(commands=[...]))
        elif isinstance(ev, ContainersCompleted): ...
        elif isinstance(ev, Shutdown): await am.stop_all(); return
    await am.finish(FinalStatus.SUCCEEDED, "")

Bookkeeping lives in ask_table.py and container_book.py (pure); this module does the I/O.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, replace
from typing import AsyncIterator, Callable, Optional

import aiohttp

from protocol import internal_api as api
from protocol.http_client import RemoteError
from protocol.internal_api import LaunchContext, NodeReport, ShapeDirective
from protocol.job_report import JobReport
from protocol.nm_client import NMClient
from protocol.records import ContainerState, ExitStatus, FinalStatus, Resource
from protocol.remote_exception import ApplicationMasterNotRegistered

from .am_events import (AmEvent, ContainersAllocated, ContainersCompleted, NodesUpdated, ShapeChanged,
                        Shutdown)
from .ask_table import AskTable
from .container_book import AmContainer, AmContainerState, ContainerBook, ContainerEvent
from .rm_client import AmIdentity, RmClient
from protocol.errors import StateError

log = logging.getLogger(__name__)

Clock = Callable[[], float]


@dataclass(frozen=True)
class HeartbeatPolicy:
    """How often the AM heartbeats: faster while asks are pending, as YARN's AMRMClient does."""

    interval_s: float = 1.0
    pending_interval_s: float = 0.25
    rm_failure_timeout_s: float = 30.0    # give up (Shutdown) after the RM is unreachable this long
    # While a container's end is expected (`ApplicationMaster.expect_completion`): ask this often,
    # for at most this long, until the RM reports it.
    completion_interval_s: float = 0.05
    completion_wait_s: float = 5.0

    def interval(self, asks_pending: bool) -> float:
        return self.pending_interval_s if asks_pending else self.interval_s


class AmError(StateError, RuntimeError):
    """Misuse of the AM library (e.g. launching a container that is not ALLOCATED)."""


class ApplicationMaster:
    """One attempt's AM: the RM protocol client, the NM launcher and the event queue."""

    def __init__(self, identity: AmIdentity, *, policy: HeartbeatPolicy = HeartbeatPolicy(),
                 clock: Clock = time.monotonic, auto_release_surplus: bool = True,
                 rm_client: Optional[RmClient] = None, nm_client: Optional[NMClient] = None):
        self.identity = identity
        self.policy = policy
        self.clock = clock
        self.auto_release_surplus = auto_release_surplus
        self.rm = rm_client or RmClient(identity)
        self.nm = nm_client or NMClient()
        self.asks = AskTable()
        self.book = ContainerBook()
        self.registration: Optional[api.AmRegisterResponse] = None
        self.progress = 0.0
        self.shape: Optional[JobReport] = None
        self.last_directive: Optional[ShapeDirective] = None
        # The RM's latest preemption message (capacity preemption: these containers are killed at
        # its deadline unless released first); None while none stands. Logged when it changes, so
        # the AM's log says when and why its containers went.
        self.preemption: Optional[api.PreemptionMessage] = None
        self.nodes: dict[str, NodeReport] = {}
        self.num_cluster_nodes = 0
        self.available = Resource()
        self._events: asyncio.Queue[AmEvent] = asyncio.Queue()
        self._releases: list[str] = []
        # Released but not yet reported completed by the RM (YARN AMRMClient's pendingRelease): an
        # RM that restarted or failed over gets them again when the AM registers again.
        self._pending_release: set[str] = set()
        # Containers whose end the app expects (a dropped connection to its process) -> until when
        # the loop asks at the completion interval for the RM's report of it.
        self._expected_ends: dict[str, float] = {}
        self.resyncs = 0        # re-registrations after an RM restart or failover
        self._response_id = 0
        self._register_req: Optional[api.AmRegisterRequest] = None
        self._wake = asyncio.Event()
        self._loop_task: Optional[asyncio.Task] = None
        self._rm_down_since: Optional[float] = None
        self._shut_down = False
        # Set before the loop task is cancelled: Python 3.11's wait_for swallows a cancellation that
        # lands as the awaited event fires (gh-86296), so the loop must also see a plain flag.
        self._loop_stopping = False
        # True while the allocate loop waits between calls (for a wake-up or its interval): what
        # tells an observer that a heartbeat_now() now lands on an idle loop.
        self.loop_idle = False
        self.unregistered = False

    @classmethod
    def from_env(cls, **kwargs) -> "ApplicationMaster":
        """Build from ELASTANE_RM_ADDRESS / ELASTANE_AM_TOKEN / APPLICATION_ATTEMPT_ID."""
        return cls(AmIdentity.from_env(), **kwargs)

    # ----- lifecycle -------------------------------------------------------------------------

    async def register(self, host: str = "", port: int = -1, tracking_url: str = "",
                       start_heartbeats: bool = True) -> api.AmRegisterResponse:
        """Register the attempt with the RM and start the allocate loop."""
        self._register_req = api.AmRegisterRequest(host=host, rpc_port=port, tracking_url=tracking_url)
        self.registration = await self.rm.register(self._register_req)
        log.info("registered %s (app %s, queue %s)", self.registration.attempt_id,
                 self.registration.app_id, self.registration.queue)
        for c in self.registration.containers_from_previous_attempts:
            if self.book.get(c.container_id) is None:     # running: the failed attempt launched it
                self.book.adopt(c)
        if self.registration.containers_from_previous_attempts:
            log.info("took over %d containers of the previous attempt",
                     len(self.registration.containers_from_previous_attempts))
        if start_heartbeats:
            self._loop_stopping = False
            self._loop_task = asyncio.create_task(self._heartbeat_loop(), name="am-heartbeat")
        return self.registration

    def previous_containers(self) -> list[AmContainer]:
        """The containers this attempt took over from the failed one before it (an app that keeps
        containers across attempts), as registered: running, each the app's to use or stop."""
        reg = self.registration
        out = [self.book.get(c.container_id) for c in (reg.containers_from_previous_attempts if reg else [])]
        return [c for c in out if c is not None]

    async def finish(self, final_status: FinalStatus | str, diagnostics: str = "", tracking_url: str = "",
                     timeout_s: float = 30.0) -> bool:
        """Unregister with the final status; retries until the RM confirms or `timeout_s` passes."""
        await self._stop_loop()
        status = final_status.value if isinstance(final_status, FinalStatus) else str(final_status)
        req = api.AmFinishRequest(final_status=status, diagnostics=diagnostics, tracking_url=tracking_url)
        deadline = self.clock() + timeout_s
        while True:
            try:
                out = await self.rm.finish(req)
                if out.unregistered:
                    self.unregistered = True
                    return True
            except RemoteError as e:
                if e.exception == ApplicationMasterNotRegistered.exception:
                    # The RM restarted or failed over since the AM last spoke to it: register again.
                    if await self._resync(str(e)):
                        continue
                    return False
                if e.status in (400, 401, 403, 404, 409):  # refused for good: retrying cannot help
                    log.warning("finish refused: %s", e)
                    return False
                log.warning("finish failed: %s", e)
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
                log.warning("finish: RM unreachable: %s", e)
            if self.clock() >= deadline:
                return False
            await asyncio.sleep(0.2)

    @property
    def loop_running(self) -> bool:
        """Whether the background allocate loop is still running (register starts it, finish and
        close stop it)."""
        return self._loop_task is not None and not self._loop_task.done()

    async def close(self) -> None:
        """Stop the loop and close HTTP sessions (does not unregister: see finish)."""
        await self._stop_loop()
        await self.rm.close()
        await self.nm.close()

    async def _stop_loop(self) -> None:
        task, self._loop_task = self._loop_task, None
        if task is not None and task is not asyncio.current_task():
            self._loop_stopping = True
            self._wake.set()
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass

    # ----- what the app wants ------------------------------------------------------------------

    def add_ask(self, count: int, resource: Resource, *, priority: int = 0, nodes: list[str] | None = None,
                relax_locality: bool = True, tag: str = "") -> int:
        """Ask for `count` containers of `resource`; returns the ask_id they will carry."""
        ask_id = self.asks.add(count, resource, priority=priority, nodes=nodes,
                               relax_locality=relax_locality, tag=tag)
        self.heartbeat_now()
        return ask_id

    def set_ask_count(self, ask_id: int, count: int) -> None:
        self.asks.set_count(ask_id, count)
        self.heartbeat_now()

    def set_progress(self, progress: float) -> None:
        self.progress = min(1.0, max(0.0, float(progress)))

    def set_shape(self, shape: Optional[JobReport]) -> None:
        """The elastic job's report (shape, progress, measurements), sent to the RM's policy on each
        heartbeat."""
        self.shape = shape

    def expect_completion(self, container_id: str) -> None:
        """The app believes `container_id` has ended (the AM's connection to its process dropped):
        heartbeat now and at `completion_interval_s` until the RM reports its completion or
        `completion_wait_s` passes. The RM's report stays the one word on a container's end (a
        connection can drop while the process lives); this only asks for it sooner than the
        heartbeat interval would -- the AM-side half of the NM's out-of-band heartbeat."""
        rec = self.book.get(container_id)
        if rec is not None and not rec.done:
            self._expected_ends[container_id] = self.clock() + self.policy.completion_wait_s
            self.heartbeat_now()

    def _interval(self) -> float:
        now = self.clock()
        self._expected_ends = {c: t for c, t in self._expected_ends.items() if t > now}
        if self._expected_ends:
            return self.policy.completion_interval_s
        return self.policy.interval(self.asks.pending)

    def heartbeat_now(self) -> None:
        self._wake.set()

    async def next_event(self, timeout_s: Optional[float] = None) -> Optional[AmEvent]:
        """The next event, or None after `timeout_s` (0 = only what is already queued)."""
        if not self._events.empty():
            return self._events.get_nowait()
        if timeout_s is None:
            return await self._events.get()
        try:
            async with asyncio.timeout(timeout_s):
                return await self._events.get()
        except asyncio.TimeoutError:
            return None

    async def events(self) -> AsyncIterator[AmEvent]:
        """Iterate events until (and including) Shutdown."""
        while True:
            ev = await self._events.get()
            yield ev
            if isinstance(ev, Shutdown):
                return

    @property
    def containers(self) -> dict[str, AmContainer]:
        return self.book.containers

    # ----- containers on NMs ------------------------------------------------------------------

    async def launch(self, container: AmContainer | str, ctx: LaunchContext) -> bool:
        """Start an ALLOCATED container on its NM with its container token.

        On failure the container is released to the RM and completed with exit status -1000
        (INVALID) and the NM's message as diagnostics; returns False.
        """
        rec = self._record(container)
        if rec.state is not AmContainerState.ALLOCATED:
            raise AmError(f"cannot launch {rec.container_id} in state {rec.state.value}")
        self.book.apply(rec.container_id, ContainerEvent.LAUNCH)
        try:
            status = await self.nm.start_container(rec.node_http_address, rec.token, ctx)
        except (RemoteError, aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError) as e:
            if rec.done:        # the RM already reported it (e.g. node lost meanwhile)
                return False
            self.book.finish_locally(rec.container_id, ContainerEvent.LAUNCH_FAILED, ExitStatus.INVALID,
                                     f"launch on {rec.node_id} failed: {e}")
            self._release(rec.container_id)
            self._emit(ContainersCompleted([rec]))
            return False
        if not rec.done:
            self.book.apply(rec.container_id, ContainerEvent.LAUNCHED)
            rec.pid = status.pid
            if status.state == ContainerState.COMPLETE.value:
                self._complete([status])
        return True

    async def stop(self, container: AmContainer | str) -> None:
        """Stop a container: release it if never launched, else ask its NM (the RM is told too)."""
        rec = self._record(container)
        if rec.done:
            return
        if rec.state is AmContainerState.ALLOCATED:
            self.book.finish_locally(rec.container_id, ContainerEvent.STOP, ExitStatus.KILLED_BY_APPMASTER,
                                     "released by the AM before launch")
            self._release(rec.container_id)
            self._emit(ContainersCompleted([rec]))
            return
        self.book.apply(rec.container_id, ContainerEvent.STOP)
        try:
            status = await self.nm.stop_container(rec.node_http_address, rec.container_id, rec.token)
        except (RemoteError, aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError) as e:
            # The NM may be gone; releasing makes the RM clean it up wherever it is.
            log.warning("stop %s on %s failed (%s); releasing through the RM", rec.container_id, rec.node_id, e)
            self._release(rec.container_id)
            return
        if status.state == ContainerState.COMPLETE.value:
            self._complete([status])

    async def stop_all(self) -> None:
        """Stop every live container concurrently."""
        live = self.book.live()
        if live:
            await asyncio.gather(*(self.stop(c) for c in live), return_exceptions=True)

    def release(self, container: AmContainer | str) -> None:
        """Give back a container that was never launched."""
        rec = self._record(container)
        if rec.done:
            return
        self.book.finish_locally(rec.container_id, ContainerEvent.RELEASE, ExitStatus.KILLED_BY_APPMASTER,
                                 "released by the AM")
        self._release(rec.container_id)

    def _record(self, container: AmContainer | str) -> AmContainer:
        cid = container if isinstance(container, str) else container.container_id
        rec = self.book.get(cid)
        if rec is None:
            raise AmError(f"unknown container {cid}")
        return rec

    def _release(self, container_id: str) -> None:
        if container_id not in self._releases:
            self._releases.append(container_id)
        self._pending_release.add(container_id)
        self.heartbeat_now()

    # ----- the allocate loop ------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        while not (self._shut_down or self._loop_stopping):
            # Cleared before the call, not after: a wake-up (a new ask, a release) that comes while
            # the call is on its way is for the next call, which then goes at once.
            self._wake.clear()
            try:
                await self.heartbeat_once()
            except Exception as e:   # a bug here must not leave the app waiting forever
                log.exception("allocate loop failed")
                self._shutdown(f"AM allocate loop failed: {type(e).__name__}: {e}")
                return
            if self._shut_down or self._loop_stopping:
                return
            self.loop_idle = True
            try:
                async with asyncio.timeout(self._interval()):
                    await self._wake.wait()
            except asyncio.TimeoutError:
                pass
            finally:
                self.loop_idle = False

    async def heartbeat_once(self) -> Optional[api.AllocateResponse]:
        """One allocate round trip; errors are handled here (retried, or Shutdown when fatal)."""
        asks = self.asks.to_send()
        releases = list(self._releases)
        req = api.AllocateRequest(response_id=self._response_id, asks=asks, releases=releases,
                                  progress=self.progress, shape=self.shape)
        try:
            resp = await self.rm.allocate(req)
        except RemoteError as e:
            if e.exception == ApplicationMasterNotRegistered.exception:
                # An RM that restarted or took over kept the attempt but not its session.
                await self._resync(str(e))
            elif e.status in (401, 403, 404, 409):
                self._shutdown(f"RM refused the allocate call: {e}")
            else:
                self._rm_unreachable(str(e))
            return None
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError) as e:
            self._rm_unreachable(f"{type(e).__name__}: {e}")
            return None
        self._rm_down_since = None
        self.asks.acknowledge(asks)
        self._releases = [c for c in self._releases if c not in releases]
        await self.on_allocate_response(resp)
        return resp

    def _rm_unreachable(self, why: str) -> None:
        now = self.clock()
        if self._rm_down_since is None:
            self._rm_down_since = now
        log.warning("allocate failed: %s", why)
        if now - self._rm_down_since >= self.policy.rm_failure_timeout_s:
            self._shutdown(f"RM unreachable for {now - self._rm_down_since:.0f}s: {why}")

    async def on_allocate_response(self, resp: api.AllocateResponse) -> None:
        """Apply one allocate response: book containers, emit events, follow the RM's action."""
        self._response_id = resp.response_id
        self.num_cluster_nodes = resp.num_cluster_nodes
        self.available = resp.available
        if resp.am_token and resp.am_token != self.identity.am_token:
            # The RM rolled the AM token (the launch-time one expires after cluster.toml's
            # token_lifetime_s): RmClient.allocate already sends it from now on.
            self.identity = replace(self.identity, am_token=resp.am_token)
            log.info("the RM rolled the AM token of %s", self.identity.attempt_id)
        if resp.action == "RESYNC":
            await self._resync("the RM answered RESYNC")
            return
        granted: list[AmContainer] = []
        for c in resp.allocated:
            if self.book.get(c.container_id) is not None:
                continue                                 # a duplicate grant in a retried response
            rec = self.book.add(c)
            if self.asks.on_allocated(c) or not self.auto_release_surplus:
                granted.append(rec)
            else:
                log.info("releasing surplus container %s (ask %d)", c.container_id, c.ask_id)
                self.release(rec)
        if granted:
            self._emit(ContainersAllocated(granted))
        self._complete(resp.completed)
        if resp.updated_nodes:
            for n in resp.updated_nodes:
                self.nodes[n.node_id] = n
            self._emit(NodesUpdated(list(resp.updated_nodes)))
        if resp.preemption != self.preemption:
            p = resp.preemption
            if p is not None:
                log.warning("the RM will preempt %d containers (%s) at %s unless released: %s",
                            len(p.containers), ", ".join(c.container_id for c in p.containers),
                            time.strftime("%H:%M:%S", time.gmtime(p.deadline_ms / 1000)), p.reason)
            self.preemption = p
        d = resp.shape_directive
        if d is not None and d != self.last_directive:
            self.last_directive = d
            self._emit(ShapeChanged(d))
        if resp.action == "SHUTDOWN":
            self._shutdown("the RM asked the AM to shut down (app killed or attempt failed)")

    async def _resync(self, why: str) -> bool:
        """The RM lost this attempt's session (it restarted, or another RM took over as active):
        register again, then resend the whole ask table and every release it has not confirmed
        (the next allocate carries them). Whether the registration succeeded."""
        log.warning("re-registering with the RM at %s: %s", self.rm.rm_url, why)
        self._response_id = 0
        self.asks.mark_all_dirty()
        self._releases += [c for c in sorted(self._pending_release) if c not in self._releases]
        if self._register_req is None:
            return False
        try:
            self.registration = await self.rm.register(self._register_req)
        except RemoteError as e:
            if e.status >= 500:     # no RM serves just now (a failover still going on): retried
                self._rm_unreachable(str(e))
            else:
                self._shutdown(f"re-registration refused: {e}")
            return False
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            self._rm_unreachable(str(e))
            return False
        self.resyncs += 1
        self.heartbeat_now()
        return True

    def _complete(self, statuses: list[api.ContainerStatus]) -> None:
        for s in statuses:
            self._pending_release.discard(s.container_id)
            self._expected_ends.pop(s.container_id, None)
        done = [rec for rec in (self.book.complete(s) for s in statuses) if rec is not None]
        if done:
            self._emit(ContainersCompleted(done))

    def _shutdown(self, reason: str) -> None:
        if self._shut_down:
            return
        self._shut_down = True
        log.warning("shutdown: %s", reason)
        self._emit(Shutdown(reason))

    def _emit(self, ev: AmEvent) -> None:
        self._events.put_nowait(ev)
