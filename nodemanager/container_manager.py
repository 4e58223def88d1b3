"""Runs the node's containers: admission, launch, exit handling, stop, cleanup and recovery.

The lifecycle decisions go through the pure state machine (container_state); this module does
the I/O around it: processes, cgroups, dirs and the recovery records.
"""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Optional

from protocol import container_env, ids
from protocol.config import NMConfig
from protocol.internal_api import LaunchContext, WarmStart
from protocol.local_resources import LocalResourceError
from protocol.records import ExitStatus, Resource
from protocol.remote_exception import ApiError, BadRequest, Conflict

from . import launcher, procfs
from .cgroup_base import remove_dirs
from .container import Container
from .container_shell_pool import ContainerShell, ContainerShellPool, ShellLaunchError
from .container_state import ContainerEvent as Ev, NMContainerState as St, holds_resources, is_finished
from .enforcement import Enforcement
from .prejoined_pool import PrejoinedProcess
from .localizer import Localizer, link_into, validate as validate_resources
from .recovery_store import RecoveryStore
from .rss_monitor import Watched, cgroup_oom_diagnostics, find_overruns
from .warm_launcher import WarmLauncher, WarmLaunchError, WarmProcess, warm_request
from .warm_spares import WarmSparePool

log = logging.getLogger(__name__)

KILL_GRACE_S = 1.0          # SIGTERM -> SIGKILL
ADOPTED_POLL_S = 0.2        # how often a re-adopted (not our child) container is checked
CGROUP_REMOVE_TIMEOUT_S = 5.0
FINISHED_APPS_KEPT = 10_000  # the apps over on this node whose late container starts are refused


class InsufficientResources(ApiError):
    """The node has not enough free capacity for the container."""

    status = 409
    exception = "InsufficientResourcesException"
    java_class = "org.apache.hadoop.yarn.exceptions.YarnException"


class ContainerManager:
    """Owns every container of this node."""

    def __init__(self, cfg: NMConfig, node_id: str, nm_host: str, nm_port: int, capability: Resource,
                 enforcement: Enforcement, store: RecoveryStore, clock: Callable[[], float] = time.time,
                 arbiter_socket: str = ""):
        self.cfg = cfg
        self.arbiter_socket = arbiter_socket   # the Harmony arbiter's, told to Harmony jobs' containers
        self.node_id = node_id
        self.nm_host = nm_host
        self.nm_port = nm_port
        self.capability = capability
        self.enforcement = enforcement
        self.store = store
        self.clock = clock
        self.containers: dict[str, Container] = {}
        self._tasks: set[asyncio.Task] = set()
        self._loops: list[asyncio.Task] = []
        self._closing = False
        # The apps the RM said are over here (newest last, at most FINISHED_APPS_KEPT): no container
        # of theirs starts any more (YARN's NM kills a container that arrives for a finishing app).
        self.finished_apps: OrderedDict[str, None] = OrderedDict()
        # The localize waits in flight, by container: a stop cancels its container's.
        self._localizing: dict[str, asyncio.Task[dict[str, str]]] = {}
        self.warm: Optional[WarmLauncher] = None      # the executor zygote (set by the NM when it runs one)
        self.shells: Optional[ContainerShellPool] = None  # pre-started shells (set by the NM with cgroups)
        self.warm_spares: Optional[WarmSparePool] = None  # the zygote's spares (set by the NM with cgroups)
        self.localizer = Localizer(cfg)
        # Log aggregation's hooks (set by the NM when it aggregates): told when an app is over here,
        # and asked before a finished container's logs are deleted (not before they are uploaded).
        self.on_app_finished: Callable[[str], None] = lambda app_id: None
        self.logs_held: Callable[[str], bool] = lambda app_id: False
        # Told when a container's process has ended (its exit status decided): the RM link sends
        # the completion at once instead of at the next heartbeat, as YARN's NM does.
        self.on_container_exited: Callable[[], None] = lambda: None

    # ----- capacity -----------------------------------------------------------------------------

    def used(self) -> Resource:
        total = Resource(0, 0)
        for c in self.containers.values():
            if holds_resources(c.state):
                total = total + c.resource
        return total

    def free(self) -> Resource:
        return self.capability - self.used()

    def spawn_task(self, coro: Any) -> asyncio.Task:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    # ----- start --------------------------------------------------------------------------------

    async def start(self, claims: dict[str, Any], resource: Resource, ctx: LaunchContext) -> Container:
        """Admit and launch a container whose token claims were already verified."""
        if self._closing:
            raise Conflict("the NodeManager is shutting down")
        cid = str(claims.get("container_id", ""))
        try:
            cparsed = ids.ContainerId.parse(cid)
        except ValueError as e:
            raise BadRequest(f"container token: {e}") from None
        app_id = str(claims.get("app_id") or cparsed.app)
        if not ctx.commands:
            raise BadRequest("launch_context.commands: at least one command is required")
        if resource.memory <= 0 or resource.vcores <= 0:
            raise BadRequest(f"container token: resource must be positive, got {resource.to_json()}")
        problem = container_env.environment_problem(ctx.environment)
        if problem is not None:
            raise BadRequest(f"launch_context.environment: {problem}")
        try:
            validate_resources(ctx.local_resources)
        except LocalResourceError as e:
            raise BadRequest(f"launch_context.local_resources: {e}") from None
        if cid in self.containers:
            raise Conflict(f"container {cid} was already started on this node")
        if app_id in self.finished_apps:
            # A start that was on its way when the app ended (a late AM launch, an executor its
            # AM asked for in its last moments): started now, it would outlive its app's cleanup,
            # which has already dropped the app's work dir and taken its logs.
            raise Conflict(f"application {app_id} is over on this node; container {cid} does not start")
        if not resource.fits_in(self.free()):
            raise InsufficientResources(
                f"container {cid} needs {resource.to_json()} but node {self.node_id} has "
                f"{self.free().to_json()} free of {self.capability.to_json()}")
        c = Container(
            container_id=cid, app_id=app_id, attempt_id=str(claims.get("attempt_id", "")),
            user=str(claims.get("user", "")), resource=resource, token_expiry=float(claims.get("exp", 0)),
            work_dir=os.path.join(self.cfg.local_dir, app_id, cid),
            log_dir=os.path.join(self.cfg.log_dir, app_id, cid), exit_file=self.store.exit_file(cid),
            role=ctx.environment.get(container_env.CONTAINER_ROLE, ""))
        self.containers[cid] = c  # reserves the capacity before the first await
        if ctx.local_resources:
            # Fetching may take long (a big archive, a remote store): the caller hears NEW now, as
            # YARN's startContainers answers before localization, and the launch goes on behind.
            self.spawn_task(self._launch_or_fail(c, ctx))
        else:
            await self._launch_or_fail(c, ctx)
        return c

    async def _launch_or_fail(self, c: Container, ctx: LaunchContext) -> None:
        try:
            await self._launch(c, ctx)
        except Exception as e:  # a failed launch is the container's outcome, not the NM's crash
            if c.pgid:  # the process started; let it go with the cleanup below
                launcher.signal_group(c.pgid, signal.SIGKILL)
            if c.kill_status is not None:
                # Stopped while it was launched: the stop's status is the outcome, as for a stop
                # that finds the launch through.
                log.info("launch of %s failed after it was stopped: %s", c.container_id, e)
                c.apply(Ev.KILL)
                c.exit_status, c.diagnostics = c.kill_status, c.kill_diagnostics
            else:
                log.warning("launch of %s failed: %s", c.container_id, e)
                c.apply(Ev.LAUNCH_FAILED)
                c.exit_status = ExitStatus.INVALID
                c.diagnostics = f"container launch failed: {type(e).__name__}: {e}"
            self.spawn_task(self._cleanup(c))

    async def _launch(self, c: Container, ctx: LaunchContext) -> None:
        # Cgroup, dirs, wrapper script and spawn in one worker-thread hop: each hop is a
        # thread handoff and an event-loop wakeup, which under load cost more than the work.
        warm = self.warm
        proc: launcher.ContainerProcess | WarmProcess
        c.launch_phase("")
        if ctx.local_resources:
            # Fetched in the localizer's threads (a cache hit fetches nothing), then linked into the
            # working dir before any launch path -- cold, shell or zygote -- runs the command there.
            links = await self._localize(c, ctx)
            if links is not None:
                await asyncio.to_thread(link_into, c.work_dir, links)
                c.launch_phase("localize")
            if c.kill_status is not None:   # stopped while its resources were fetched: never start it
                c.exit_status, c.diagnostics = c.kill_status, c.kill_diagnostics
                c.apply(Ev.KILL)
                await self._cleanup(c)
                return
        if ctx.warm_start is not None and warm is not None and warm.serves(ctx.warm_start.module):
            c.launch_path = "zygote"
            in_spare = await self._launch_in_spare(c, ctx, warm, ctx.warm_start)
            if in_spare is not None:
                proc = in_spare
            else:
                spec = await asyncio.to_thread(self._prepare, c, ctx)
                try:
                    proc = await warm.launch(warm_request(spec, ctx, ctx.warm_start))
                except WarmLaunchError as e:
                    log.warning("%s: %s; launching it cold", c.container_id, e)
                    c.launch_path = "cold"
                    proc = await asyncio.to_thread(launcher.spawn, spec, ctx)
            c.launch_phase("spawn")
            st = await asyncio.to_thread(procfs.read_stat, proc.pid)
        else:
            proc, st = await self._launch_in_shell_or_cold(c, ctx)
        c.launch_phase("return")
        c.process, c.pid, c.pgid = proc, proc.pid, proc.pid
        c.start_time = st.start_time if st else None
        c.apply(Ev.LOCALIZED)
        c.launched_at = self.clock()
        c.apply(Ev.LAUNCHED)
        # From here on the watcher owns the container: nothing below may fail the launch.
        self.spawn_task(self._watch_child(c))
        try:
            self.store.save(c.to_record())
        except OSError as e:
            log.error("cannot write the recovery record of %s (it will not survive an NM restart): %s",
                      c.container_id, e)
        if c.kill_status is not None:  # a stop arrived while the launch was in flight
            c.apply(Ev.KILL)
            self.spawn_task(self._kill(c))
        log.info("launched %s pid %d (%s) %s in %s ms", c.container_id, proc.pid, c.resource.to_json(), c.launch_path,
                 c.launch_ms)

    async def _localize(self, c: Container, ctx: LaunchContext) -> Optional[dict[str, str]]:
        """The container's resources ({link name: path}); None when a stop came first or ended
        the wait (the fetch goes on for the other containers waiting for it)."""
        if c.kill_status is not None:
            return None
        fetching = asyncio.get_running_loop().create_task(
            self.localizer.localize(c.container_id, c.app_id, c.user, ctx.local_resources))
        self._localizing[c.container_id] = fetching
        try:
            await asyncio.wait([fetching])
        finally:
            self._localizing.pop(c.container_id, None)
            fetching.cancel()       # (done already, unless this launch itself was cancelled)
        return None if fetching.cancelled() else fetching.result()

    async def _launch_in_shell_or_cold(self, c: Container, ctx: LaunchContext
                                       ) -> tuple[launcher.ContainerProcess, Optional[procfs.ProcStat]]:
        pool = self.shells
        shell = pool.take() if pool is not None else None
        if pool is not None and shell is not None:
            try:
                c.launch_path = "shell"
                return await asyncio.to_thread(self._run_in_shell, c, ctx, shell)
            except (ShellLaunchError, OSError) as e:
                log.warning("%s: %s; launching it cold", c.container_id, e)
                await asyncio.to_thread(pool.discard, shell)
                c.cgroup = None
        c.launch_path = "cold"
        return await asyncio.to_thread(self._prepare_and_spawn, c, ctx)

    async def _launch_in_spare(self, c: Container, ctx: LaunchContext, warm: WarmLauncher,
                               start: WarmStart) -> Optional[WarmProcess]:
        """A warm launch in one of the zygote's spares (nodemanager.warm_spares), already in its
        cgroup; None when the pool has none or it could not take the container (fork afresh)."""
        pool = self.warm_spares
        spare = pool.take() if pool is not None else None
        if pool is None or spare is None:
            return None
        try:
            spec = await asyncio.to_thread(self._adopt_cgroup, c, ctx, spare)
            req = warm_request(spec, ctx, start)
            req.spare_pid = spare.pid
            proc = await warm.launch(req)
        except (WarmLaunchError, OSError) as e:      # CgroupError is an OSError
            log.warning("%s: the spare %d could not take it (%s); forking afresh", c.container_id, spare.pid, e)
            await pool.discard(spare)
            c.cgroup = None
            return None
        c.launch_path = "zygote-spare"
        return proc

    def _adopt_cgroup(self, c: Container, ctx: LaunchContext, proc: PrejoinedProcess) -> launcher.LaunchSpec:
        """A pre-joined process's cgroup (a shell's, a spare's) made the container's: its limits and
        name; then the container's dirs (blocking: a worker thread)."""
        c.launch_phase("handoff")
        backend = self.enforcement.backend
        assert backend is not None
        backend.configure(proc.cgroup, c.resource.memory, c.resource.vcores, ctx.cpu_weighted)
        # The process's too: a failure from here on removes the cgroup by its new name.
        c.cgroup = proc.cgroup = backend.rename(proc.cgroup, c.container_id)
        c.launch_phase("cgroup")
        spec = self._spec(c)
        launcher.prepare_dirs(spec)
        c.launch_phase("dirs")
        return spec

    def _run_in_shell(self, c: Container, ctx: LaunchContext, shell: ContainerShell
                      ) -> tuple[launcher.ContainerProcess, Optional[procfs.ProcStat]]:
        """The blocking part of a launch in a pre-started shell (in a worker thread): the shell's
        cgroup gets the container's limits and name, then the shell runs the launch script."""
        spec = self._adopt_cgroup(c, ctx, shell)
        proc = shell.run(spec, ctx)
        c.launch_phase("spawn")
        st = procfs.read_stat(proc.pid)
        c.launch_phase("stat")
        return proc, st

    def _prepare_and_spawn(self, c: Container, ctx: LaunchContext
                           ) -> tuple[launcher.ContainerProcess, Optional[procfs.ProcStat]]:
        """The blocking part of a cold launch (in a worker thread): `_prepare`, then the wrapper and
        the process."""
        c.launch_phase("handoff")
        spec = self._prepare(c, ctx)
        proc = launcher.spawn(spec, ctx)
        c.launch_phase("spawn")
        st = procfs.read_stat(proc.pid)
        c.launch_phase("stat")
        return proc, st

    def _prepare(self, c: Container, ctx: LaunchContext) -> launcher.LaunchSpec:
        """The container's cgroup (kept on `c` at once, so a failure later is cleaned up) and dirs."""
        backend = self.enforcement.backend
        if backend is not None:
            c.cgroup = backend.create(c.container_id, c.resource.memory, c.resource.vcores, ctx.cpu_weighted)
        c.launch_phase("cgroup")
        spec = self._spec(c)
        launcher.prepare_dirs(spec)
        c.launch_phase("dirs")
        return spec

    def _spec(self, c: Container) -> launcher.LaunchSpec:
        backend = self.enforcement.backend
        return launcher.LaunchSpec(
            container_id=c.container_id, app_id=c.app_id, attempt_id=c.attempt_id, user=c.user,
            memory_mb=c.resource.memory, vcores=c.resource.vcores, work_dir=c.work_dir, log_dir=c.log_dir,
            exit_file=c.exit_file, nm_host=self.nm_host, nm_port=self.nm_port,
            network_bandwidth_bps=self.cfg.network_bandwidth_bps, arbiter_socket=self.arbiter_socket,
            cgroup_join_files=tuple(backend.join_files(c.cgroup)) if backend and c.cgroup else ())

    # ----- exit ---------------------------------------------------------------------------------

    async def _watch_child(self, c: Container) -> None:
        assert c.process is not None
        rc = await c.process.wait()
        if rc is None:      # a warm container whose zygote died first, with no exit file
            await self._on_exit(c, None, died_of_sigkill=False,
                                unknown="the executor zygote died before the container process, which exited")
            return
        await self._on_exit(c, launcher.exit_code_from_returncode(rc), died_of_sigkill=rc == -signal.SIGKILL)

    async def _watch_adopted(self, c: Container) -> None:
        assert c.pid is not None and c.start_time is not None
        while procfs.is_same_process(c.pid, c.start_time):  # noqa: ASYNC110 (not our child: nothing to await)
            await asyncio.sleep(ADOPTED_POLL_S)
        code = self.store.read_exit_code(c.container_id)
        await self._on_exit(c, code, died_of_sigkill=code == 128 + signal.SIGKILL)

    async def _on_exit(self, c: Container, code: Optional[int], died_of_sigkill: bool,
                       unknown: str = "container process exited while the NodeManager was down") -> None:
        """Decide the exit status (kill reason, OOM, or the process's code; ABORTED when the code
        is None, `unknown` saying why), then clean up."""
        backend = self.enforcement.backend
        if c.kill_status is not None:
            status, diag = c.kill_status, c.kill_diagnostics
        elif backend is not None and c.cgroup is not None and backend.oom_killed(c.cgroup, died_of_sigkill):
            status = ExitStatus.KILLED_EXCEEDED_PMEM
            diag = cgroup_oom_diagnostics(c.container_id, c.pid or 0, c.resource.memory,
                                          backend.peak_memory_bytes(c.cgroup))
        elif code is None:
            status = ExitStatus.ABORTED
            diag = f"{unknown} and left no exit code"
        else:
            status = code
            diag = "" if code == 0 else f"Exception from container-launch: exit code {code}"
        c.exit_status, c.diagnostics = status, diag
        c.finished_at = self.clock()
        c.apply(Ev.EXITED_SUCCESS if status == 0 else Ev.EXITED_FAILURE)
        c.exited.set()
        self.on_container_exited()
        log.info("container %s finished: %s %s", c.container_id, ExitStatus.describe(status), diag)
        await self._cleanup(c)

    async def _cleanup(self, c: Container) -> None:
        """Kill leftovers, remove the cgroup and working dir, keep the record until reported."""
        if c.finished_at is None:
            c.finished_at = self.clock()
            c.exited.set()
        if c.pgid:
            launcher.signal_group(c.pgid, signal.SIGKILL)
        if c.cgroup is not None:
            await self._remove_cgroup(c)
        if self.cfg.delete_workdir:
            await asyncio.to_thread(shutil.rmtree, c.work_dir, True)
        self.localizer.release(c.container_id)
        c.apply(Ev.CLEANED_UP)
        if not c.reported:
            self.store.save(c.to_record())
        else:
            self.store.remove(c.container_id)

    async def _remove_cgroup(self, c: Container) -> None:
        assert c.cgroup is not None
        backend = self.enforcement.backend
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CGROUP_REMOVE_TIMEOUT_S
        while True:
            if backend is not None:
                backend.kill_all(c.cgroup)
            if remove_dirs(c.cgroup.dirs):   # what backend.try_remove does, backend or not
                return
            if loop.time() > deadline:
                log.warning("could not remove cgroup %s (processes remain)", c.cgroup.dirs)
                return
            await asyncio.sleep(0.02)

    # ----- stop ---------------------------------------------------------------------------------

    async def stop(self, cid: str, exit_status: int, diagnostics: str, wait: bool = True) -> Optional[Container]:
        """Stop a container with `exit_status` unless it already finished; None if unknown."""
        c = self.containers.get(cid)
        if c is None:
            return None
        if is_finished(c.state) or c.kill_status is not None:
            if wait and c.kill_status is not None:
                await _wait_event(c.exited, KILL_GRACE_S + 3)
            return c
        c.kill_status, c.kill_diagnostics = exit_status, diagnostics
        if c.state is St.RUNNING:
            c.apply(Ev.KILL)
            self.spawn_task(self._kill(c))
        elif (fetching := self._localizing.get(cid)) is not None:
            # Still waiting for its resources: that wait ends now (_launch then ends the container
            # with this status and releases its resources; the fetch goes on for other waiters).
            fetching.cancel()
        # NEW / LOCALIZED: _launch is in flight and acts on kill_status once the process exists.
        if wait:
            await _wait_event(c.exited, KILL_GRACE_S + 3)
        return c

    async def _kill(self, c: Container) -> None:
        """SIGTERM the process group, SIGKILL it (and the cgroup) after a short grace."""
        if c.pgid:
            launcher.signal_group(c.pgid, signal.SIGTERM)
        if await _wait_event(c.exited, KILL_GRACE_S):
            return
        if c.pgid:
            launcher.signal_group(c.pgid, signal.SIGKILL)
        if self.enforcement.backend is not None and c.cgroup is not None:
            self.enforcement.backend.kill_all(c.cgroup)

    async def stop_app(self, app_id: str) -> None:
        """The RM says the app is over: kill what is left of it and drop its local dir. From now
        on no container of the app starts here (one that did while this waits would lose its work
        dir under it and its logs to an aggregation already taken)."""
        self.finished_apps[app_id] = None
        self.finished_apps.move_to_end(app_id)
        while len(self.finished_apps) > FINISHED_APPS_KEPT:
            self.finished_apps.popitem(last=False)
        cids = [c.container_id for c in self.containers.values() if c.app_id == app_id]
        await asyncio.gather(*(self.stop(cid, ExitStatus.KILLED_AFTER_APP_COMPLETION,
                                         "Container killed after the application completed") for cid in cids))
        self.localizer.app_finished(app_id)
        if self.cfg.delete_workdir:
            await asyncio.to_thread(shutil.rmtree, os.path.join(self.cfg.local_dir, app_id), True)
        self.on_app_finished(app_id)

    # ----- reporting ----------------------------------------------------------------------------

    def statuses(self, with_role: bool = False) -> list:
        """Statuses the RM must hear: all live containers and completed ones it has not seen (with
        their roles for a registration: after an RM restart or failover the RM re-adopts them)."""
        return [c.status(with_role) for c in self.containers.values() if not c.reported]

    def mark_reported(self, cids: list[str]) -> None:
        """The RM has seen these completions: their recovery records go."""
        for cid in cids:
            c = self.containers.get(cid)
            if c is not None and c.state is St.DONE:
                c.reported = True
                self.store.remove(cid)

    # ----- background loops ---------------------------------------------------------------------

    def start_loops(self) -> None:
        if self.enforcement.backend is None:
            self._loops.append(asyncio.get_running_loop().create_task(self._rss_monitor_loop()))
        self._loops.append(asyncio.get_running_loop().create_task(self._janitor_loop()))

    async def _rss_monitor_loop(self) -> None:
        interval = max(0.05, self.cfg.monitor_interval_ms / 1000)
        while True:
            await asyncio.sleep(interval)
            watched = [Watched(c.container_id, c.pid, c.resource.memory) for c in self.containers.values()
                       if c.state is St.RUNNING and c.pid]
            if not watched:
                continue
            try:
                stats = await asyncio.to_thread(procfs.all_stats)
                for o in find_overruns(watched, stats):
                    log.warning("%s", o.diagnostics())
                    await self.stop(o.container_id, ExitStatus.KILLED_EXCEEDED_PMEM, o.diagnostics(), wait=False)
            except Exception:  # the monitor must outlive one bad sample
                log.exception("RSS monitor pass failed")

    async def _janitor_loop(self) -> None:
        keep = self.cfg.keep_finished_logs_s
        interval = max(0.5, min(30.0, keep / 2))
        while True:
            await asyncio.sleep(interval)
            try:
                self.expire_finished(self.clock())
            except Exception:
                log.exception("expiring finished containers failed")

    def expire_finished(self, now: float) -> list[str]:
        """Forget reported containers finished more than keep_finished_logs_s ago (and whose logs
        aggregation no longer holds); drop their logs."""
        gone = [c for c in self.containers.values() if c.reported and c.finished_at is not None
                and now - c.finished_at > self.cfg.keep_finished_logs_s and not self.logs_held(c.app_id)]
        for c in gone:
            shutil.rmtree(c.log_dir, ignore_errors=True)
            _rmdir_quiet(os.path.dirname(c.log_dir))
            del self.containers[c.container_id]
        return [c.container_id for c in gone]

    # ----- recovery -----------------------------------------------------------------------------

    async def recover(self) -> list[Container]:
        """Find the containers of a previous run again: adopt the live ones, settle the dead ones."""
        found = []
        restored = await asyncio.to_thread(self.localizer.restore)
        if restored:
            log.info("localizer: %d cached resource(s) found on disk", restored)
        for rec in self.store.load_all():
            try:
                c = Container.from_record(rec)
            except (KeyError, TypeError, ValueError) as e:
                log.warning("ignoring bad recovery record %s: %s", rec.get("container_id"), e)
                continue
            self.containers[c.container_id] = c
            c.apply(Ev.RECOVERED)
            final = rec.get("final")
            if final:
                c.exit_status, c.diagnostics = int(final["exit_status"]), str(final.get("diagnostics", ""))
                c.finished_at = float(final.get("finished_at") or self.clock())
                c.apply(Ev.EXITED_SUCCESS if c.exit_status == 0 else Ev.EXITED_FAILURE)
                c.apply(Ev.CLEANED_UP)
                c.exited.set()
            elif c.pid and c.start_time is not None and procfs.is_same_process(c.pid, c.start_time):
                log.info("re-adopted running container %s (pid %d)", c.container_id, c.pid)
                self.localizer.pin_links(c.container_id, c.work_dir)
                self.spawn_task(self._watch_adopted(c))
            else:
                # Its recorded process is gone (or the pid now names another process), and so may
                # be its group: a reused number would lead someone else's. Only stragglers that
                # carry its CONTAINER_ID are its own; the cgroup, if it had one, catches the rest.
                self._kill_stragglers(c)
                c.pgid = None
                code = self.store.read_exit_code(c.container_id)
                await self._on_exit(c, code, died_of_sigkill=code == 128 + signal.SIGKILL)
            found.append(c)
        return found

    @staticmethod
    def _kill_stragglers(c: Container) -> None:
        """SIGKILL the processes of `c`'s recorded group that carry its CONTAINER_ID."""
        if not c.pgid:
            return
        for st in procfs.all_stats():
            if st.pgid == c.pgid and procfs.environ(st.pid).get(container_env.CONTAINER_ID) == c.container_id:
                try:
                    os.kill(st.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    # ----- shutdown -----------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """Kill every container (SIGTERM, then SIGKILL after a grace), remove cgroups."""
        self._closing = True
        for t in self._loops:
            t.cancel()
        if self.shells is not None:     # idle shells first: their cgroups go whatever else stalls
            await self.shells.close()
        if self.warm_spares is not None:    # the same for idle spares (the zygote closes later)
            await self.warm_spares.close()
        live = [c.container_id for c in self.containers.values() if not is_finished(c.state)]
        await asyncio.gather(*(self.stop(cid, ExitStatus.KILLED_BY_RESOURCEMANAGER,
                                         "Container killed on NodeManager shutdown") for cid in live))
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=CGROUP_REMOVE_TIMEOUT_S + 2)
        for t in self._loops:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        if self.enforcement.backend is not None:
            await asyncio.to_thread(self.enforcement.backend.teardown)
        self.localizer.close()
        self.store.close()      # the journal's file (the records stay on disk for a restart)


async def _wait_event(ev: asyncio.Event, timeout: float) -> bool:
    try:
        async with asyncio.timeout(timeout):
            await ev.wait()
        return True
    except asyncio.TimeoutError:
        return False


def _rmdir_quiet(d: str) -> None:
    try:
        Path(d).rmdir()
    except OSError:
        pass
