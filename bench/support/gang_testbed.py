"""Gang admission on the multi-host testbed: one loaded workload, run with it off and on.

bench/gang_admission.py --testbed drives this. A small cluster (`TestbedShape`: 3 node hosts, each
with room for three 384 MB containers) gets `jobs` tiny MLR PS jobs (2 workers + 2 servers
submitted, min 1 + 1, a few epochs) submitted at once: together they ask for far more than the
cluster has, so they queue. With `gang_admission = false` the RM starts every AM whose container
fits (up to the AM limit, rm.toml `max_am_resource_percent`), and the started jobs split the
remaining room between them, each possibly holding less than its minimum shape while it waits for
the rest; with `true` (gang shape "minimum", the default; docs/internals.md "Admission") a job's AM
starts only once it and its min_workers + min_servers executors fit ("submitted": workers + servers,
the shape the PS AM waits for before it trains, appmaster/ps/runtime/master.py `_drive`).

Each job's JCT is submission to its final state, as the client sees it (polled every `POLL_S`). A
job still running when its timeout runs out is killed and counted stalled; a job that ended other
than SUCCEEDED (an AM whose executors did not all start within its 120 s gives up) is counted
failed. Neither has a JCT (issue 33: no timeout stands in for one): `jct_s` keeps how long it was
followed, and bench/gang_admission.py compares only the jobs that succeeded in both settings.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from appmaster.ps.submission import build_ps_submission
from elastane_cli.context import default_user
from elastane_cli.rm_rest_client import RmRestClient
from elastane_cli.sim_calibrate import AM_MEMORY_MB, EXECUTOR_MEMORY_MB, FINAL_STATES, reference_job
from elastane_cli.testbed_cluster import TestbedCluster

POLL_S = 0.5        # 8 jobs polled at this rate stay a small load on the 2-core host

# The rm.toml settings compared: "minimum" is what `gang_admission = true` means by default.
SETTINGS: dict[str, dict[str, Any]] = {
    "off": {"gang_admission": False},
    "minimum": {"gang_admission": True, "gang_shape": "minimum"},
    "submitted": {"gang_admission": True, "gang_shape": "submitted"},
}


@dataclass(frozen=True)
class TestbedShape:
    """The loaded cluster: node hosts each with room for `containers_per_node` containers of
    EXECUTOR_MEMORY_MB (AMs are the same size), so the jobs cannot all run at once."""

    __test__ = False    # not a pytest test class

    nodes: int = 3
    containers_per_node: int = 3
    epochs: int = 3
    app: str = "mlr"

    @property
    def node_memory_mb(self) -> int:
        return self.containers_per_node * max(AM_MEMORY_MB, EXECUTOR_MEMORY_MB)

    @property
    def node_vcores(self) -> int:
        # Memory binds, not vcores: one vcore per container it holds, one spare.
        return self.containers_per_node + 1

    def job_spec(self) -> dict[str, Any]:
        return {**reference_job(self.app, self.epochs), "workers": 2, "servers": 2,
                "min_workers": 1, "min_servers": 1, "max_workers": 2, "max_servers": 2}


@dataclass
class JobOutcome:
    """One job of one run: submission to final state (a stalled job: to its kill at the timeout)."""

    name: str
    app_id: str = ""
    jct_s: float = 0.0
    final_status: str = ""
    stalled: bool = False
    diagnostics: str = ""


@dataclass
class RunOutcome:
    """One run of the workload under one gang setting (a key of SETTINGS)."""

    setting: str
    timeout_s: float
    jobs: list[JobOutcome] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def succeeded_mean_jct_s(self) -> Optional[float]:
        ok = [j.jct_s for j in self.jobs if j.final_status == "SUCCEEDED"]
        return round(sum(ok) / len(ok), 2) if ok else None

    @property
    def stalled(self) -> int:
        return sum(j.stalled for j in self.jobs)

    @property
    def failed(self) -> int:
        return sum(1 for j in self.jobs if not j.stalled and j.final_status != "SUCCEEDED")


async def follow_job(client: RmRestClient, spec: dict[str, Any], name: str, timeout_s: float) -> JobOutcome:
    """Submit `spec` now and poll it until it ends or `timeout_s` passes (then kill it: a stalled
    job must not hold its containers into the next run's teardown)."""
    out = JobOutcome(name)
    new = await client.new_application()
    out.app_id = str(new.get("application-id"))
    t0 = time.monotonic()
    await client.submit(build_ps_submission(spec, name=name, am_memory=AM_MEMORY_MB, app_id=out.app_id))
    while True:
        app = await client.app(out.app_id)
        if app.get("state") in FINAL_STATES:
            out.jct_s = round(time.monotonic() - t0, 2)
            out.final_status = str(app.get("finalStatus"))
            out.diagnostics = str(app.get("diagnostics") or "")[:200]
            return out
        if time.monotonic() - t0 > timeout_s:
            out.stalled, out.jct_s, out.final_status = True, round(timeout_s, 2), "STALLED"
            out.diagnostics = str(app.get("diagnostics") or "")[:200]
            try:
                await client.kill(out.app_id)
            except Exception as e:  # noqa: BLE001 -- it may have ended since the poll; the teardown kills the rest
                out.diagnostics += f" (kill: {e})"
            return out
        await asyncio.sleep(POLL_S)


def run_workload(base: Path, shape: TestbedShape, jobs: int, setting: str, timeout_s: float,
                 start_timeout_s: float = 180.0) -> RunOutcome:
    """A fresh testbed cluster with SETTINGS[setting] in its rm.toml, `jobs` jobs submitted at once
    (in the same order every run), each followed to its end or `timeout_s`; the cluster is removed
    after."""
    cluster = TestbedCluster(base, workers=shape.nodes, node_memory_mb=shape.node_memory_mb,
                             node_vcores=shape.node_vcores, nm_expiry_s=30, am_expiry_s=30, policy="static",
                             rm_conf=SETTINGS[setting]).start(timeout_s=start_timeout_s)
    run = RunOutcome(setting, timeout_s)
    try:
        async def go() -> list[JobOutcome]:
            async with RmRestClient(cluster.rm_url, default_user()) as client:
                return list(await asyncio.gather(*(follow_job(client, shape.job_spec(), f"g{i + 1}", timeout_s)
                                                   for i in range(jobs))))
        t0 = time.monotonic()
        run.jobs = asyncio.run(go())
        run.wall_s = round(time.monotonic() - t0, 2)
    finally:
        cluster.stop()
    return run
