"""Harmony's co-location resource model at the NM: a container asked for with `cpu_weighted` gets
CPU by weight only (no quota) and a hard memory limit, whatever the NM's cpu_enforcement; the
Harmony environment (arbiter socket) reaches only the containers of Harmony jobs."""
from __future__ import annotations

import os
import uuid
from pathlib import Path

import msgspec
import pytest

from appmaster.ps.runtime.executor_pool import ExecutorPool, ExecutorRecord, Role
from nodemanager.cgroup_detect import CgroupVersion, detect
from nodemanager.cgroup_v1 import CgroupV1
from nodemanager.cgroup_v2 import CgroupV2
from protocol.ps_job_spec import PSJobSpec
from nodemanager.launcher import LaunchSpec, build_env
from protocol import container_env as cenv
from protocol.internal_api import LaunchContext, StartContainerRequest
from psruntime.harmony_runner import harmony_enabled


def fake_v2(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    (root / "cgroup.subtree_control").write_text("")
    return root


def real_v1() -> tuple[str, str] | None:
    if os.geteuid() != 0:
        return None
    lay = detect(Path("/proc/mounts").read_text(), "v1")
    return (lay.v1_mounts["cpu"], lay.v1_mounts["memory"]) if lay.version is CgroupVersion.V1 else None


REAL_V1 = real_v1()


@pytest.mark.skipif(REAL_V1 is None, reason="needs root and cgroup v1 cpu + memory hierarchies")
@pytest.mark.cgroups
def test_v1_weighted_container_has_shares_no_quota_and_a_hard_memory_limit_in_hard_mode() -> None:
    assert REAL_V1 is not None
    cpu_m, mem_m = REAL_V1
    name = f"elastane-test-{uuid.uuid4().hex[:8]}"
    b = CgroupV1(cpu_m, mem_m, name, "node_1", cpu_period_us=50000, hard_cpu=True)
    try:
        b.setup()
        capped = b.create("container_1_0001_01_000001", memory_mb=96, vcores=2)
        weighted = b.create("container_1_0002_01_000001", memory_mb=80, vcores=3, cpu_weighted=True)
        assert b.cpu_quota(capped) == (100000, 50000)
        cpu_dir, mem_dir = map(Path, weighted.dirs)
        assert int((cpu_dir / "cpu.cfs_quota_us").read_text()) == -1       # no cap: the whole node
        assert (cpu_dir / "cpu.shares").read_text().strip() == "3072"
        assert int((mem_dir / "memory.limit_in_bytes").read_text()) == 80 * 1024 * 1024
        assert b.try_remove(capped) and b.try_remove(weighted)
    finally:
        b.teardown()
    assert not Path(cpu_m, name).exists() and not Path(mem_m, name).exists()


def test_v2_weighted_container_in_hard_mode_gets_weight_and_memory_max(tmp_path) -> None:
    root = fake_v2(tmp_path / "cg")
    b = CgroupV2(str(root), "elastane", "n1", hard_cpu=True)
    b.setup()
    b.create("c1", 64, 2)
    b.create("c2", 128, 3, cpu_weighted=True)
    node = root / "elastane" / "n1"
    assert (node / "c1" / "cpu.max").exists() and not (node / "c1" / "cpu.weight").exists()
    assert (node / "c2" / "cpu.weight").read_text() == "300" and not (node / "c2" / "cpu.max").exists()
    assert (node / "c2" / "memory.max").read_text() == str(128 * 1024 * 1024)


def test_cpu_weighted_is_an_additive_launch_context_field() -> None:
    old = b'{"container_token": "t", "launch_context": {"commands": ["true"]}}'
    req = msgspec.json.decode(old, type=StartContainerRequest)
    assert req.launch_context.cpu_weighted is False
    new = msgspec.json.encode(StartContainerRequest("t", LaunchContext(["true"], cpu_weighted=True)))
    assert msgspec.json.decode(new, type=StartContainerRequest).launch_context.cpu_weighted is True


def spec(arbiter_socket: str) -> LaunchSpec:
    return LaunchSpec("container_1_0001_01_000002", "application_1_0001", "", "u", 128, 1, "/w", "/l",
                      "/e", "127.0.0.1", 8042, arbiter_socket=arbiter_socket)


def test_arbiter_socket_reaches_only_harmony_containers() -> None:
    harmony = LaunchContext(["true"], environment={cenv.HARMONY: "1"})
    plain = LaunchContext(["true"])
    env = build_env(spec("/run/arb.sock"), harmony)
    assert env[cenv.ARBITER_SOCKET] == "/run/arb.sock" and harmony_enabled(env)
    env = build_env(spec("/run/arb.sock"), plain)
    assert cenv.ARBITER_SOCKET not in env and not harmony_enabled(env)
    # An NM without an arbiter says nothing, so even a Harmony job's executor runs unarbitrated.
    assert not harmony_enabled(build_env(spec(""), harmony))


class _Container:
    container_id = "container_1_0001_01_000002"
    node_id = "n1"


def test_the_am_asks_for_harmony_only_while_its_directive_has_a_group() -> None:
    pool = ExecutorPool(8, am_address="127.0.0.1:1")
    rec = ExecutorRecord("worker-0", Role.WORKER, _Container())  # type: ignore[arg-type]
    ctx = pool.launch_context(rec)
    assert cenv.HARMONY not in ctx.environment and not ctx.cpu_weighted
    pool.harmony_group = "g0"
    ctx = pool.launch_context(rec)
    assert ctx.environment[cenv.HARMONY] == "1" and ctx.cpu_weighted


def test_a_job_with_use_arbiter_takes_slots_without_a_group_but_keeps_its_cpu_share() -> None:
    # Fig. 4.12's "subtasks only": the arbiter's interleaving without Harmony's grouping.
    pool = ExecutorPool(8, am_address="127.0.0.1:1", use_arbiter=True)
    rec = ExecutorRecord("worker-0", Role.WORKER, _Container())  # type: ignore[arg-type]
    ctx = pool.launch_context(rec)
    assert ctx.environment[cenv.HARMONY] == "1" and not ctx.cpu_weighted


def test_use_arbiter_is_a_checked_job_spec_field() -> None:
    assert msgspec.convert({"app": "mlr"}, PSJobSpec).use_arbiter is False
    assert msgspec.convert({"app": "mlr", "use_arbiter": True}, PSJobSpec).use_arbiter is True
    with pytest.raises(msgspec.ValidationError, match="use_arbiter"):
        msgspec.convert({"app": "mlr", "use_arbiter": "yes"}, PSJobSpec)
