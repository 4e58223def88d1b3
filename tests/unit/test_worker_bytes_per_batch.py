"""A PS worker's bytes per mini-batch reach the job report (WorkerTiming.bytes_per_batch): the
worker counts what its pulls and pushes carry, its step replies say it, the AM averages it --
over the real AM and in-process executors (tests/support/ps_inprocess.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from protocol.records import FinalStatus
from ps_inprocess import SPEC, PsJob


async def test_the_job_report_carries_the_bytes_each_worker_pulled_and_pushed(tmp_path: Path) -> None:
    job = PsJob(tmp_path, dict(SPEC, max_epochs=1))
    try:
        assert await job.run() is FinalStatus.SUCCEEDED
        workers = {eid for eid in job.am.executors if eid.startswith("worker-")}
        assert len(workers) == SPEC["workers"]
        # MLR's default data touches every model key in every mini-batch: each pull and each push
        # carries all keys (int64) and their values (float32 rows of key_length).
        app = job.app
        per_batch = 2 * app.num_keys * (8 + 4 * app.key_length)
        for eid in workers:
            counters = job.executor(eid).app_role.pipeline.counters
            assert counters["batches"] > 0 and counters["bytes"] == per_batch * counters["batches"]
        timing = job.master.metrics.worker_timing(workers)
        assert timing.workers == len(workers)
        assert timing.bytes_per_batch == pytest.approx(per_batch)
        # ... and the reports the AM sent the RM carried it once training ran
        sent = [r.worker_times.bytes_per_batch for r in job.am.reports if r.worker_times is not None
                and r.worker_times.workers]
        assert sent and sent[-1] == pytest.approx(per_batch)
    finally:
        await job.close()
