"""Log aggregation's I/O: lists this node's container logs, uploads what the planner
(`log_aggregation.LogAggregationPlanner`) says to `remote_app_log_dir`, frees the local copies.

Local layout (the container manager's): <log_dir>/<app_id>/<container_id>/<file>. Uploads and
listings run in a worker thread, one app at a time, so a slow store never holds the event loop.
"""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import stat
import time
from typing import Callable, Mapping

from protocol.aggregated_logs import (AggregatedLogError, AggregatedLogIndex, LogFileWriter, RemoteLogDir, node_file_name,
                                      parse_file_name, roll_file_name)
from protocol.ids import is_application_id
from protocol.internal_api import LogAggregationReport

from .log_aggregation import AppLogState, LocalLogFile, LogAggregationPlanner, Upload

log = logging.getLogger(__name__)

TICK_S = 1.0        # how often the planner is asked (rolls, retries, retention) between wake-ups


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

    def start(self) -> None:
        """Take up the apps whose logs a previous run of this NM left (their containers' records
        may be gone: reported before it stopped), then run. The RM hears of them at registration
        (`held_apps`) and says which are over."""
        now = self.clock()
        for app_id in app_log_dirs(self.log_dir):
            self.planner.seen(app_id, "", now)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

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
                rolls = await asyncio.to_thread(self._my_rolls, st.app_id)
            except Exception as e:
                log.warning("cannot read %s's earlier uploads of %s from %s: %s", self.node_id, st.app_id,
                            self.store.url, e)
                return
            self.planner.recover(st.app_id, rolls)
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
            await asyncio.to_thread(self._upload, up, st.user)
        except Exception as e:
            delay = self.planner.failed(up, self.clock(), str(e))
            log.warning("log aggregation of %s to %s failed (%s upload; retrying in %.0f s): %s", up.app_id,
                        self.store.url, up.kind, delay, e)
            return
        self.planner.uploaded(up, self.clock())
        log.info("aggregated %s's logs to %s (%s, %d chunk(s))", up.app_id, self.store.url,
                 up.kind if up.kind == "final" else f"roll {up.seq}", len(up.sources))

    def _my_rolls(self, app_id: str) -> list[AggregatedLogIndex]:
        """This node's rolls of the app already in the store (an NM restarted mid-app). One whose
        contents are refused (cut short by a crash mid-upload) is no record of anything: it is
        removed and its logs go again in the next upload, instead of failing every recovery --
        the app's final upload never happening, its local logs kept for ever."""
        out = []
        for name in self.store.names(app_id):
            node, seq = parse_file_name(name)
            if node == self.node_file and seq > 0:
                try:
                    out.append(self.store.index(app_id, name))
                except AggregatedLogError as e:
                    log.warning("removing %s's unreadable roll %s of %s: %s", self.node_id, name, app_id, e)
                    self.store.remove(app_id, name)
        return out

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
