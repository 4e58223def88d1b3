"""The ResourceManager daemon: wires the core, state store, policy, AM launcher and HTTP APIs.

All state changes happen in the core on the event loop; after every request and timer tick the
server writes changed apps to the store and starts requested AM launches (`flush`).

The policy decides off the loop: each round snapshots the core on the loop, runs `decide` in a
single worker thread (one decide in flight at a time) on a copy of the policy, and applies the
Decision back on the loop only if the core has not changed since the snapshot
(rm/policy_runner.py); a dropped Decision is decided again at once on a fresh snapshot. So a
solve that takes seconds (Dorm's MILP) does not hold up heartbeats and allocates.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import sys
import time
from typing import Callable, Optional
from urllib.parse import urlsplit, urlunsplit

from aiohttp import web
from aiohttp.typedefs import Handler

from protocol.aggregated_logs import RemoteLogDir
from protocol.config import ClusterConfig, RMConfig
from protocol.errors import StateError
from protocol.http_server import error_response
from protocol.nm_client import NMClient
from protocol.remote_exception import ServiceUnavailable

import msgspec

from protocol.records import NodeState

from . import policies, prometheus
from .am_launcher import AmLauncher
from .core import ResourceManagerCore
from .dirty_apps import tracking
from .internal_handlers import InternalApi
from .log_retention import retention_pass
from .policy_resync import PolicyResync
from .policy_runner import decide_on_copy, finish_round, policy_held, start_round
from .rest_api import ClientApi
from .store import (DecommissionEntry, DecommissionRecord, PolicyStateRecord, SqliteStateStore, StateStore,
                    app_from_record, app_to_record, attempt_from_record, attempt_to_record)
from .submission import ValidSubmission
from .web.app_page import AppPage
from .web.ui import WebUi

log = logging.getLogger(__name__)


class StoreWriteError(StateError, RuntimeError):
    """Some apps' records could not be written; each stays dirty for the next flush."""

# A stale Decision is decided again at once this many times before the round gives up (the next
# round comes `policy_interval_s` later): under steady churn a long decide must not retry forever.
STALE_RETRIES = 1
# The policy's state is stored after a round that changed directives, else at most this often when
# it changed (Optimus's observations change every round): a new active RM goes on from a state at
# most this old, and the AMs' reports bring it up to date (rm/policies/optimus.py).
POLICY_STATE_INTERVAL_S = 5.0
GIL_SWITCH_INTERVAL_S = 0.0005


def advertised_host(cfg: RMConfig) -> str:
    """The RM host's own name for itself (RMConfig.advertise_host, else derived from the bind
    address); `client_url` uses it only when cluster.toml's rm_address names no host."""
    if cfg.advertise_host:
        return cfg.advertise_host
    if cfg.host in ("", "0.0.0.0", "::"):
        name = socket.gethostname()
        try:
            socket.getaddrinfo(name, None)
            return name
        except OSError:
            return "127.0.0.1"
    return "127.0.0.1" if cfg.host == "localhost" else cfg.host


def client_url(cfg: RMConfig, cluster: ClusterConfig, port: int) -> str:
    """The URL AMs (ELASTANE_RM_ADDRESS), NMs and clients reach this RM at, and what its ready file
    names: `http://<advertise_host>:<port>` when rm.toml sets advertise_host (an address of the
    RM's own choosing, e.g. a local cluster's bridge), else cluster.toml's rm_address, the address
    every process is configured with. The served `port` replaces rm_address's when they differ
    (`--port 0`, or an rm.toml port cluster.toml does not know of)."""
    if cfg.advertise_host:
        return f"http://{_bracketed(cfg.advertise_host)}:{port}"
    addr = cluster.rm_address.strip().rstrip("/")
    if not addr.startswith(("http://", "https://")):
        addr = "http://" + addr
    u = urlsplit(addr)
    try:
        configured_port = u.port
    except ValueError:
        configured_port = None
    if not u.hostname:
        return f"http://{_bracketed(advertised_host(cfg))}:{port}"
    if configured_port == port:
        return addr
    if cfg.port:
        log.warning("cluster.toml's rm_address %s names another port than the RM serves on (%d): "
                    "telling AMs port %d", cluster.rm_address, port, port)
    return urlunsplit((u.scheme, f"{_bracketed(u.hostname)}:{port}", u.path, "", ""))


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


class ResourceManagerServer:
    """One RM: `await start()` binds and serves, `await stop()` shuts down cleanly."""

    def __init__(self, cfg: RMConfig, cluster: ClusterConfig, clock: Callable[[], float] = time.time,
                 store: Optional[StateStore] = None, nm_client: Optional[NMClient] = None,
                 tick_interval_s: float = 0.5, policy_interval_s: float = 1.0, run_timers: bool = True):
        if not cluster.secret:
            raise ValueError("the cluster secret is empty; run `elastane secret` or protocol.config.ensure_secret")
        self.cfg = cfg
        self.cluster = cluster
        self.core = ResourceManagerCore(cfg, cluster, clock)
        self.policy = policies.create(cfg.policy, cfg)
        self.core.policy_places_new_jobs = policies.places_new_jobs(self.policy)
        self.store = store if store is not None else SqliteStateStore(cfg.state_dir)
        self._nm_client = nm_client
        self.tick_interval_s = tick_interval_s
        self.policy_interval_s = policy_interval_s
        self.run_timers = run_timers
        self.url = ""
        self.port = 0
        self.launcher: Optional[AmLauncher] = None
        self._runner: Optional[web.AppRunner] = None
        self._timers: list[asyncio.Task[None]] = []
        # One thread: one decide in flight at a time (a round waits for its decide before the next).
        self._policy_thread: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._policy_lock = asyncio.Lock()      # rounds one after another: each builds on the last's policy
        self._store_failing = False             # the last flush's write failed (logged once per outage)
        self._stopping = False                  # stop() has begun: flushes launch no AM
        # Every RM of an HA cluster (rm/ha/ sets them): AMs are told all of them, to fail over.
        self.rm_urls: list[str] = []
        # The policy state as last stored (policy document, nodes) and when; a round sets it due.
        self._policy_stored: Optional[tuple[Optional[bytes], list[str]]] = None
        self._policy_stored_at = float("-inf")
        self._policy_state_due = False
        self._policy_state_urgent = False
        self._recover()

    # ----- recovery / persistence -------------------------------------------------------------
    def _recover(self) -> None:
        epoch = self.store.next_epoch()
        if epoch is not None:   # before any container is issued (an HA term sets its own, rm/ha/)
            self.core.container_epoch = epoch
        n = 0
        for rec, attempts in self.store.load():
            self.core.recover(app_from_record(rec, self.core.scheduler.min_mb),
                              [attempt_from_record(a) for a in attempts])
            n += 1
        self.core.recovered()
        for node_id, e in self.store.load_decommissions().nodes.items():
            self.core.restore_decommission(node_id, NodeState(e.state), e.deadline, e.http_address, e.rack, e.capability)
        if n:
            log.info("recovered %d applications from %s", n, getattr(self.store, "path", "the state store"))
        self._recover_policy()
        self._persist(self.core.take_dirty())

    def _recover_policy(self) -> None:
        """Give the policy the state an earlier RM stored and hold its rounds until the recovered
        cluster is back (rm/policy_resync.py)."""
        core = self.core
        record = self.store.load_policy_state()
        state = record.policy_state if record is not None else None
        if record is not None and state is not None:
            if record.policy != self.policy.name:
                log.warning("stored policy state is %s's; policy %s starts afresh", record.policy, self.policy.name)
            else:
                try:
                    policies.restore_state(self.policy, state)
                    log.info("policy %s: state restored (stored at %.3f)", self.policy.name, record.saved_at)
                except ValueError as e:
                    log.warning("policy %s starts afresh: its stored state does not load (%s)", self.policy.name, e)
        kept = frozenset(at.attempt_id for at in core.attempts.values() if at.awaiting_resync)
        if kept or record is not None:
            now = core.clock()
            core.policy_resync = PolicyResync(now, now + max(self.cfg.nm_expiry_s, self.cfg.am_expiry_s), kept,
                                              frozenset(record.nodes if record is not None else ()))

    def _store_policy_state(self) -> None:
        """Store the policy's state if a round left it due and it changed (`POLICY_STATE_INTERVAL_S`);
        not while the rounds are held after a recovery (the nodes are not all back yet)."""
        core = self.core
        rs = core.policy_resync
        now = core.clock()
        if rs is not None and rs.holding:
            return
        if not self._policy_state_urgent and now < self._policy_stored_at + POLICY_STATE_INTERVAL_S:
            return
        doc = policies.export_state(self.policy)
        nodes = sorted(n.node_id for n in core.nodes if n.state == NodeState.RUNNING)
        self._policy_state_due = self._policy_state_urgent = False
        if (doc, nodes) == self._policy_stored:
            return
        self.store.save_policy_state(PolicyStateRecord(self.policy.name, now, nodes,
                                                       msgspec.Raw(b"null" if doc is None else doc)))
        self._policy_stored, self._policy_stored_at = (doc, nodes), now

    def _remove_forgotten(self, app_ids: set[str]) -> None:
        """Delete from the store the completed apps the core forgot (max_completed_apps); those a
        failed write left are tried again at the next flush."""
        left = sorted(app_ids)
        try:
            while left:
                self.store.remove_app(left[0])
                if self.launcher is not None:     # and its AM dir: nothing reads it any more
                    self.launcher.remove_app_dir(left[0])
                left.pop(0)
        except Exception:
            self.core.removed.update(left)
            log.exception("state store: deleting %d forgotten completed apps failed (retried at the next flush)",
                          len(left))

    def _unstore(self, app_id: str) -> None:
        """Delete what a failed submission's write may have left: a write whose answer timed out
        may have been committed (etcd took it, the answer was lost), and the record would bring
        the app back -- one its client was told was not saved -- at the next restart or failover.
        Nothing else holds this id (it was reserved for this submission). Best effort: the store
        may be down still, and then says nothing more about it than the write did."""
        try:
            self.store.remove_app(app_id)
        except Exception as e:      # noqa: BLE001 - logged; the 503 already says it was not saved
            log.warning("%s: could not remove what its failed write may have stored (%s); if that write "
                        "landed, the app comes back at the next restart or failover", app_id, e)

    def _persist(self, app_ids: set[str]) -> None:
        """Save the apps (each atomically, but for one with more attempts than an etcd transaction
        holds; the store may pack several into one write): one the store refuses (too large, a
        write that failed) stays dirty and is named, and does not keep the others from being saved."""
        records = []
        for app_id in sorted(app_ids):
            app = self.core.apps.get(app_id)
            if app is not None:
                records.append((app_to_record(app), [attempt_to_record(self.core.attempts[a]) for a in app.attempts]))
        failed = self.store.save_apps(records)     # those failed stay dirty: retried at the next flush
        if failed:
            self.core.dirty |= set(failed)
            first = next(iter(failed.items()))
            raise StoreWriteError(f"{len(failed)} app(s) not saved, e.g. {first[0]}: {first[1]}") from first[1]

    @property
    def ha_info(self) -> Optional[dict[str, object]]:
        """The HA fields of /ws/v1/cluster/info: none for a single RM (rm/ha/ha_server.py's
        active RM gives its own)."""
        return None

    def flush(self) -> None:
        """Write changed apps to the store and start requested AM launches."""
        core = self.core
        if core.dirty:
            app_ids = core.take_dirty()
            try:
                self._persist(app_ids)
                self._store_failing = False
            except Exception:
                # Kept for the next flush (_persist put back those it could not save): a store
                # down for a moment (etcd electing its leader) must not lose these apps' changes;
                # logged once per outage.
                if not self._store_failing:
                    log.exception("state store write failed (retried at every flush until it succeeds)")
                self._store_failing = True
        if core.removed and not self._store_failing:
            self._remove_forgotten(core.take_removed())
        if core.decommissions_dirty and not self._store_failing:
            try:
                self.store.save_decommissions(DecommissionRecord({
                    n.node_id: DecommissionEntry(n.state.value, deadline, n.http_address, n.rack, n.capability)
                    for n, deadline in core.decommissions()}))
                core.decommissions_dirty = False
            except Exception:
                log.exception("storing the decommissioned nodes failed (retried at the next flush)")
        if self._policy_state_due and not self._store_failing:
            try:
                self._store_policy_state()
            except Exception:
                log.exception("storing the policy state failed (retried after the next round)")
        if core.effects and self.launcher is not None and self.may_launch():
            for eff in core.take_effects():
                self.launcher.launch(eff)

    def may_launch(self) -> bool:
        """Whether a flush may start the AM launches the core asked for: not once stop() has begun,
        nor once the store refused a write as fenced -- this flush's own, say: another RM is or may
        be active, and an AM launched now would run an attempt it does not know of
        (docs/operating.md, "How fencing protects the store"). Checked after the flush's writes."""
        return not self._stopping and not self.store.fenced

    def submit(self, user: str, sub: ValidSubmission) -> None:
        """NEW -> NEW_SAVING -> (stored) -> SUBMITTED -> ACCEPTED; nothing is left if the store fails.
        The same submission sent again (its first answer was lost) is accepted and changes nothing."""
        if self.core.earlier_submission(sub.app_id, user, sub.name, sub.app_type, sub.am):
            log.info("%s: the same submission again from %s; the earlier one stands", sub.app_id, user)
            return
        app = self.core.submit(sub.app_id, user, sub.name, sub.queue, sub.app_type, sub.am,
                               sub.max_attempts or self.cfg.max_app_attempts,
                               ps_job=sub.ps_job, extension=sub.extension, keep_containers=sub.keep_containers,
                               lifetime_s=sub.lifetime_s)
        try:
            self._persist({app.app_id})
        except Exception as e:
            self.core.forget_unsaved(app.app_id)
            log.exception("could not store %s", app.app_id)
            self._unstore(app.app_id)
            raise ServiceUnavailable(f"could not save application {app.app_id}: {e}") from None
        # Only this app's change is stored: other apps a failed flush left dirty stay so, for the
        # next flush (taking them all here dropped their pending writes for good).
        self.core.dirty.discard(app.app_id)
        self.core.app_saved(app.app_id)

    # ----- HTTP -------------------------------------------------------------------------------
    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """protocol.http_server's error_middleware around a flush after every request, in one
        middleware: each is a coroutine layer on every NM heartbeat."""
        try:
            with tracking() as changed:
                try:
                    resp = await handler(request)
                finally:
                    core = self.core
                    if core.dirty or core.effects:
                        self.flush()
            unsaved = changed & core.dirty
            if unsaved:
                # What this request changed is not in the store (a write failed, or this RM may no
                # longer act as the active): answering OK would confirm what a restart or the next
                # active would not know -- an AM's finish, a kill. 503: the caller retries, the
                # change is kept and written at the next flush that can.
                raise ServiceUnavailable(f"the change to {', '.join(sorted(unsaved))} could not be stored yet; retry")
            return resp
        except Exception as e:
            err = error_response(request, e)
            if err is None:
                raise
            return err

    def build_app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=16 * 1024 * 1024)
        ClientApi(self).add_routes(app)
        InternalApi(self).add_routes(app)
        WebUi(self).add_routes(app)
        AppPage(self).add_routes(app)
        app.router.add_get("/metrics/prometheus", self._prometheus)
        return app

    async def _prometheus(self, request: web.Request) -> web.Response:
        return web.Response(body=prometheus.render(self.core).encode(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    def attach_launcher(self, url: str) -> None:
        self.url = url
        self.launcher = AmLauncher(self.core, url, self.cfg.state_dir, self.flush, self._nm_client,
                                   failover_urls=self.rm_urls)

    async def start(self) -> str:
        """Bind cfg.host:cfg.port (0 = ephemeral), start timers; returns the URL AMs and clients
        use (`client_url`)."""
        self._runner = web.AppRunner(self.build_app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.cfg.host, self.cfg.port, reuse_address=True)
        await site.start()
        addresses = self._runner.addresses  # the bound port, needed for port 0
        self.port = addresses[0][1] if addresses else self.cfg.port
        self.attach_launcher(client_url(self.cfg, self.cluster, self.port))
        self.start_timers()
        self.flush()
        log.info("ResourceManager serving on %s:%d (advertised %s), policy %s",
                 self.cfg.host, self.port, self.url, self.cfg.policy)
        return self.url

    def start_timers(self) -> None:
        if self.run_timers:
            loop = asyncio.get_running_loop()
            self._timers = [loop.create_task(self._every(self.tick_interval_s, self.core.tick)),
                            loop.create_task(self._policy_rounds())]
            if self.cluster.log_retain_check_s > 0:
                self._timers.append(loop.create_task(self._log_retention(self.cluster.log_retain_check_s)))

    @property
    def policy_rounds(self) -> dict[str, int]:
        """Policy rounds so far whose Decision was applied, and dropped as stale."""
        c = self.core.counters
        return {"applied": c["policy_rounds_applied"], "dropped": c["policy_rounds_dropped"]}

    async def policy_round(self, retries: int = STALE_RETRIES) -> Optional[int]:
        """One policy round with `decide` in the worker thread: how many directives changed, or
        None when every try was stale (the core moved while the policy decided, `retries` + 1 times)."""
        async with self._policy_lock:
            return await self._policy_round(retries)

    async def _policy_round(self, retries: int) -> Optional[int]:
        loop = asyncio.get_running_loop()
        if self._policy_thread is None:
            self._policy_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rm-policy")
            # The policy thread runs Python between its solver's GIL-free stretches; the loop waits
            # for the GIL at most this long each time it wakes (CPython's default is 5 ms).
            sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_INTERVAL_S))
        if policy_held(self.core):
            return 0
        for _ in range(retries + 1):
            rnd = start_round(self.core)
            decided = await loop.run_in_executor(self._policy_thread, decide_on_copy, self.policy, rnd.snapshot)
            changed = finish_round(self.core, rnd, decided.decision)
            if changed is not None:
                self.policy = decided.policy      # the copy's state goes with the Decision it took
                self.core.counters["policy_rounds_applied"] += 1
                self._policy_state_due = True
                self._policy_state_urgent = self._policy_state_urgent or changed > 0
                return changed
            self.core.counters["policy_rounds_dropped"] += 1
            log.debug("policy %s: decision on a stale snapshot dropped", self.policy.name)
        return None

    async def _policy_rounds(self) -> None:
        while True:
            await asyncio.sleep(self.policy_interval_s)   # a periodic timer, not a readiness wait
            try:
                await self.policy_round()
            except Exception:
                log.exception("policy round failed")
            self.flush()

    async def log_retention_pass(self) -> list[str]:
        """Delete the aggregated logs past cluster.toml's retention (rm/log_retention.py), in a
        worker thread (it lists and deletes in the remote dir); the app ids deleted."""
        running = frozenset(app_id for app_id, app in self.core.apps.items() if not app.state.is_final)
        store = RemoteLogDir(self.cluster.remote_app_log_dir)
        return await asyncio.to_thread(retention_pass, store, running, time.time(),
                                       self.cluster.remote_app_log_retain_s)

    async def _log_retention(self, interval_s: float) -> None:
        while True:
            try:
                await self.log_retention_pass()
            except Exception:
                log.exception("aggregated log retention failed (tried again in %.0f s)", interval_s)
            await asyncio.sleep(interval_s)   # a periodic timer, not a readiness wait

    async def _every(self, interval_s: float, fn: Callable[[], object]) -> None:
        while True:
            await asyncio.sleep(interval_s)   # a periodic timer, not a readiness wait
            try:
                fn()
            except Exception:
                log.exception("periodic %s failed", getattr(fn, "__name__", fn))
            self.flush()

    async def stop(self) -> None:
        for t in self._timers:
            t.cancel()
        await asyncio.gather(*self._timers, return_exceptions=True)
        self._timers = []
        if self._policy_thread is not None:
            # A decide still running works on a copy of the policy: nothing waits for it.
            self._policy_thread.shutdown(wait=False, cancel_futures=True)
            self._policy_thread = None
        # Requests first: a handler still running may flush and ask for an AM launch. From then on
        # no flush launches an AM that no one would record (the next RM recovers the attempt and
        # launches it); the last flush still removes forgotten apps' AM dirs through the launcher,
        # closed after it (its launches in flight cancelled).
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self._stopping = True
        self.flush()
        if self.launcher is not None:
            await self.launcher.close()
        self.store.close()
        log.info("ResourceManager stopped")
