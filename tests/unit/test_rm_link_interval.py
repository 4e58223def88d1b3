"""The NM heartbeats at the period the RM gives in its answers (YARN's nextHeartBeatInterval), not
only at nm.toml's: the RM times node expiry and its grace periods by its own rm.toml value."""
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

NODE = "127.0.0.1:45455"


async def test_the_link_heartbeats_at_the_period_the_rms_answers_give(tmp_path: Path) -> None:
    cfg = NMConfig(local_dir=str(tmp_path / "local"), log_dir=str(tmp_path / "logs"),
                   recovery_dir=str(tmp_path / "rec"))
    manager = ContainerManager(cfg, NODE, "127.0.0.1", 45455, Resource(1024, 2), Enforcement(None),
                               RecoveryStore(cfg.recovery_dir))
    rm = await FakeNodeRM(heartbeat_interval_ms=50).start()
    registered = asyncio.Event()
    # nm.toml's period is ten minutes: a heartbeat within the test comes only from the RM's 50 ms.
    link = RMLink(rm.url, SECRET, NODE, NODE, Resource(1024, 2), "/default-rack", manager, 600_000, 3600.0,
                  on_registered=registered.set)
    task = asyncio.get_running_loop().create_task(link.run())
    try:
        await asyncio.wait_for(registered.wait(), 15)
        assert link.interval_s == 0.05
        rm.heartbeat_interval_ms = 400          # the RM's period changes: its next answer says so

        async def heartbeats(n: int) -> None:      # polls the fake RM's record (wait_for bounds it)
            for _ in range(100_000):
                if len(rm.heartbeats) >= n:
                    return
                await asyncio.sleep(0.01)
        await asyncio.wait_for(heartbeats(2), 15)
        assert link.interval_s == 0.4
        rm.heartbeat_interval_ms = 0            # not a period: the link keeps the last one
        await asyncio.wait_for(heartbeats(len(rm.heartbeats) + 2), 15)
        assert link.interval_s == 0.4
    finally:
        task.cancel()
        await asyncio.wait([task], timeout=5)
        await link.close()
        await rm.stop()
        manager.store.close()
