"""The NodeManager daemon: HTTP server, enforcement, container manager and the RM link, wired up."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from typing import Any, Optional

from aiohttp import web

from protocol.aggregated_logs import RemoteLogDir
from protocol.arbiter_wire import name_hash
from protocol.config import ClusterConfig, NMConfig
from protocol.durable_storage import write_atomic
from protocol.ha_config import NO_HA, HAConfig

from . import node_settings
from .arbiter_server import ArbiterServer, socket_path
from .container_manager import ContainerManager
from .log_aggregation import LogAggregationPlanner
from .log_aggregation_service import LogAggregationService
from .node_health import NodeHealthMonitor
from .enforcement import Enforcement, choose
from .recovery_store import RecoveryStore
from .container_shell_pool import ContainerShellPool
from .warm_spares import WarmSparePool
from .warm_launcher import WarmLauncher
from .rm_link import RMLink
from .utilization_monitor import UtilizationMonitor
from .utilization_sampler import UtilizationSampler
from .web_api import NodeWebApi

log = logging.getLogger(__name__)
VERSION = "elastane-0.1.0"
LINK_STOP_TIMEOUT_S = 5.0


class NodeManager:
    """One NM: `start` serves HTTP and begins registration in the background; `stop` kills containers."""

    def __init__(self, cfg: NMConfig, cluster: ClusterConfig, ready_file: Optional[str] = None,
                 mounts_file: str = "/proc/mounts", ha: HAConfig = NO_HA):
        self.cfg = cfg
        self.cluster = cluster
        self.ha = ha        # cluster.toml's [ha]: the RMs the link fails over between
        self.ready_file = ready_file
        self.mounts_file = mounts_file
        self.capability = node_settings.capability(cfg)
        self.rm_address = node_settings.rm_address(cfg, cluster)
        # The address the node id, the RM, AMs and containers (NM_HOST) use to reach this node.
        self.host = node_settings.advertise_host(cfg, self.rm_address)
        self.started_ms = int(time.time() * 1000)
        self.port = 0
        self.node_id = ""
        self.enforcement: Optional[Enforcement] = None
        self.manager: Optional[ContainerManager] = None
        self.link: Optional[RMLink] = None
        self.warm: Optional[WarmLauncher] = None      # the executor zygote (cfg.warm_modules)
        self.utilization: Optional[UtilizationMonitor] = None
        self.log_aggregation: Optional[LogAggregationService] = None   # with cluster.toml's remote_app_log_dir
        self.health: Optional[NodeHealthMonitor] = None
        # The aggregated logs every NM's log REST calls fall back on (any node's, not only this one's).
        self.remote_logs = RemoteLogDir(cluster.remote_app_log_dir) if cluster.remote_app_log_dir else None
        self._runner: Optional[web.AppRunner] = None
        self._link_task: Optional[asyncio.Task] = None
        self._sock: Optional[socket.socket] = None
        # Auxiliary service: Harmony's per-node arbiter, started and stopped with the NM.
        self.arbiter: Optional[ArbiterServer] = (
            ArbiterServer(socket_path(cfg.local_dir, cfg.arbiter_socket), cpu_pool=node_settings.arbiter_cpu_pool(cfg))
            if cfg.arbiter else None)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def bind(self) -> None:
        """Bind the HTTP socket (before the loop runs, so a busy port is a start-up error)."""
        if self._sock is None:
            self._sock = self._bind()
            self.port = self._sock.getsockname()[1]
            self.node_id = f"{self.host}:{self.port}"

    def _bind(self) -> socket.socket:
        # Bind before anything else so the node id (host:port) is known with --port 0.
        family = socket.AF_INET6 if ":" in self.cfg.host else socket.AF_INET
        s = socket.socket(family, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((self.cfg.host, self.cfg.port))
        s.listen(256)
        s.setblocking(False)
        return s

    async def start(self) -> None:
        self.bind()
        assert self._sock is not None
        for d in (self.cfg.local_dir, self.cfg.log_dir, self.cfg.recovery_dir):
            os.makedirs(d, exist_ok=True)
        self.enforcement = await asyncio.to_thread(
            choose, self.cfg.cgroups, self.node_id, self.cfg.cgroup_name, self.cfg.cpu_period_us,
            self.cfg.cpu_enforcement == "hard", self.mounts_file,
            node_settings.cores_per_vcore(self.cfg, self.capability))
        if self.enforcement.warning:
            log.warning("%s", self.enforcement.warning)
        else:
            log.info("container limits enforced with cgroups %s", self.enforcement.mode)
            if self.enforcement.favor_dynmods is False:
                # Operators decide host mounts; the NM only says what it costs (cgroup_detect).
                log.info("each move into a cgroup waits for an RCU grace period on this host (ms per "
                         "launch, and forks wait meanwhile); mounting cgroup2 with `favordynmods` "
                         "(mount -o remount,favordynmods <cgroup2 mount>) removes the wait")
        if self.arbiter is not None:
            await self.arbiter.start()
        self.manager = await self._start_containers(self.enforcement)
        self.manager.start_loops()
        if self.remote_logs is not None:
            self._start_log_aggregation(self.manager, self.remote_logs)
        self.utilization = UtilizationMonitor(self.manager, UtilizationSampler(self.enforcement.backend),
                                              self.cfg.heartbeat_interval_ms / 1000)
        self.utilization.start()
        api = NodeWebApi(self.manager, self.cluster.secret, self.node_id, lambda: self.url, self.node_info,
                         self._arbiter_view if self.arbiter else None,
                         utilization=lambda: self.utilization.latest if self.utilization else None,
                         remote_logs=self.remote_logs, cluster=self.cluster)
        self._runner = web.AppRunner(api.app(), access_log=None)
        await self._runner.setup()
        await web.SockSite(self._runner, self._sock).start()
        log.info("NodeManager %s serving on %s (capability %s)", self.node_id, self.url, self.capability.to_json())
        cfg = self.cfg
        self.health = NodeHealthMonitor([cfg.local_dir, cfg.log_dir, cfg.recovery_dir], cfg.max_disk_utilization_percent,
                                        cfg.min_free_disk_mb, cfg.health_script, cfg.health_script_timeout_s,
                                        cfg.health_check_interval_s)
        await self.health.check()       # the first heartbeat says how the node is
        self.health.start()
        health = self.health
        self.link = RMLink(self.rm_address, self.cluster.secret, self.node_id, f"{self.host}:{self.port}",
                           self.capability, self.cfg.rack, self.manager, self.cfg.heartbeat_interval_ms,
                           self.cluster.token_lifetime_s, on_registered=self._write_ready_file, version=VERSION,
                           utilization=lambda: self.utilization.for_heartbeat() if self.utilization else None,
                           node_labels=self.cfg.node_labels, log_aggregation=self.log_aggregation, ha=self.ha,
                           health=lambda: health.current)
        self._link_task = asyncio.get_running_loop().create_task(self._run_link())

    async def _start_containers(self, enforcement: Enforcement) -> ContainerManager:
        """The container manager: the previous run's containers recovered first, then the zygote
        and the pre-joined pools. (A pool's start removes its kind's empty cgroups, and on v2 a
        container launched in a shell or spare keeps that cgroup's name: one that ended while the
        NM was down must be read -- OOM kill, peak memory -- by recovery before it goes.)"""
        manager = ContainerManager(self.cfg, self.node_id, self.host, self.port, self.capability,
                                   enforcement, RecoveryStore(self.cfg.recovery_dir),
                                   arbiter_socket=self.arbiter.path if self.arbiter else "")
        recovered = await manager.recover()
        if recovered:
            log.info("recovered %d container(s) from %s", len(recovered), self.cfg.recovery_dir)
        if self.cfg.container_shells > 0 and enforcement.backend is not None:
            manager.shells = ContainerShellPool(enforcement.backend, self.cfg.container_shells)
            await manager.shells.start()
        if self.cfg.warm_modules:
            self.warm = WarmLauncher(self.cfg.warm_modules)
            try:
                await self.warm.start()
                manager.warm = self.warm
                if self.cfg.warm_spares > 0 and enforcement.backend is not None:
                    manager.warm_spares = WarmSparePool(enforcement.backend, self.warm, self.cfg.warm_spares)
                    await manager.warm_spares.start()
            except OSError as e:
                log.warning("no executor zygote (containers start cold): %s", e)
        return manager

    def _start_log_aggregation(self, manager: ContainerManager, store: RemoteLogDir) -> None:
        def apps() -> dict[str, str]:
            return {c.app_id: c.user for c in manager.containers.values()}
        planner = LogAggregationPlanner(self.cfg.log_roll_interval_s, self.cfg.keep_finished_logs_s)
        service = LogAggregationService(store, self.cfg.log_dir, self.node_id, planner, apps)
        manager.on_app_finished = service.app_finished
        manager.logs_held = service.holds
        service.start()
        self.log_aggregation = service
        log.info("log aggregation to %s (rolling every %s)", store.url,
                 f"{self.cfg.log_roll_interval_s:g} s" if self.cfg.log_roll_interval_s else "never: at app end only")

    async def _run_link(self) -> None:
        assert self.link is not None
        await self.link.run()
        # Only a SHUTDOWN from the RM ends the link: stop the daemon as SIGTERM would.
        log.warning("stopping on the RM's request")
        os.kill(os.getpid(), 15)

    def _arbiter_view(self, limit: int) -> dict[str, Any]:
        """The arbiter's state and grant log, its hashed job / executor ids named by this NM's containers."""
        assert self.arbiter is not None
        names: dict[int, str] = {}
        for c in (self.manager.containers.values() if self.manager else ()):
            names[name_hash(c.container_id)] = c.container_id
            names[name_hash(c.app_id)] = c.app_id
        return self.arbiter.view(limit, names)

    def _write_ready_file(self) -> None:
        if not self.ready_file:
            return
        info = {"pid": os.getpid(), "http_address": f"{self.host}:{self.port}", "node_id": self.node_id,
                "url": self.url}
        # atomic, not durable: it describes this process only
        write_atomic(self.ready_file, json.dumps(info).encode(), durable=False)

    def node_info(self) -> dict[str, Any]:
        """YARN NM `nodeInfo`, plus Elastane's enforcement mode and free resources."""
        m = self.manager
        used = m.used() if m else self.capability
        link = self.link
        return {
            "id": self.node_id,
            "nodeHostName": self.host,
            "nodeManagerVersion": VERSION,
            "nodeManagerBuildVersion": VERSION,
            "hadoopVersion": VERSION,
            "healthReport": "",
            "nodeHealthy": True,
            "lastNodeUpdateTime": int((link.last_heartbeat_ok or 0) * 1000) if link else 0,
            "nmStartupTime": self.started_ms,
            "totalPmemAllocatedContainersMB": self.capability.memory,
            "totalVCoresAllocatedContainers": self.capability.vcores,
            "usedMemoryMB": used.memory,
            "usedVirtualCores": used.vcores,
            "availableMemoryMB": self.capability.memory - used.memory,
            "availableVirtualCores": self.capability.vcores - used.vcores,
            "numContainers": sum(1 for c in m.containers.values() if c.finished_at is None) if m else 0,
            "registered": bool(link and link.registered),
            "rmAddress": self.rm_address,
            "enforcement": self.enforcement.mode if self.enforcement else "",
            "rack": self.cfg.rack,
            "nodeLabels": list(self.cfg.node_labels),
            "containerShells": m.shells.stats() if m and m.shells else {"size": 0},
            "warmSpares": m.warm_spares.stats() if m and m.warm_spares else {"size": 0},
            # Whether cgroup joins skip the kernel's grace-period wait (None: no cgroup2 mount).
            "cgroupFavorDynmods": self.enforcement.favor_dynmods if self.enforcement else None,
            # The executor zygote (None: the NM runs none): warm launches are fast once it is ready.
            "executorZygote": ({"pid": self.warm.pid, "ready": self.warm.ready, "preloadS": self.warm.preload_s}
                               if self.warm is not None else None),
        }

    async def stop(self) -> None:
        log.info("NodeManager %s stopping", self.node_id)
        # Each step's duration goes in the last line: a stop that bin/elastane-daemon had to end with
        # SIGKILL leaves its cgroups behind, and the log then says which step it was in.
        steps: list[str] = []
        t0 = last = time.monotonic()

        def step(name: str) -> None:
            nonlocal last
            now = time.monotonic()
            steps.append(f"{name} {now - last:.2f}s")
            last = now
            log.info("stopping: %s done", name)

        if self._link_task is not None:
            self._link_task.cancel()
            # Bounded: a loop that ignored its cancel would hold the stop until bin/elastane-daemon's
            # SIGKILL, leaving the containers' cgroups behind; the containers step comes first.
            done, _ = await asyncio.wait([self._link_task], timeout=LINK_STOP_TIMEOUT_S)
            if not done:
                log.error("the RM link did not stop within %.0f s of its cancel; stopping without it",
                          LINK_STOP_TIMEOUT_S)
            elif not self._link_task.cancelled() and self._link_task.exception() is not None:
                log.error("the RM link had failed: %r", self._link_task.exception())
        step("rm-link")
        if self.utilization is not None:
            await self.utilization.stop()
        if self.health is not None:
            await self.health.stop()
        step("monitors")
        if self.manager is not None:
            await self.manager.shutdown()
        step("containers")
        if self.warm is not None:       # after the containers: it exits once its children are reaped
            await self.warm.close()
        step("zygote")
        if self.link is not None:
            await self.link.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self.arbiter is not None:
            await self.arbiter.stop()
        step("servers")
        if self.log_aggregation is not None:
            # The last uploads of the apps this node ran (docs/operating.md, "Log aggregation"): after
            # the containers, so their last words are in; last, so a store slow past its bound (or
            # bin/elastane-daemon's SIGKILL) costs nothing else. A container still alive (one that
            # outlived its stop) keeps its app's logs for the next run.
            live = {c.app_id for c in self.manager.containers.values() if c.finished_at is None} if self.manager else set()
            await self.log_aggregation.stop(live_apps=live)
        step("log-aggregation")
        if self.ready_file:
            try:
                os.unlink(self.ready_file)
            except FileNotFoundError:
                pass
        log.info("NodeManager %s stopped in %.2f s (%s)", self.node_id, time.monotonic() - t0, ", ".join(steps))
