"""An RM process for bench/rm_heartbeats.py --policy: the real ResourceManagerServer with its HTTP API,
a seeded elastic workload that keeps the policy deciding, and the policy rounds timed.

The process serves the RM's API on an ephemeral port (written to a file), registers `seed_nodes`
nodes of Dorm's testbed shape (12 cores, 128 GB; they never heartbeat, so the NM expiry is set past
the run) and `jobs` running PS jobs drawn from Dorm's Table II mix, their AMs faked through the
core's own AM protocol (allocate with a `started` job report). Every `churn_s` the oldest job is
killed and a new one submitted and started: the job set changes, so `dorm` solves its MILP again
(it solves only when the job, running-job or node set changes) -- each round on a problem of all
the jobs over all the nodes, the load generator's nodes included. `static` runs the same workload
and churn and decides nothing: the baseline.

Rounds run every `interval_s` (after the previous one ends): off the loop through the server's
`policy_round` (decide in its worker thread), or with `on_loop` the old way, `run_policy` on the
loop, for reference. On SIGTERM the process writes {"round_s": [...], "applied", "dropped"} to
`result_file` and exits, with each Dorm solve's time ("solve_s": the decides that built a problem).
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import web

from protocol import internal_api as api
from protocol.config import ClusterConfig, RMConfig
from protocol.job_report import JobReport
from protocol.ps_job_spec import PSJobSpec
from protocol.records import Resource
from rm.model import AmSpec
from rm.policies import ClusterSnapshot, Decision, DormPolicy
from rm.policy_runner import run_policy
from rm.server import ResourceManagerServer

NODE = Resource(128 * 1024, 12)      # Dorm's testbed slaves
AM = Resource(1024, 1)
# (vcores, memory GB, weight) per container, Dorm Table II (GPUs left out)
KINDS = [(2, 8, 1), (2, 6, 2), (4, 6, 4), (4, 32, 1), (6, 16, 1), (6, 16, 2), (4, 32, 4)]


class TimedDorm(DormPolicy):
    """Dorm, timing each decide that built and solved a problem (the bench's figure; copies share
    the list, a class attribute, so a decide on the server's policy copy counts too)."""

    solve_s: list[float] = []

    def decide(self, snapshot: ClusterSnapshot) -> Decision:
        before = self.last_problem
        t0 = time.perf_counter()
        out = super().decide(snapshot)
        if self.last_problem is not before:
            TimedDorm.solve_s.append(time.perf_counter() - t0)
        return out


@dataclass
class PolicyRmSettings:
    policy: str
    port_file: str
    result_file: str
    secret: str
    jobs: int = 90
    seed_nodes: int = 40
    churn_s: float = 1.0
    interval_s: float = 0.2
    dorm_time_limit_s: float = 2.0
    # HiGHS stops at this relative gap or the time limit; ~0 makes every solve run to the limit (a
    # solve of known length: the heartbeats' worst case), Dorm's own default is 1 %.
    dorm_mip_gap: float = 1e-9
    on_loop: bool = False


class _Workload:
    """The seeded jobs and their churn, driven through the core's public protocol."""

    def __init__(self, server: ResourceManagerServer, rng: random.Random):
        self.server = server
        self.core = server.core
        self.rng = rng
        self.live: list[str] = []

    def add_nodes(self, n: int) -> None:
        for i in range(n):
            nid = f"seed-{i:04d}.bench:8042"
            self.core.register_node({"node_id": nid}, api.NodeRegisterRequest(
                node_id=nid, http_address=nid, capability=NODE))

    def add_job(self) -> None:
        core = self.core
        vcores, mem_gb, weight = self.rng.choice(KINDS)
        n_max = self.rng.randint(4, 16)
        spec = {"app": "mlr", "workers": 1, "servers": 1, "max_workers": n_max // 2,
                "max_servers": n_max - n_max // 2, "weight": float(weight),
                "executor_memory_mb": mem_gb * 1024, "executor_vcores": vcores}
        app_id = core.new_application()
        core.submit(app_id, "bench", "ps", "default", "ELASTANE_PS", AmSpec(["true"], {}, {}, AM), 1,
                    ps_job=msgspec.convert(spec, PSJobSpec))
        core.app_saved(app_id)
        for eff in core.take_effects():
            core.am_launched(eff.attempt_id)
        app = core.apps[app_id]
        if app.current_attempt is None or core.attempts[app.current_attempt].am_container_id == "":
            return          # no room for its AM: the job waits like any other
        claims = {"app_id": app_id, "attempt_id": app.current_attempt, "user": app.user}
        core.am_register(claims, api.AmRegisterRequest(tracking_url="http://bench-am:1"))
        core.allocate(claims, api.AllocateRequest(response_id=0, shape=JobReport(
            workers=1, servers=1, started=True, early_feedback=True,
            executor_resource=Resource(mem_gb * 1024, vcores))))
        self.live.append(app_id)

    def churn(self) -> None:
        if self.live:
            self.core.kill(self.live.pop(0))
        self.add_job()
        self.server.flush()


async def serve(s: PolicyRmSettings) -> None:
    with tempfile.TemporaryDirectory(prefix="elastane-bench-policy-rm-") as tmp:
        cfg = RMConfig(host="127.0.0.1", port=0, state_dir=str(Path(tmp) / "rm"), nm_expiry_s=3600.0,
                       am_expiry_s=3600.0, policy=s.policy)
        server = ResourceManagerServer(cfg, ClusterConfig(secret=s.secret, admins=["root"]), run_timers=False)
        if s.policy == "dorm":
            server.policy = TimedDorm(cfg.dorm_fairness_threshold, cfg.dorm_adjustment_threshold,
                                       time_limit_s=s.dorm_time_limit_s, mip_rel_gap=s.dorm_mip_gap)
        work = _Workload(server, random.Random(0))
        work.add_nodes(s.seed_nodes)
        for _ in range(s.jobs):
            work.add_job()
        server.flush()
        runner = web.AppRunner(server.build_app(), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        Path(s.port_file + ".tmp").write_text(str(port))
        os.replace(s.port_file + ".tmp", s.port_file)

        round_s: list[float] = []
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)

        async def rounds() -> None:
            while True:
                await asyncio.sleep(s.interval_s)     # the policy timer, as the server's own
                t0 = time.perf_counter()
                if s.on_loop:
                    run_policy(server.core, server.policy)
                else:
                    await server.policy_round()
                round_s.append(time.perf_counter() - t0)
                server.flush()

        async def churn() -> None:
            while True:
                await asyncio.sleep(s.churn_s)
                work.churn()

        async def ticks() -> None:
            while True:
                await asyncio.sleep(0.5)
                server.core.tick()
                server.flush()

        tasks = [asyncio.create_task(f()) for f in (rounds, churn, ticks)]
        await stop.wait()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        out: dict[str, Any] = {"round_s": round_s, "solve_s": TimedDorm.solve_s, **server.policy_rounds}
        Path(s.result_file).write_text(json.dumps(out))
        await runner.cleanup()
        await server.stop()
