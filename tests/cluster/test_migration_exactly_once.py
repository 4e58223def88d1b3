"""Exactly-once across migrations: executors on real localhost sockets, blocks moved back and forth
while concurrent clients hammer update(add); every key must end at the exact sum of its deltas."""
from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from polling import wait_until
from psruntime.wire.dataplane import DataPlaneClient
from psruntime.executor import Executor
from psruntime.store.migration_controller import MigrationController, MigrationControllerError
from psruntime.store.ownership_table import OwnershipTable
from psruntime.store.store_client import StoreClient

NUM_BLOCKS = 8
KEYS = list(range(24))
DIM = 16


async def start_cluster(n: int) -> tuple[list[Executor], MigrationController]:
    executors = [Executor(f"e{i}", NUM_BLOCKS) for i in range(n)]
    addrs = {e.executor_id: await e.start() for e in executors}
    table = OwnershipTable.round_robin(NUM_BLOCKS, list(addrs), addrs)
    ctl = MigrationController(table)
    await ctl.broadcast()
    return executors, ctl


async def stop_cluster(executors: list[Executor], ctl: MigrationController) -> None:
    await ctl.close()
    for e in executors:
        await e.stop()


async def hammer(client: StoreClient, rounds: int, seed: int, use_push: bool) -> dict[int, np.ndarray]:
    """Send random integer-valued float deltas (exact in float64); return what was sent per key."""
    rng = np.random.default_rng(seed)
    sent = {k: np.zeros(DIM) for k in KEYS}
    for _ in range(rounds):
        keys = [int(k) for k in rng.choice(KEYS, size=5, replace=False)]
        deltas = [rng.integers(-5, 6, size=DIM).astype(np.float64) for _ in keys]
        for k, d in zip(keys, deltas):
            sent[k] += d
        if use_push:
            await client.push(keys, deltas)
        else:
            await client.update(keys, "add", deltas)
        await asyncio.sleep(0)
    await client.flush()
    return sent


async def test_updates_exactly_once_while_blocks_move_back_and_forth() -> None:
    executors, ctl = await start_cluster(3)
    clients = [StoreClient(ctl.table) for _ in range(4)]
    try:
        stop = asyncio.Event()
        moves = 0

        async def mover() -> None:
            nonlocal moves
            rng = np.random.default_rng(7)
            while not stop.is_set():
                block = int(rng.integers(NUM_BLOCKS))
                src = ctl.table.owner_of_block(block)
                dst = f"e{(int(src[1:]) + 1 + int(rng.integers(2))) % 3}"
                await ctl.move([block], src, dst)
                moves += 1
                await asyncio.sleep(0)

        mover_task = asyncio.create_task(mover())
        sent_parts = await asyncio.gather(*(hammer(c, 150, seed, use_push=seed % 2 == 0)
                                            for seed, c in enumerate(clients)))
        stop.set()
        await mover_task
        assert moves >= 20, f"only {moves} moves happened during the run"
        expected = {k: sum(p[k] for p in sent_parts) for k in KEYS}
        reader = StoreClient(ctl.table)
        got = await reader.pull(KEYS)
        for k in KEYS:
            np.testing.assert_array_equal(got[k], expected[k], err_msg=f"key {k}")
        assert sum(c.redirects_followed for c in clients) > 0, "no request ever met a migration"
        stats = [e.service.stats for e in executors]
        assert sum(s["redirected"] for s in stats) > 0, stats
        await reader.close()
    finally:
        for c in clients:
            await c.close()
        await stop_cluster(executors, ctl)


async def test_move_refuses_wrong_source_and_keeps_state() -> None:
    executors, ctl = await start_cluster(2)
    try:
        client = StoreClient(ctl.table)
        await client.put([0], [np.arange(4.0)])
        block = ctl.table.block_of(0)
        owner = ctl.table.owner_of_block(block)
        other = "e1" if owner == "e0" else "e0"
        with pytest.raises(MigrationControllerError, match="not owned by"):
            await ctl.move([block], other, owner)
        with pytest.raises(MigrationControllerError, match="out of range"):
            await ctl.move([NUM_BLOCKS + 3], owner, other)
        np.testing.assert_array_equal(await client.get(0), np.arange(4.0))
        v = await ctl.move([block], owner, other)
        assert v == ctl.table.version and ctl.table.owner_of_block(block) == other
        np.testing.assert_array_equal(await client.get(0), np.arange(4.0))
        await client.close()
    finally:
        await stop_cluster(executors, ctl)


def _spawn_executor(tmp: Path, name: str) -> tuple[subprocess.Popen[bytes], str]:
    ready = tmp / f"{name}.ready"
    proc = subprocess.Popen([sys.executable, "-m", "psruntime.executor", "--executor-id", name, "--port", "0",
                             "--num-blocks", str(NUM_BLOCKS), "--ready-file", str(ready)],
                            stderr=open(tmp / f"{name}.log", "wb"))

    def ready_or_dead() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"executor {name} exited with {proc.returncode}")
        return ready.exists()
    try:
        wait_until(ready_or_dead, 30, f"executor {name}'s ready file", interval_s=0.02)
    except BaseException as e:
        proc.kill()
        e.add_note(f"executor {name} did not start: {(tmp / f'{name}.log').read_text()}")
        raise
    return proc, json.loads(ready.read_text())["address"]


async def test_exactly_once_with_executor_processes(tmp_path: Path) -> None:
    procs = {}
    try:
        for name in ("p0", "p1"):
            procs[name] = _spawn_executor(tmp_path, name)
        addrs = {n: a for n, (_, a) in procs.items()}
        ctl = MigrationController(OwnershipTable.round_robin(NUM_BLOCKS, list(addrs), addrs))
        await ctl.broadcast()
        clients = [StoreClient(ctl.table) for _ in range(2)]
        stop = asyncio.Event()

        async def mover() -> int:
            n = 0
            while not stop.is_set():
                for b in range(NUM_BLOCKS):
                    src = ctl.table.owner_of_block(b)
                    await ctl.move([b], src, "p1" if src == "p0" else "p0")
                    n += 1
            return n

        mover_task = asyncio.create_task(mover())
        parts = await asyncio.gather(*(hammer(c, 100, 10 + i, use_push=True) for i, c in enumerate(clients)))
        stop.set()
        assert await mover_task >= NUM_BLOCKS
        got = await clients[0].pull(KEYS)
        for k in KEYS:
            np.testing.assert_array_equal(got[k], parts[0][k] + parts[1][k], err_msg=f"key {k}")
        # Checkpoint every block, then restore them into a fresh process as the sole owner.
        ckpt = tmp_path / "ckpt"
        dp = DataPlaneClient()
        for addr in addrs.values():
            await dp.request(addr, {"op": "checkpoint", "dir": str(ckpt)})
        procs["p2"] = _spawn_executor(tmp_path, "p2")
        addr2 = procs["p2"][1]
        await dp.request(addr2, {"op": "set_ownership",
                                 "table": OwnershipTable(NUM_BLOCKS, ["p2"] * NUM_BLOCKS, {"p2": addr2}, 1).to_wire()})
        await dp.request(addr2, {"op": "restore", "dir": str(ckpt), "blocks": list(range(NUM_BLOCKS))})
        fresh = StoreClient(OwnershipTable(NUM_BLOCKS, ["p2"] * NUM_BLOCKS, {"p2": addr2}, 1))
        restored = await fresh.pull(KEYS)
        for k in KEYS:
            np.testing.assert_array_equal(restored[k], got[k])
        status = await dp.request(addr2, {"op": "status"})
        assert status.header["rss_bytes"] > 0 and status.header["blocks"] == list(range(NUM_BLOCKS))
        await dp.request(addr2, {"op": "shutdown"})
        assert procs["p2"][0].wait(timeout=10) == 0
        for c in clients + [fresh]:
            await c.close()
        await ctl.close()
        await dp.close()
    finally:
        for proc, _ in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        # Every executor reaped, one that ignored SIGTERM killed, before any of their exits is judged.
        exits = {}
        for name, (proc, _) in procs.items():
            try:
                exits[name] = proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                exits[name] = f"killed after ignoring SIGTERM ({proc.wait()})"
        assert all(code == 0 for code in exits.values()), exits
