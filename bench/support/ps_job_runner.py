"""Submit a PS job to a local cluster and wait for it: what the cluster benchmarks share.

`run_ps_job` returns the AM's final status (`<rm state dir>/apps/<id>/status.json`, a
protocol.ps_status.PsStatus) once the app is
FINISHED/SUCCEEDED, or raises naming how it ended or that it ran out of time; `on_poll` sees every
RM report while the app runs (e.g. to sample its executors), at the polling interval.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable, Optional

from elastane_cli import ps_commands
from elastane_cli.local_cluster import LocalCluster
from elastane_cli.rm_rest_client import RmRestClient
from protocol.ps_job_spec import PSJobSpec
from protocol.ps_status import FINAL_STATUS_FILE, PsStatus, read_status

OnPoll = Callable[[dict[str, Any]], Awaitable[None]]


async def run_ps_job(cluster: LocalCluster, spec: PSJobSpec, name: str, am_memory: int, timeout_s: float,
                     poll_s: float = 0.5, on_poll: Optional[OnPoll] = None) -> PsStatus:
    async with RmRestClient(cluster.rm_url, "bench") as client:
        t0 = time.monotonic()
        app_id = await ps_commands.submit_ps_job(client, spec, name, am_memory=am_memory)
        while True:
            report = await client.app(app_id)
            if report["state"] in ps_commands.FINAL_STATES:
                break
            if time.monotonic() - t0 > timeout_s:
                await client.kill(app_id)     # not left running beside the next job
                raise RuntimeError(f"{app_id} did not finish within {timeout_s:.0f}s")
            if on_poll is not None:
                await on_poll(report)
            await asyncio.sleep(poll_s)
    if report["finalStatus"] != "SUCCEEDED":
        raise RuntimeError(f"{app_id} ended {report['state']}/{report['finalStatus']}: {report.get('diagnostics')}")
    return read_status((cluster.base_dir / "rm" / "apps" / app_id / FINAL_STATUS_FILE).read_bytes())
