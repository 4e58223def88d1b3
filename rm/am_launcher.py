"""Launches AM containers on NMs (the RM's ApplicationMasterLauncher)."""
from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Callable, Sequence

from protocol import container_env, durable_storage, tokens
from protocol import internal_api as api
from protocol.nm_client import NMClient

from .core import LaunchAm, ResourceManagerCore
from .state_machines import attempt_is_final

log = logging.getLogger(__name__)


class AmLauncher:
    """Turns the core's LaunchAm effects into NM start_container calls, reporting back to the core."""

    def __init__(self, core: ResourceManagerCore, rm_url: str, state_dir: str, on_change: Callable[[], None],
                 nm_client: NMClient | None = None, failover_urls: Sequence[str] = ()):
        self.core = core
        self.rm_url = rm_url
        # With HA, every RM's URL, this one first: the AM fails over between them.
        self.failover_urls = [rm_url] + [u for u in failover_urls if u != rm_url] if failover_urls else []
        # Each AM's durable dir is <checkpoint_dir>/<app_id> (rm.toml): storage every host reads,
        # so that a new attempt on another host finds the last one's checkpoints. Unset, it is
        # <state_dir>/apps/<app_id>, created here as before (the RM's host is the AM's on one host).
        # A local one goes to the AM as an absolute path (the AM runs in its own working dir).
        configured = core.cfg.checkpoint_dir
        local = durable_storage.local_path(configured) if configured else str(Path(state_dir) / "apps")
        self.apps_dir = configured if local is None else os.path.abspath(local)
        self._create_dirs = not configured
        self.on_change = on_change
        self.nm = nm_client or NMClient(timeout_s=30.0)
        self._tasks: set[asyncio.Task[None]] = set()

    def launch_context(self, eff: LaunchAm) -> api.LaunchContext:
        """The AM's launch context: the submitted spec plus the env every Elastane AM gets, the
        attempt's job secret included (in the environment only: the NM writes no environment to
        disk and logs none of it)."""
        app = self.core.apps[eff.app_id]
        am_dir = durable_storage.join(self.apps_dir, eff.app_id)
        if self._create_dirs:       # a configured location is the AM's to create: this host may not mount it
            Path(am_dir).mkdir(parents=True, exist_ok=True)
        env = dict(app.am.environment)
        env.update({
            container_env.RM_ADDRESS: self.rm_url,
            container_env.AM_TOKEN: eff.am_token,
            container_env.APP_ATTEMPT_ID: eff.attempt_id,
            container_env.APP_SUBMITTER: app.user,
            container_env.AM_DIR: am_dir,
            # An app that keeps containers across attempts has one secret for all of them: the
            # executors a new attempt takes over hold the first attempt's in their environment.
            container_env.JOB_SECRET: tokens.job_secret(
                self.core.cluster.secret, app.attempts[0] if app.keep_containers and app.attempts else eff.attempt_id),
            container_env.CONTAINER_ROLE: "am",
        })
        if self.failover_urls:
            env[container_env.RM_ADDRESSES] = ",".join(self.failover_urls)
        # Typed since submission, which checked them (and so does the store's decoding on recovery).
        return api.LaunchContext(commands=list(app.am.commands), environment=env,
                                 local_resources=dict(app.am.local_resources))

    def launch(self, eff: LaunchAm) -> None:
        task = asyncio.get_running_loop().create_task(self._launch(eff))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _ended(self, eff: LaunchAm) -> bool:
        """The attempt ended (killed, timed out, expired) since its launch was asked for."""
        at = self.core.attempts.get(eff.attempt_id)
        return at is None or attempt_is_final(at.state)

    async def _launch(self, eff: LaunchAm) -> None:
        c = eff.container
        if self._ended(eff):
            return      # before the task ran: its AM container is released already
        try:
            ctx = self.launch_context(eff)
            status = await self.nm.start_container(c.node_http_address, c.token, ctx)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # any failure to launch fails the attempt, with the reason
            log.warning("launching AM of %s on %s failed: %s", eff.attempt_id, c.node_id, e)
            self.core.am_launch_failed(eff.attempt_id, f"{type(e).__name__}: {e}")
        else:
            if status.state == "COMPLETE":
                self.core.am_launch_failed(eff.attempt_id, f"AM container {c.container_id} exited at once with "
                                                           f"{status.exit_status}: {status.diagnostics}")
            elif self._ended(eff):
                # Ended while the start was on its way: the cleanup the kill sent the node may have
                # found nothing to stop, and the RM has let the container's resources go (an AM
                # running on them would make the node refuse the next container placed there).
                await self._stop_orphan(eff)
            else:
                self.core.am_launched(eff.attempt_id)
        self.on_change()

    async def _stop_orphan(self, eff: LaunchAm) -> None:
        c = eff.container
        try:
            await self.nm.stop_container(c.node_http_address, c.container_id, c.token)
            log.info("stopped AM container %s: its attempt %s ended while it started", c.container_id, eff.attempt_id)
        except Exception as e:  # noqa: BLE001 - the node's next heartbeat reports it and the RM cleans it up
            log.warning("could not stop AM container %s of the ended attempt %s: %s", c.container_id,
                        eff.attempt_id, e)

    async def drain(self) -> None:
        """Wait until every launch started so far has finished (used by tests and shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def remove_app_dir(self, app_id: str) -> None:
        """Delete the AM dir of an app the RM forgot (past max_completed_apps): its checkpoints,
        status and controller log, which nothing reads once the app is gone from the RM. Off the
        event loop; a failure is logged and the dir left (YARN removes an app's staging dir too)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._remove_app_dir(app_id)
            return
        t = loop.create_task(asyncio.to_thread(self._remove_app_dir, app_id))
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    def _remove_app_dir(self, app_id: str) -> None:
        try:
            durable_storage.DurableDir(self.apps_dir).remove_child(app_id)
        except (OSError, durable_storage.DurableStorageError) as e:
            log.warning("could not remove the AM dir of the forgotten app %s under %s: %s", app_id, self.apps_dir, e)

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.nm.close()
