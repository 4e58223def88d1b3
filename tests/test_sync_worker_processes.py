"""Executors as processes in both roles: the AM (played by the test) announces ownership, starts
two BSP workers through the control channel and receives their epoch reports; all stop on SIGTERM."""
from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from psruntime.dataplane import DataPlaneClient, DataPlaneServer, RemoteError
from psruntime.frame_codec import Frame
from psruntime.migration_controller import MigrationController
from psruntime.ownership_table import OwnershipTable
from psruntime.apps.registry import create_app
from psruntime.store_client import StoreClient
from psruntime.worker_loop import init_model

NB = 8


def spawn(tmp: Path, name: str, role: str, am: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "psruntime.executor", "--executor-id", name, "--port", "0",
                             "--num-blocks", str(NB), "--role", role, "--am", am,
                             "--ready-file", str(tmp / f"{name}.ready")],
                            stderr=open(tmp / f"{name}.log", "wb"))


async def wait_for(cond, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def test_workers_in_executor_processes_report_to_the_am(tmp_path: Path) -> None:
    announced: dict[str, dict] = {}
    epoch_reports: list[dict] = []

    def am_handler(frame: Frame):
        h = frame.header
        if h["op"] == "executor_ready":
            announced[h["executor_id"]] = h
        elif h["op"] == "epoch_report":
            epoch_reports.append(h)
        return {"op": "ok"}, ()

    am = DataPlaneServer(am_handler)
    am_addr = await am.start()
    roles = {"s0": "server", "s1": "server", "w0": "worker", "w1": "worker"}
    procs = {n: spawn(tmp_path, n, r, am_addr) for n, r in roles.items()}
    dp = DataPlaneClient()
    try:
        await wait_for(lambda: len(announced) == 4, "executors to announce themselves")
        addrs = {n: announced[n]["address"] for n in roles}
        ready = json.loads((tmp_path / "w0.ready").read_text())
        assert ready["address"] == addrs["w0"] and ready["pid"] == procs["w0"].pid
        ctl = MigrationController(OwnershipTable.round_robin(NB, ["s0", "s1"], {n: addrs[n] for n in ("s0", "s1")}))
        await ctl.broadcast()
        base = {"op": "start_worker", "app": "mlr", "preset": "tiny", "num_partitions": 2, "epochs": 2,
                "table": ctl.table.to_wire(), "clock_address": addrs["s0"], "start_clock": 0}
        # Bad start requests are refused and start nothing.
        with pytest.raises(RemoteError, match="unknown app"):
            await dp.request(addrs["w0"], {**base, "app": "nope", "worker_id": "w0", "partition": 0})
        with pytest.raises(RemoteError, match="'partition' must be in 0..1"):
            await dp.request(addrs["w0"], {**base, "worker_id": "w0", "partition": 5})
        with pytest.raises(RemoteError, match="switch_role to worker first"):
            await dp.request(addrs["s1"], {**base, "worker_id": "x", "partition": 0})
        # The AM initialises the model once, before any worker pushes.
        store = StoreClient(ctl.table)
        await init_model(store, create_app("mlr", preset="tiny"))
        await store.close()
        await dp.request(addrs["w0"], {**base, "worker_id": "w0", "partition": 0})
        await dp.request(addrs["w1"], {**base, "worker_id": "w1", "partition": 1})

        async def states() -> list[str]:
            return [(await dp.request(addrs[w], {"op": "worker_status"})).header["state"] for w in ("w0", "w1")]

        deadline = time.monotonic() + 120
        while (st := await states()) != ["finished", "finished"]:
            assert "failed" not in st and time.monotonic() < deadline, st
            await asyncio.sleep(0.05)
        assert sorted((r["worker_id"], r["epoch"]) for r in epoch_reports) == \
            [("w0", 0), ("w0", 1), ("w1", 0), ("w1", 1)]
        assert all(r["clock"] == r["epoch"] + 1 and r["batches"] > 0 for r in epoch_reports)
        loss = [sum(r["objective"]["value"] for r in epoch_reports if r["epoch"] == e) /
                sum(r["objective"]["count"] for r in epoch_reports if r["epoch"] == e) for e in (0, 1)]
        assert loss[1] < loss[0] < np.log(5)
        status = (await dp.request(addrs["w0"], {"op": "worker_status"})).header
        assert status["compute_s"] > 0 and status["comm_s"] > 0
        clocks = (await dp.request(addrs["s0"], {"op": "clock_status"})).header
        assert clocks["clocks"] == {}  # finished workers left the clock
        await ctl.close()
    finally:
        await dp.close()
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes = {}
        for n, p in procs.items():
            try:
                codes[n] = p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                codes[n] = p.wait()
        await am.stop()
    assert codes == {n: 0 for n in roles}, codes
