"""Distributed shell: the AM logic against a fake RM/NM, its CLI parsing and the submission helper."""
import asyncio
import shlex

import pytest

from appmaster.am_client import ApplicationMaster, HeartbeatPolicy
from appmaster.distributed_shell import DistributedShell, am_command, build_submission, parse_args
from appmaster.rm_client import AmIdentity
from polling import async_wait_until
from protocol.internal_api import ContainerStatus
from protocol.records import FinalStatus, Resource

FAST = HeartbeatPolicy(interval_s=0.02, pending_interval_s=0.01)


def shell_for(fake, n=2, cmd=("echo", "hello world")) -> DistributedShell:
    am = ApplicationMaster(AmIdentity.from_env(fake.env), policy=FAST)
    return DistributedShell(am, n, Resource(128, 1), list(cmd), {"X": "1"})


async def run_with_exits(fake, shell, exits: list[tuple[int, str]]):
    task = asyncio.create_task(shell.run())
    try:
        await async_wait_until(lambda: len(fake.nm.started) == len(exits) or task.done())
        assert not task.done(), task.result()
        cids = sorted(fake.nm.started)
        fake.rm.completed = [ContainerStatus(container_id=c, state="COMPLETE", exit_status=code, diagnostics=d)
                             for c, (code, d) in zip(cids, exits)]
        return await asyncio.wait_for(task, 10), cids
    finally:
        await shell.am.close()


async def test_all_zero_succeeds(fake_cluster):
    shell = shell_for(fake_cluster)
    result, cids = await run_with_exits(fake_cluster, shell, [(0, ""), (0, "")])
    assert result.final_status is FinalStatus.SUCCEEDED
    assert fake_cluster.rm.finished.final_status == "SUCCEEDED"
    started = fake_cluster.nm.started[cids[0]].launch_context
    assert started.commands == ["echo 'hello world'"] and started.environment == {"X": "1"}
    assert fake_cluster.rm.requests[0].asks[0].count == 2


async def test_failures_are_named_in_diagnostics(fake_cluster):
    shell = shell_for(fake_cluster, n=3)
    result, cids = await run_with_exits(fake_cluster, shell, [(0, ""), (-104, "over limit"), (-100, "lost")])
    assert result.final_status is FinalStatus.FAILED
    diag = fake_cluster.rm.finished.diagnostics
    assert f"{cids[1]} exited with -104 (KILLED_EXCEEDED_PMEM)" in diag
    assert f"{cids[2]} exited with -100 (ABORTED)" in diag
    assert cids[0] not in diag
    assert fake_cluster.rm.finished.final_status == "FAILED"


async def test_refused_launch_counts_as_failed(fake_cluster):
    fake_cluster.nm.refuse = True
    shell = shell_for(fake_cluster, n=1)
    try:
        result = await asyncio.wait_for(shell.run(), 10)
    finally:
        await shell.am.close()
    assert result.final_status is FinalStatus.FAILED and "exited with -1000 (INVALID)" in result.diagnostics


async def test_sigterm_stops_containers_without_unregistering(fake_cluster):
    shell = shell_for(fake_cluster, n=2)
    task = asyncio.create_task(shell.run())
    try:
        await async_wait_until(lambda: len(fake_cluster.nm.started) == 2)
        shell.request_stop()
        result = await asyncio.wait_for(task, 10)
    finally:
        await shell.am.close()
    assert result.final_status is None
    assert sorted(fake_cluster.nm.stopped) == sorted(fake_cluster.nm.started)
    assert fake_cluster.rm.finished is None


async def test_rm_shutdown_stops_containers(fake_cluster):
    shell = shell_for(fake_cluster, n=1)
    task = asyncio.create_task(shell.run())
    try:
        await async_wait_until(lambda: len(fake_cluster.nm.started) == 1)
        fake_cluster.rm.actions = ["SHUTDOWN"]
        result = await asyncio.wait_for(task, 10)
    finally:
        await shell.am.close()
    assert result.final_status is None and fake_cluster.nm.stopped == list(fake_cluster.nm.started)
    assert fake_cluster.rm.finished is None


def test_parse_args():
    ns = parse_args(["--num-containers", "3", "--container-memory", "64", "--container-vcores", "2",
                     "--queue", "q", "--", "python", "-c", "print(1)"])
    assert (ns.num_containers, ns.container_memory, ns.container_vcores, ns.queue) == (3, 64, 2, "q")
    assert ns.command == ["python", "-c", "print(1)"]


@pytest.mark.parametrize("argv,msg", [
    (["--num-containers", "0", "--container-memory", "64", "--", "true"], "--num-containers must be positive"),
    (["--num-containers", "1", "--container-memory", "-5", "--", "true"], "--container-memory must be positive"),
    (["--num-containers", "1", "--container-memory", "64"], "no command"),
])
def test_parse_args_errors(argv, msg, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2 and msg in capsys.readouterr().err


def test_main_outside_an_am_container_exits_2(monkeypatch, capsys):
    from appmaster import distributed_shell
    for k in ("ELASTANE_RM_ADDRESS", "ELASTANE_AM_TOKEN", "APPLICATION_ATTEMPT_ID"):
        monkeypatch.delenv(k, raising=False)
    assert distributed_shell.main(["--num-containers", "1", "--container-memory", "64", "--", "true"]) == 2
    assert "ELASTANE_RM_ADDRESS" in capsys.readouterr().err


def test_build_submission_is_yarn_shaped_and_round_trips():
    sub = build_submission("hello", ["echo", "a b; c"], 2, 256, 1, "default", am_memory=192,
                           max_app_attempts=2, app_id="application_1_0007")
    assert sub["application-id"] == "application_1_0007"
    assert sub["application-type"] == "DISTRIBUTED_SHELL" and sub["application-name"] == "hello"
    assert sub["resource"] == {"memory": 192, "vCores": 1}
    assert sub["max-app-attempts"] == 2 and sub["queue"] == "default"
    assert {"key": "PYTHONUNBUFFERED", "value": "1"} in sub["am-container-spec"]["environment"]["entry"]
    cmd = sub["am-container-spec"]["commands"]["command"]
    argv = shlex.split(cmd)                       # what bash -c hands the AM
    assert argv[:3] == ["python", "-m", "appmaster.distributed_shell"]
    ns = parse_args(argv[3:])
    assert (ns.num_containers, ns.container_memory, ns.container_vcores) == (2, 256, 1)
    assert ns.command == ["echo", "a b; c"]
    assert cmd == am_command(["echo", "a b; c"], 2, 256, 1)
    assert "application-id" not in build_submission("x", ["true"], 1, 64, 1)


@pytest.mark.parametrize("kw,msg", [({"num_containers": 0}, "num_containers"), ({"memory": -1}, "memory"),
                                    ({"cmd": []}, "cmd")])
def test_build_submission_rejects_bad_values(kw, msg):
    args = dict(name="x", cmd=["true"], num_containers=1, memory=64, vcores=1)
    args.update(kw)
    with pytest.raises(ValueError, match=msg):
        build_submission(**args)


async def _spawn_shell(fake, *args: str) -> asyncio.subprocess.Process:
    import os
    import sys
    env = dict(os.environ, **fake.env, PYTHONUNBUFFERED="1")
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "appmaster.distributed_shell", *args, env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)


async def test_process_unregisters_and_exits_0(fake_cluster):
    proc = await _spawn_shell(fake_cluster, "--num-containers", "1", "--container-memory", "64", "--", "true")
    try:
        await async_wait_until(lambda: len(fake_cluster.nm.started) == 1)
        (cid,) = fake_cluster.nm.started
        fake_cluster.rm.completed = [ContainerStatus(container_id=cid, state="COMPLETE", exit_status=0)]
        assert await asyncio.wait_for(proc.wait(), 20) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert fake_cluster.rm.finished.final_status == "SUCCEEDED"


async def test_process_stops_its_containers_on_sigterm(fake_cluster):
    import signal
    proc = await _spawn_shell(fake_cluster, "--num-containers", "2", "--container-memory", "64", "--", "sleep", "100")
    try:
        await async_wait_until(lambda: len(fake_cluster.nm.started) == 2)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 143
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert sorted(fake_cluster.nm.stopped) == sorted(fake_cluster.nm.started)
    assert fake_cluster.rm.finished is None


async def test_process_exits_1_when_the_rm_refuses_registration(fake_cluster):
    fake_cluster.env["ELASTANE_AM_TOKEN"] = "forged"
    proc = await _spawn_shell(fake_cluster, "--num-containers", "1", "--container-memory", "64", "--", "true")
    try:
        assert await asyncio.wait_for(proc.wait(), 20) == 1
        err = (await proc.stderr.read()).decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert "401" in err and fake_cluster.rm.registered is None and fake_cluster.nm.started == {}
