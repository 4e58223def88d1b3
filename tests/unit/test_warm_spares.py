"""Spare warm children (nodemanager.warm_spares): a warm launch runs in a spare that joined its
cgroup ahead, with the container's limits and as a fresh fork would run it; the pool refills, falls
back to a fresh fork, and cleans up.

The cgroup tree is v2 on a plain directory (test_container_shell_pool's FakeV2: a process "joins"
by writing its pid into the fake cgroup.procs), so these run anywhere; the zygote is real."""
from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any, AsyncIterator

import pytest

from nodemanager.container_manager import ContainerManager
from nodemanager.warm_launcher import WarmLauncher
from nodemanager.warm_spares import NAME_PREFIX, WarmSparePool
from polling import async_wait_until
from protocol.internal_api import LaunchContext, WarmStart
from protocol.records import Resource

from test_container_shell_pool import claims, fake_backend, manager, process_alive


def spare_cgroups(backend: Any) -> dict[Path, str]:
    """The pool's idle spares as the cgroup tree shows them: each spare cgroup and what it lists."""
    return {d: (d / "cgroup.procs").read_text() for d in Path(backend.parent).glob(f"{NAME_PREFIX}*")}


@pytest.fixture
async def zygote() -> AsyncIterator[WarmLauncher]:
    w = WarmLauncher(["timeit"])
    await w.start()
    try:
        yield w
    finally:
        await w.close()


async def warm_manager(tmp_path: Path, zygote: WarmLauncher, size: int = 2) -> tuple[ContainerManager, WarmSparePool]:
    backend = fake_backend(tmp_path)
    m = manager(tmp_path, backend, None)
    m.warm = zygote
    pool = WarmSparePool(backend, zygote, size)
    m.warm_spares = pool
    await pool.start()
    await async_wait_until(lambda: pool.ready == size, what="spares ready")
    return m, pool


def warm_ctx(code: str) -> LaunchContext:
    return LaunchContext(commands=["false"], warm_start=WarmStart(module="timeit", argv=["-n", "1", "-r", "1", code]))


async def test_a_warm_launch_runs_in_a_spare_with_the_containers_limits_and_the_pool_refills(
        tmp_path: Path, zygote: WarmLauncher) -> None:
    m, pool = await warm_manager(tmp_path, zygote)
    try:
        before = spare_cgroups(pool.backend)
        code = "import os; print('pid', os.getpid(), 'cwd', os.getcwd(), 'id', os.environ['CONTAINER_ID'])"
        c = await m.start(claims(), Resource(96, 2), warm_ctx(code))
        assert c.launch_path == "zygote-spare" and pool.served == 1
        assert c.cgroup is not None
        d = Path(c.cgroup.dirs[0])
        assert d in before and before[d] == str(c.pid)       # it joined before the launch...
        assert (d / "cgroup.procs").read_text() == str(c.pid)  # ...and not again
        assert (d / "memory.max").read_text() == str(96 * 1024 * 1024)
        assert (d / "cpu.max").read_text().split()[0] == "200000"
        await async_wait_until(lambda: c.exited.is_set(), what="the container's exit")
        assert c.exit_status == 0
        out = (Path(c.log_dir) / "stdout").read_text()
        assert f"pid {c.pid} cwd {c.work_dir} id {c.container_id}" in out
        for f in d.iterdir():       # the kernel lets an empty cgroup's dir go, control files and all
            f.unlink()
        await async_wait_until(lambda: not d.exists(), what="the container's cgroup removed")
        await async_wait_until(lambda: pool.ready == 2, what="pool refilled")
        assert len(spare_cgroups(pool.backend)) == 2 and d not in spare_cgroups(pool.backend)
    finally:
        await m.shutdown()
    assert spare_cgroups(pool.backend) == {}          # the idle spares went with the shutdown
    assert pool.take() is None


async def test_a_dead_spare_or_none_means_a_fresh_fork(tmp_path: Path, zygote: WarmLauncher) -> None:
    m, pool = await warm_manager(tmp_path, zygote, size=1)
    try:
        [(d, pid)] = spare_cgroups(pool.backend).items()
        os.kill(int(pid), signal.SIGKILL)       # an idle spare killed from outside
        await async_wait_until(lambda: not process_alive(int(pid)), what="the spare gone")
        await async_wait_until(lambda: not any(s.alive for s in pool.idle), what="its exit reported")
        c = await m.start(claims(), Resource(64, 1), warm_ctx("pass"))
        assert c.launch_path == "zygote" and pool.missed == 1 and pool.served == 0
        assert c.cgroup is not None and Path(c.cgroup.dirs[0]).name == c.container_id   # made for it
        assert not d.exists()                   # the dead spare's cgroup was removed
        await async_wait_until(lambda: c.exited.is_set(), what="the container's exit")
        assert c.exit_status == 0
        for f in Path(c.cgroup.dirs[0]).iterdir():    # as above: the emptied cgroup can go
            f.unlink()
    finally:
        await m.shutdown()


async def test_start_removes_stale_spare_cgroups_and_a_broken_zygote_breaks_the_pool_once(
        tmp_path: Path) -> None:
    backend = fake_backend(tmp_path)
    stale = Path(backend.parent) / f"{NAME_PREFIX}1-1"
    stale.mkdir()
    w = WarmLauncher(["timeit"])          # never started: every spare request fails
    pool = WarmSparePool(backend, w, 2)
    try:
        await pool.start()
        assert not stale.exists()
        await async_wait_until(lambda: pool.broken, what="the pool gives up")
        assert "not running" in pool.broken and pool.take() is None and pool.ready == 0
        assert spare_cgroups(backend) == {}     # the cgroup made for the failed spare is gone
        assert pool.stats()["broken"] == pool.broken
    finally:
        await pool.close()
