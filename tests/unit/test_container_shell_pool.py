"""Pre-started container shells (nodemanager.container_shell_pool): a container launched in one runs
as a cold launch would (environment, working dir, session, logs, exit code, cgroup limits), and the
pool starts, refills, falls back and cleans up.

Most tests use a v2 cgroup tree on a plain directory (a shell "joins" by writing its pid into the
fake cgroup.procs), so they run anywhere; one joins a real v1 hierarchy where the host allows."""
from __future__ import annotations

import asyncio
import os
import shutil
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

from nodemanager import launcher
from nodemanager.cgroup_base import ContainerCgroup, read_pids
from nodemanager.cgroup_v1 import CgroupV1
from nodemanager.cgroup_v2 import CgroupV2
from nodemanager.container_manager import ContainerManager
from nodemanager.container_shell_pool import NAME_PREFIX, ContainerShellPool, ShellLaunchError
from nodemanager.container_state import NMContainerState as St
from nodemanager.enforcement import Enforcement
from nodemanager.node_manager import NodeManager
from nodemanager.recovery_store import RecoveryStore
from protocol.config import ClusterConfig, NMConfig
from protocol.internal_api import LaunchContext
from protocol.records import ExitStatus, Resource
from polling import async_wait_until

from test_nm_cgroups import REAL_V1, fake_v2


class FakeV2(CgroupV2):
    """v2 on a plain directory: a cgroup "is removed" as the kernel would remove it -- only once no
    process it lists lives (a plain rmdir would refuse the control files)."""

    def try_remove(self, cg: ContainerCgroup) -> bool:
        for d in cg.dirs:
            if any(process_alive(pid) for pid in read_pids(os.path.join(d, "cgroup.procs"))):
                return False
            shutil.rmtree(d, ignore_errors=True)
        return True


def process_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def idle_shells(backend: CgroupV2) -> dict[Path, int]:
    """The pool's idle shells as the cgroup tree shows them: each shell cgroup and the pid in it."""
    return {d: int((d / "cgroup.procs").read_text()) for d in Path(backend.parent).glob(f"{NAME_PREFIX}*")}


def fake_backend(tmp_path: Path) -> CgroupV2:
    b = FakeV2(str(fake_v2(tmp_path / "cgroup")), "elastane", "node_1")
    b.setup()
    return b


def manager(tmp_path: Path, backend: Any, shells: ContainerShellPool | None) -> ContainerManager:
    cfg = NMConfig(local_dir=str(tmp_path / "local"), log_dir=str(tmp_path / "logs"),
                   recovery_dir=str(tmp_path / "rec"), delete_workdir=False)
    m = ContainerManager(cfg, "127.0.0.1:1", "127.0.0.1", 1, Resource(2048, 4), Enforcement(backend),
                         RecoveryStore(cfg.recovery_dir))
    m.shells = shells
    return m


_seq = iter(range(1, 10_000))


def claims() -> dict[str, Any]:
    n = next(_seq)
    return {"container_id": f"container_1700000000000_0001_01_{n:06d}", "app_id": "application_1700000000000_0001",
            "attempt_id": "appattempt_1700000000000_0001_000001", "user": "alice"}


async def run_to_end(m: ContainerManager, cmd: str, env: dict[str, str] | None = None, memory: int = 128):
    c = await m.start(claims(), Resource(memory, 1), LaunchContext(commands=[cmd], environment=env or {}))
    await async_wait_until(lambda: c.exited.is_set(), what=f"{c.container_id} exited")
    return c


def env_of(path: Path) -> dict[str, str]:
    """`env -0` output as a dict, less `_` (bash sets it to the last command's path)."""
    pairs = [kv.split("=", 1) for kv in path.read_text().split("\0") if kv]
    return {k: v for k, v in pairs if k != "_"}


async def full_pool(backend: Any, size: int = 2) -> ContainerShellPool:
    pool = ContainerShellPool(backend, size)
    await pool.start()
    await async_wait_until(lambda: pool.ready == size, what="shells ready")
    return pool


async def test_a_container_in_a_shell_sees_what_a_cold_launch_sees(tmp_path):
    backend = fake_backend(tmp_path)
    pool = await full_pool(backend)
    warm_m, cold_m = manager(tmp_path / "w", backend, pool), manager(tmp_path / "c", backend, None)
    cmd = "env -0 > env.out; pwd > pwd.out; ps -o pgid= -p $$ > pgid.out; echo hi; echo oops >&2; exit 3"
    env = {"FOO": "bar baz", "QUOTED": "it's \"$HOME\" `x`\nline2", "PATH": "/usr/bin:/bin"}
    warm = await run_to_end(warm_m, cmd, env)
    cold = await run_to_end(cold_m, cmd, env)
    try:
        assert pool.served == 1 and pool.missed == 0
        for c in (warm, cold):
            work, logs = Path(c.work_dir), Path(c.log_dir)
            assert c.exit_status == 3 and c.state in (St.EXITED_WITH_FAILURE, St.DONE), c.state
            assert (logs / "stdout").read_text() == "hi\n" and (logs / "stderr").read_text() == "oops\n"
            assert Path(os.path.realpath(work)) == Path((work / "pwd.out").read_text().strip()).resolve()
            assert int((work / "pgid.out").read_text()) == c.pgid == c.pid   # its own session/group
            assert Path(c.exit_file).read_text().strip() == "3"
        w, k = env_of(Path(warm.work_dir) / "env.out"), env_of(Path(cold.work_dir) / "env.out")
        differ = {key for key in w.keys() | k.keys() if w.get(key) != k.get(key)}
        # Only the names that carry the container's own id, dirs and pwd may differ.
        assert differ <= {"CONTAINER_ID", "PWD", "LOG_DIRS", "ELASTANE_CONTAINER_ID"}, (differ, w, k)
        assert w["FOO"] == "bar baz" and w["QUOTED"] == env["QUOTED"]
        # The environment reached the shell down its pipe, never through a file (it holds the
        # job's secret): the launch script has none of it.
        assert "bar baz" not in (Path(warm.work_dir) / "launch_container.sh").read_text()
        # The shell's cgroup became the container's: its limits, its name (v2 cannot rename).
        assert warm.cgroup is not None and Path(warm.cgroup.dirs[0]).name.startswith(NAME_PREFIX)
    finally:
        for m in (warm_m, cold_m):
            await m.shutdown()
        await pool.close()


async def test_the_shells_cgroup_gets_the_containers_limits_and_the_pool_refills(tmp_path):
    backend = fake_backend(tmp_path)
    pool = await full_pool(backend)
    m = manager(tmp_path, backend, pool)
    try:
        c = await m.start(claims(), Resource(96, 2), LaunchContext(commands=["sleep 30"]))
        assert c.cgroup is not None
        d = Path(c.cgroup.dirs[0])
        assert (d / "memory.max").read_text() == str(96 * 1024 * 1024)
        assert (d / "cpu.max").read_text().split()[0] == "200000"
        assert int((d / "cgroup.procs").read_text()) == c.pid    # the shell joined it before the launch
        await async_wait_until(lambda: pool.ready == 2, what="pool refilled")
        await m.stop(c.container_id, -105, "test")
        await async_wait_until(lambda: not d.exists() or not (d / "cgroup.procs").exists() or c.finished_at,
                               what="container stopped")
        assert c.exit_status == -105
    finally:
        await m.shutdown()
        await pool.close()


async def test_a_dead_or_unusable_shell_means_a_cold_launch(tmp_path):
    backend = fake_backend(tmp_path)
    pool = await full_pool(backend, size=1)
    m = manager(tmp_path, backend, pool)
    try:
        [(_, pid)] = idle_shells(backend).items()
        os.kill(pid, signal.SIGKILL)        # an idle shell killed from outside, as an operator might
        await async_wait_until(lambda: not process_alive(pid), what="the shell gone")
        c = await run_to_end(m, "exit 0")
        assert c.exit_status == 0 and pool.missed == 1 and pool.served == 0
        assert c.cgroup is not None and Path(c.cgroup.dirs[0]).name == c.container_id   # cold: its own
        await async_wait_until(lambda: pool.ready == 1, what="pool refilled")
        # A name a shell cannot export: the launch goes cold, the shell is ended and its cgroup removed.
        [(taken_dir, taken_pid)] = idle_shells(backend).items()
        c2 = await run_to_end(m, 'test "$(printenv BAD-NAME)" = x', env={"BAD-NAME": "x"})
        assert c2.exit_status == 0 and not process_alive(taken_pid)
        assert not taken_dir.exists()
    finally:
        await m.shutdown()
        await pool.close()


def test_shell_can_set_refuses_names_a_shell_cannot_export():
    assert launcher.shell_can_set({"A_1": "x y", "_B": "'\"$"})
    assert not launcher.shell_can_set({"BAD-NAME": "x"})
    assert not launcher.shell_can_set({"1A": "x"})
    assert not launcher.shell_can_set({"A": "nul\0byte"})


async def test_run_refuses_an_environment_it_cannot_export(tmp_path):
    backend = fake_backend(tmp_path)
    pool = await full_pool(backend, size=1)
    try:
        shell = pool.take()
        assert shell is not None
        spec = launcher.LaunchSpec(container_id="container_1_0001_01_000009", app_id="application_1_0001",
                                   attempt_id="", user="u", memory_mb=64, vcores=1, work_dir=str(tmp_path / "w"),
                                   log_dir=str(tmp_path / "l"), exit_file=str(tmp_path / "x"), nm_host="h", nm_port=1)
        launcher.prepare_dirs(spec)
        with pytest.raises(ShellLaunchError, match="cannot export"):
            shell.run(spec, LaunchContext(commands=["true"], environment={"NOT OK": "1"}))
        pool.discard(shell)
        assert shell.popen.poll() is not None
    finally:
        await pool.close()


async def test_close_ends_idle_shells_and_start_removes_stale_ones(tmp_path):
    backend = fake_backend(tmp_path)
    stale = Path(backend.parent) / f"{NAME_PREFIX}1-1"
    stale.mkdir()
    pool = await full_pool(backend, size=3)
    assert not stale.exists()
    shells = idle_shells(backend)
    assert len(set(shells.values())) == 3 and all(process_alive(pid) for pid in shells.values())
    await pool.close()
    assert not any(process_alive(pid) for pid in shells.values())
    assert not any(d.exists() for d in shells)
    assert pool.take() is None


async def test_a_shell_that_cannot_join_breaks_the_pool_once_and_launches_stay_cold(tmp_path):
    backend = fake_backend(tmp_path)
    os.chmod(backend.parent, 0o500)          # new cgroups cannot be made
    pool = ContainerShellPool(backend, 2)
    try:
        if os.geteuid() == 0:                 # root ignores the mode: make joining fail instead
            os.chmod(backend.parent, 0o700)
            backend.join_files = lambda cg: ["/proc/version"]   # type: ignore[method-assign]
        await pool.start()
        await async_wait_until(lambda: pool.broken, what="pool gives up")
        assert pool.take() is None and pool.ready == 0
        await asyncio.sleep(0)                # a take does not start another attempt
        assert pool.stats()["broken"] == pool.broken
    finally:
        os.chmod(backend.parent, 0o700)
        await pool.close()


@pytest.mark.skipif(REAL_V1 is None, reason="needs root and cgroup v1 cpu + memory hierarchies")
@pytest.mark.cgroups
async def test_v1_the_shell_is_in_the_renamed_cgroup_with_the_containers_limits(tmp_path):
    assert REAL_V1 is not None
    name = f"elastane-test-{uuid.uuid4().hex[:8]}"
    backend = CgroupV1(*REAL_V1, name, "node_1")
    backend.setup()
    pool = await full_pool(backend, size=1)
    m = manager(tmp_path, backend, pool)
    try:
        c = await m.start(claims(), Resource(80, 1), LaunchContext(commands=["cat /proc/self/cgroup; sleep 30"]))
        assert c.cgroup is not None and pool.served == 1
        cpu_dir, mem_dir = map(Path, c.cgroup.dirs)
        assert cpu_dir.name == mem_dir.name == c.container_id
        assert int((mem_dir / "memory.limit_in_bytes").read_text()) == 80 * 1024 * 1024
        assert c.pid in backend.pids(c.cgroup)
        out = Path(c.log_dir) / "stdout"
        await async_wait_until(lambda: out.exists() and f"{name}/node_1/{c.container_id}" in out.read_text(),
                               what="the command's own cgroup")
        await m.stop(c.container_id, -105, "test")
        await async_wait_until(lambda: not mem_dir.exists(), what="cgroup removed")
    finally:
        await m.shutdown()
        await pool.close()
        backend.teardown()
    assert not Path(REAL_V1[1], name).exists()


async def test_a_pool_never_makes_the_name_of_a_cgroup_an_earlier_nm_left(tmp_path):
    """On v2 a container keeps its shell's cgroup name. An NM restarted with the old one's pid (a
    new pid namespace, a reused pid) must not make that name again: the cgroup would be joined, not
    made, and a new shell -- and the next container -- would share the live container's cgroup."""
    backend = fake_backend(tmp_path)
    me = f"{os.getpid()}\n"      # a process that runs (this test's): the containers' cgroups stay
    kept = [Path(backend.parent) / f"{NAME_PREFIX}{os.getpid()}-{n}" for n in (1, 2)]
    for d in kept:
        d.mkdir()
        (d / "cgroup.procs").write_text(me)
    pool = await full_pool(backend)
    try:
        shells = {Path(sh.cgroup.dirs[0]) for sh in pool.idle}
        assert len(shells) == 2 and not shells & set(kept)
        assert all((d / "cgroup.procs").read_text() == me for d in kept)
    finally:
        await pool.close()


async def test_the_nm_recovers_its_containers_before_its_pools_clear_empty_cgroups(tmp_path):
    """On v2 a container launched in a shell keeps the shell's cgroup. One the kernel OOM-killed
    while the NM was down has an empty `shell-*` cgroup, which a pool's start removes: recovery
    reads it first (the OOM kill, the peak), else the container is reported ABORTED."""
    backend = fake_backend(tmp_path)
    cg = Path(backend.parent) / f"{NAME_PREFIX}4242-1"       # the previous NM's shell, now the container's
    cg.mkdir()
    (cg / "cgroup.procs").write_text("")                    # its processes are gone
    (cg / "memory.events").write_text("low 0\nhigh 0\nmax 9\noom 1\noom_kill 1\noom_group_kill 1\n")
    (cg / "memory.peak").write_text(str(200 * 1024 * 1024))
    cfg = NMConfig(local_dir=str(tmp_path / "local"), log_dir=str(tmp_path / "logs"),
                   recovery_dir=str(tmp_path / "rec"), delete_workdir=False, container_shells=1,
                   memory_mb=2048, vcores=4)
    cid = "container_1700000000000_0001_01_000002"
    store = RecoveryStore(cfg.recovery_dir)
    store.save({"container_id": cid, "app_id": "application_1700000000000_0001",
                "resource": {"memory": 128, "vCores": 1}, "work_dir": str(tmp_path / "w"),
                "log_dir": str(tmp_path / "logs"), "exit_file": store.exit_file(cid), "pid": 2 ** 22 + 999,
                "pgid": None, "start_time": 1, "cgroup": {"container_id": cid, "dirs": [str(cg)]}})
    store.close()
    m = await NodeManager(cfg, ClusterConfig())._start_containers(Enforcement(backend))
    try:
        c = m.containers[cid]
        assert c.exit_status == ExitStatus.KILLED_EXCEEDED_PMEM, c.diagnostics
        assert "Current usage: 200.0 MB of 128.0 MB" in c.diagnostics
        assert m.shells is not None
        await async_wait_until(lambda: m.shells is not None and m.shells.ready == 1, what="the pool filled")
        assert not cg.exists()      # recovery's cleanup removed it
    finally:
        await m.shutdown()
