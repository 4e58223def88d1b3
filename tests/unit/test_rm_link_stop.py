"""The NM's heartbeat loop (nodemanager/rm_link.py) ends when its task is cancelled, even when the
cancel comes in the same loop step as the wake-up it waits on (a container's exit). Python 3.11's
asyncio.wait_for returned the wake-up and dropped that cancel (CPython gh-86296): the loop ran on,
and NodeManager.stop, awaiting it, hung until the test's SIGKILL (CI at 700ad44)."""
from __future__ import annotations

import asyncio
from pathlib import Path

from nm_harness import SECRET, FakeNodeRM
from nodemanager.container_manager import ContainerManager
from nodemanager.enforcement import Enforcement
from nodemanager.recovery_store import RecoveryStore
from nodemanager.rm_link import RMLink
from protocol.config import NMConfig
from protocol.records import Resource

NODE = "127.0.0.1:45454"


async def test_a_cancel_in_the_step_of_a_container_exit_ends_the_heartbeat_loop(tmp_path: Path) -> None:
    cfg = NMConfig(local_dir=str(tmp_path / "local"), log_dir=str(tmp_path / "logs"),
                   recovery_dir=str(tmp_path / "rec"))
    manager = ContainerManager(cfg, NODE, "127.0.0.1", 45454, Resource(1024, 2), Enforcement(None),
                               RecoveryStore(cfg.recovery_dir))
    # A heartbeat interval far beyond the test (the RM's, which the link follows, and the NM's
    # own): the loop sits in its wait for a wake-up.
    rm = await FakeNodeRM(heartbeat_interval_ms=600_000).start()
    registered = asyncio.Event()
    link = RMLink(rm.url, SECRET, NODE, NODE, Resource(1024, 2), "/default-rack", manager, 600_000, 3600.0,
                  on_registered=registered.set)
    task = asyncio.get_running_loop().create_task(link.run())
    try:
        await asyncio.wait_for(registered.wait(), 15)
        # on_registered runs in the link's step that goes on into the wait: it is waiting now.
        assert not task.done() and rm.heartbeats == []
        manager.on_container_exited()   # a container ended: the wait is woken...
        task.cancel()                   # ...and the NM stops, in the same step
        done, _ = await asyncio.wait([task], timeout=15)
        assert done == {task}, "the heartbeat loop ran on after its cancel"
        assert task.cancelled()
        assert rm.heartbeats == []      # no heartbeat went out after the cancel
    finally:
        if not task.done():
            task.cancel()
            await asyncio.wait([task], timeout=5)
        await link.close()
        await rm.stop()
        manager.store.close()
