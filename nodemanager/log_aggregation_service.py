"""Log aggregation's I/O: lists this node's container logs, uploads what the planner
(`log_aggregation.LogAggregationPlanner`) says to `remote_app_log_dir`, frees the local copies.

Local layout (the container manager's): <log_dir>/<app_id>/<container_id>/<file>. Uploads and
listings run in a worker thread, one app at a time, so a slow store never holds the event loop; the
store's run in a daemon thread of their own, so one stuck in a store cannot keep the NM's process
from exiting after `stop` gave up on it (asyncio.run waits for its executor's threads).
"""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import stat
import threading
import time
from typing import Any, Callable, Collection, Mapping, TypeVar

from protocol.aggregated_logs import (AggregatedLogError, AggregatedLogIndex, LogFileWriter, RemoteLogDir, node_file_name,
                                      parse_file_name, roll_file_name)
from protocol.ids import is_application_id
from protocol.internal_api import LogAggregationReport

from .log_aggregation import AppLogState, LocalLogFile, LogAggregationPlanner, Upload

log = logging.getLogger(__name__)

TICK_S = 1.0        # how often the planner is asked (rolls, retries, retention) between wake-ups
# How long `stop` may take for the last uploads: within bin/elastane-daemon's 30 s before SIGKILL
# (ELASTANE_STOP_TIMEOUT), with the RM link's and the containers' steps before it.
STOP_UPLOAD_TIMEOUT_S = 20.0

T = TypeVar("T")


async def in_daemon_thread(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` in a daemon thread of its own: unlike asyncio.to_thread's, a thread stuck in a
    store then keeps neither asyncio.run's end nor the interpreter's exit waiting."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not fut.done():      # not given up on (a cancelled wait)
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)

    def run() -> None:
        value: Any
        try:
            ok, value = True, fn(*args)
        except Exception as e:  # noqa: BLE001 - handed to the awaiting task
            ok, value = False, e
        try:
            loop.call_soon_threadsafe(settle, ok, value)
        except RuntimeError:
            pass                # the loop is closed: nobody waits any more
    threading.Thread(target=run, name="log-aggregation-io", daemon=True).start()
    return await fut


def regular_files(d: str) -> list[tuple[str, os.stat_result]]:
    """(name, stat) of each regular file in `d`, by name; [] when `d` is not there. A container's
    log dir: the NM's log calls list it, aggregation uploads it. A symlink is not one (lstat): a
    container that links /etc/shadow into its log dir must not have the NM serve or upload it."""
    try:
        names = sorted(os.listdir(d))
    except OSError:
        return []
    out = []
    for n in names:
        try:
            st = os.lstat(os.path.join(d, n))
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            out.append((n, st))
    return out


def local_log_files(log_dir: str, app_id: str) -> list[LocalLogFile]:
    """Every regular file <log_dir>/<app_id>/<container>/<file>, sorted by container and name."""
    app_dir = os.path.join(log_dir, app_id)
    try:
        containers = sorted(os.listdir(app_dir))
    except OSError:
        return []
    return [LocalLogFile(cid, n, os.path.join(app_dir, cid, n), st.st_size)
            for cid in containers for n, st in regular_files(os.path.join(app_dir, cid))]


def app_log_dirs(log_dir: str) -> list[str]:
    """The app ids of the directories in `log_dir` (anything else there is not the NM's)."""
    try:
        names = sorted(os.listdir(log_dir))
    except OSError:
        return []
    return [n for n in names if is_application_id(n) and os.path.isdir(os.path.join(log_dir, n))]


class LogAggregationService:
    """Runs the planner for this node: `app_finished` (the RM's word, through the container
    manager) wakes it; otherwise it looks every TICK_S for rolls, retries and retention."""

    def __init__(self, store: RemoteLogDir, log_dir: str, node_id: str, planner: LogAggregationPlanner,
                 apps: Callable[[], Mapping[str, str]], clock: Callable[[], float] = time.time):
        self.store = store
        self.log_dir = log_dir
        self.node_id = node_id
        self.node_file = node_file_name(node_id)
        self.planner = planner
        self.apps = apps            # app id -> user, of the containers the node knows
        self.clock = clock
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self) -> None:
        """Take up the apps whose logs a previous run of this NM left (their containers' records
        may be gone: reported before it stopped), then run. The RM hears of them at registration
        (`held_apps`) and says which are over."""
        now = self.clock()
        for app_id in app_log_dirs(self.log_dir):
            self.planner.seen(app_id, "", now)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self, live_apps: Collection[str] = (), timeout_s: float = STOP_UPLOAD_TIMEOUT_S) -> None:
        """End the service with a last upload (YARN's NM aggregates its apps' logs when it stops):
        each app none of whose containers here still runs -- not in `live_apps` -- gets its final
        upload now, even if the app runs on elsewhere (a decommissioned node, a SIGTERM): this
        node's part of it is over, and nothing else would ever upload it (docs/operating.md, "Log
        aggregation"). An app in `live_apps` (a container that outlives the NM) is left to the
        next run. Bounded by `timeout_s`, the pass under way included: what is not up by then
        stays in log_dir, uploaded by a restarted NM once the RM says the app is over."""
        task, self._task = self._task, None
        self._stopping = True
        self._wake.set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        if task is not None:
            # The pass under way ends first: its upload and the last one must not race.
            await asyncio.wait([task], timeout=timeout_s)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        try:
            async with asyncio.timeout_at(deadline):
                await self._last_uploads(set(live_apps))
        except TimeoutError:
            pass
        left = sorted(st.app_id for st in self.planner.apps.values()
                      if st.final_at is None and st.app_id not in live_apps)
        if left:
            log.warning("stopping with the logs of %s not aggregated to %s (the last uploads failed or took over "
                        "%g s): they stay in %s, uploaded when this NM runs again and the RM says the app is over",
                        ", ".join(left), self.store.url, timeout_s, self.log_dir)

    async def _last_uploads(self, live: set[str]) -> None:
        now = self.clock()
        known = dict(self.apps())
        for app_id, user in known.items():
            self.planner.seen(app_id, user, now)
        for st in list(self.planner.apps.values()):
            if st.final_at is None and st.app_id not in live:
                self.planner.stopping(st.app_id, known.get(st.app_id, ""), now)
                await self._step(st)

    def app_finished(self, app_id: str) -> None:
        """The app is over here (its containers stopped): its final upload is due."""
        self.planner.finished(app_id, self.apps().get(app_id, ""), self.clock())
        self._wake.set()

    def holds(self, app_id: str) -> bool:
        """Whether the app's local logs must stay (see LogAggregationPlanner.holds)."""
        return self.planner.holds(app_id, self.clock())

    def held_apps(self) -> list[str]:
        """The apps whose local logs are still here (for the NM's registration)."""
        return [a for a, st in self.planner.apps.items() if not st.freed]

    def pending_reports(self) -> list[LogAggregationReport]:
        return self.planner.pending_reports()

    def all_reports(self) -> list[LogAggregationReport]:
        return self.planner.all_reports()

    def delivered(self, reports: list[LogAggregationReport]) -> None:
        self.planner.delivered(reports)

    async def _run(self) -> None:
        while True:
            try:
                async with asyncio.timeout(TICK_S):
                    await self._wake.wait()
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            if self._stopping:
                return
            try:
                await self.run_once()
            except Exception:  # one bad pass must not end aggregation on this node
                log.exception("log aggregation pass failed")

    async def run_once(self) -> None:
        """One pass: every app's due upload, then the local copies past retention."""
        known = dict(self.apps())
        for app_id, user in known.items():
            self.planner.seen(app_id, user, self.clock())
        for st in list(self.planner.apps.values()):
            await self._step(st)
        for app_id in self.planner.to_free(self.clock()):
            await asyncio.to_thread(shutil.rmtree, os.path.join(self.log_dir, app_id), True)
            self.planner.freed(app_id)
            log.info("freed the local logs of %s (aggregated to %s)", app_id, self.store.url)
        self.planner.forget(set(known))

    async def _step(self, st: AppLogState) -> None:
        if not self.planner.due(st, self.clock()):
            return
        if not st.recovered:
            try:
                rolls, final = await in_daemon_thread(self._my_uploads, st.app_id)
            except Exception as e:
                # A failed try like a failed upload: backed off, and reported (docs/operating.md).
                delay = self.planner.listing_failed(st.app_id, self.clock(), str(e))
                log.warning("cannot read %s's earlier uploads of %s from %s (retrying in %.0f s): %s", self.node_id,
                            st.app_id, self.store.url, delay, e)
                return
            self.planner.recover(st.app_id, rolls, final)
        finished = st.finished_at is not None
        files = await asyncio.to_thread(local_log_files, self.log_dir, st.app_id)
        if st.finished_at is not None and not finished:
            # It ended while its dir was listed (for a roll): the final upload copies each file's
            # listed length, so list again -- its containers' last words come after that listing.
            files = await asyncio.to_thread(local_log_files, self.log_dir, st.app_id)
        up = self.planner.next_upload(st, files, self.clock())
        if up is None:
            return
        try:
            await in_daemon_thread(self._upload, up, st.user)
        except Exception as e:
            delay = self.planner.failed(up, self.clock(), str(e))
            log.warning("log aggregation of %s to %s failed (%s upload; retrying in %.0f s): %s", up.app_id,
                        self.store.url, up.kind, delay, e)
            return
        self.planner.uploaded(up, self.clock())
        if up.kind == "final" and not up.sources and st.stored_final is not None:
            log.info("%s's final file of %s on %s holds its logs already: kept as it is", self.node_id, up.app_id,
                     self.store.url)
            return
        log.info("aggregated %s's logs to %s (%s, %d chunk(s))", up.app_id, self.store.url,
                 up.kind if up.kind == "final" else f"roll {up.seq}", len(up.sources))

    def _my_uploads(self, app_id: str) -> tuple[list[AggregatedLogIndex], AggregatedLogIndex | None]:
        """This node's rolls of the app already in the store (an NM restarted mid-app), and its
        final file (the app ended, or the NM stopped, before the restart). A roll whose contents
        are refused (cut short by a crash mid-upload) is no record of anything: it is removed and
        its logs go again in the next upload, instead of failing every recovery -- the app's final
        upload never happening, its local logs kept for ever. A refused final file is taken as
        none: the next final upload replaces it."""
        rolls, final = [], None
        for name in self.store.names(app_id):
            node, seq = parse_file_name(name)
            if node != self.node_file:
                continue
            try:
                ix = self.store.index(app_id, name)
            except AggregatedLogError as e:
                if seq == 0:
                    log.warning("%s's final file of %s is unreadable (the next final upload replaces it): %s",
                                self.node_id, app_id, e)
                    continue
                log.warning("removing %s's unreadable roll %s of %s: %s", self.node_id, name, app_id, e)
                self.store.remove(app_id, name)
                continue
            if seq == 0:
                final = ix
            else:
                rolls.append(ix)
        return rolls, final

    def _upload(self, up: Upload, user: str) -> None:
        if up.kind == "final" and not up.sources:
            return          # no logs here (the rolls, if any, stay the record)
        name = self.node_file if up.kind == "final" else roll_file_name(self.node_id, up.seq)
        writer = LogFileWriter(up.app_id, self.node_id, up.kind, up.seq, int(self.clock() * 1000),
                               up.sources, user=user)
        self.store.write(up.app_id, name, writer.pieces())
        if up.kind == "final":
            # The final file holds every byte the rolls did: they go (a reader prefers it anyway).
            for n in self.store.names(up.app_id):
                node, seq = parse_file_name(n)
                if node == self.node_file and seq > 0:
                    self.store.remove(up.app_id, n)
