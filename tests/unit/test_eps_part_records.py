"""An EPS change's per-part records on the real AM (tests/support/ps_inprocess.py): each part's
duration is its own, from its first step's start to its last step's end.

The records feed `ps scale`, the job's EPS history and bench/eps_overhead.py's eps_add_s (the
span from the first part's start to the last part's end). A part's duration was once its start's
perf_counter reading whenever that reading was below 1e6 (a host up for less than 11.6 days), and
every part ended with its change, so the quicker role's part took the slower one's time."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from appmaster.container_book import AmContainer
from ps_inprocess import SPEC, PsJob


@pytest.fixture
async def job(tmp_path: Path):
    j = PsJob(tmp_path / "job", {**SPEC, "max_epochs": 50})
    yield j
    await j.close()


async def test_each_part_of_an_eps_add_records_its_own_duration(job: PsJob, tmp_path: Path) -> None:
    worker_gate = asyncio.Event()
    launch = job.am.launch

    async def held_worker_launch(container: AmContainer, ctx: object) -> bool:
        if container.tag == "worker" and job.loop.clocks_done:   # the new worker starts only once
            await worker_gate.wait()                             # the server part is done
        return await launch(container, ctx)
    job.am.launch = held_worker_launch

    job.start()
    await job.until(lambda: job.loop.clocks_done >= 1, "training")
    asked_wall, asked = time.time(), time.perf_counter()
    scaled: asyncio.Future[Any] = asyncio.ensure_future(job.master.request_scale(1, 1))
    # The server part ends once its blocks have moved to the new server (the step's holdings).
    await job.until(lambda: bool(job.job.holdings.blocks.get("server-2")), "the new server's blocks")
    server_part_done = time.perf_counter() - asked
    worker_gate.set()
    records = {r.op: r for r in await scaled}
    elapsed = time.perf_counter() - asked

    assert set(records) == {"add_servers", "add_workers"} and all(r.ok for r in records.values())
    servers, workers = records["add_servers"], records["add_workers"]
    for r in (servers, workers):
        assert asked_wall - 1.0 <= r.started <= asked_wall + elapsed
        assert 0.0 < r.duration_s <= elapsed
    # The server part ended before the worker's launch was let go; the worker part after it.
    assert servers.duration_s <= server_part_done
    assert workers.started + workers.duration_s > servers.started + servers.duration_s
    assert workers.duration_s > servers.duration_s
    # EPS's inactive splits go under each executor's own dir in the test's tmp, not into the
    # checkout (the process's working dir, which a container's is and a test's is not).
    roots = [ex.eps.inactive.root for ex in job.am.executors.values()]
    assert roots and all(tmp_path in r.parents for r in roots), roots
