"""Executors as processes in both roles: they announce themselves to the AM (played by the test),
which announces ownership and trains two BSP workers in clocks through the control channel (the
ops the PS AM uses); all stop on SIGTERM."""
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

from psruntime.apps.base import ObjectivePart
from psruntime.apps.registry import create_app
from psruntime.wire.dataplane import DataPlaneClient, DataPlaneServer, RemoteError
from psruntime.wire.frame_codec import Frame
from psruntime.store.migration_controller import MigrationController
from psruntime.store.ownership_table import OwnershipTable

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


async def test_executor_processes_announce_themselves_and_train_in_clocks(tmp_path: Path) -> None:
    announced: dict[str, dict] = {}

    def am_handler(frame: Frame):
        h = frame.header
        if h["op"] != "executor_ready":
            raise ValueError(f"unexpected op {h['op']!r}")
        announced[h["executor_id"]] = h
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
        assert {n: announced[n]["role"] for n in roles} == roles
        ctl = MigrationController(OwnershipTable.round_robin(NB, ["s0", "s1"], addrs))
        await ctl.broadcast(["s0", "s1", "w0", "w1"])
        workers = ["w0", "w1"]

        async def each(header: dict) -> list[dict]:
            return [(await dp.request(addrs[w], header)).header for w in workers]

        await each({"op": "app_setup", "app": "mlr", "preset": "tiny"})
        with pytest.raises(RemoteError, match="out of range"):
            await dp.request(addrs["w0"], {"op": "worker_setup", "partition": 5, "num_partitions": 2})
        for i, w in enumerate(workers):
            await dp.request(addrs[w], {"op": "worker_setup", "partition": i, "num_partitions": 2})
        await dp.request(addrs["w0"], {"op": "init_model"})       # once, before any worker pushes
        await each({"op": "init_blocks"})
        app = create_app("mlr", preset="tiny")
        loss = []
        for epoch in range(2):
            done = False
            while not done:     # BSP: every worker finishes a clock before the next one starts
                clock = {"op": "run_clock", "epoch": epoch, "batches": 5, "num_workers": 2}
                replies = await asyncio.gather(*(dp.request(addrs[w], clock) for w in workers))
                assert all(r.header["batches"] <= 5 and len(r.arrays) == 4 for r in replies)  # the step times; their grant waits
                done = all(r.header["epoch_done"] for r in replies)
            parts = [ObjectivePart(h["value"], h["count"]) for h in await each({"op": "objective"})]
            loss.append(app.combine(parts, [0.0]))
        assert loss[1] < loss[0] < np.log(5)
        status = (await dp.request(addrs["w0"], {"op": "status"})).header
        assert status["train_counters"]["batches"] == 2 * 2000 // 50 // 2
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
