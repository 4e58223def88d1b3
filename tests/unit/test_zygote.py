"""The executor zygote and the NM's warm launcher: a forked container is set up exactly as the cold
wrapper sets one up (session, cgroup join first, working dir, environment, log files, exit file),
and its exit status reaches the NM.

The containers here run the stdlib's `timeit` module as their warm start: `-n 1 -r 1 CODE` runs
any statement once, so one module shows the environment, the exit codes and a kill."""
from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import AsyncIterator

import pytest

from nodemanager.warm_launcher import WarmLauncher, WarmLaunchError
from polling import async_wait_until
from protocol import zygote_wire as wire


@pytest.fixture
async def zygote(tmp_path: Path) -> AsyncIterator[WarmLauncher]:
    w = WarmLauncher(["timeit", "json"])
    await w.start()
    try:
        yield w
    finally:
        await w.close()
        assert w.pid is not None and not Path(f"/proc/{w.pid}").exists()   # the zygote is gone


def request(tmp_path: Path, code: str, name: str = "c1", **extra: object) -> wire.WarmLaunch:
    work = tmp_path / name
    work.mkdir()
    fields: dict[str, object] = dict(
        request_id=0, container_id=name, module="timeit", argv=["-n", "1", "-r", "1", code],
        env={"PATH": os.environ["PATH"], "CONTAINER_ID": name}, cwd=str(work), stdout=str(work / "stdout"),
        stderr=str(work / "stderr"), exit_file=str(work / "exit_code"))
    fields.update(extra)
    return wire.WarmLaunch(**fields)  # type: ignore[arg-type]


async def test_a_warm_container_runs_in_its_own_dir_env_and_session(zygote: WarmLauncher, tmp_path: Path) -> None:
    code = ("import os, sys; print('cwd', os.getcwd()); print('env', sorted(os.environ)); "
            "print('sid', os.getsid(0) == os.getpid(), os.getpgid(0) == os.getpid()); "
            "print('argv0', sys.argv[0]); sys.stdout.flush()")
    req = request(tmp_path, code)
    proc = await zygote.launch(req)
    assert await asyncio.wait_for(proc.wait(), 30) == 0
    out = Path(req.stdout).read_text()
    assert f"cwd {req.cwd}" in out
    assert "env ['CONTAINER_ID', 'PATH']" in out        # exactly the container's environment
    assert "sid True True" in out                       # session and process group of its own
    assert Path(req.exit_file).read_text().strip() == "0"


async def test_exit_codes_and_kills_reach_the_nm_and_the_exit_file(zygote: WarmLauncher, tmp_path: Path) -> None:
    failed = request(tmp_path, "import os; os._exit(3)", "failed")
    sleeper = request(tmp_path, "import time; time.sleep(60)", "sleeper")
    p1, p2 = await zygote.launch(failed), await zygote.launch(sleeper)
    assert await asyncio.wait_for(p1.wait(), 30) == 3
    assert Path(failed.exit_file).read_text().strip() == "3"
    # Its /proc environ is the zygote's: the process title says which container it is.
    # (the child sets it right after it reported its start: wait for it)
    title = await async_wait_until(
        lambda: (t := Path(f"/proc/{p2.pid}/cmdline").read_bytes().rstrip(b"\0").decode()).endswith(
            "CONTAINER_ID=sleeper") and t, 10, what="the sleeper's title")
    assert title.startswith("python -m timeit -n 1 -r 1 import time") and title.endswith("CONTAINER_ID=sleeper")
    os.killpg(p2.pid, signal.SIGKILL)                  # as the NM stops a container: its group
    assert await asyncio.wait_for(p2.wait(), 30) == -signal.SIGKILL
    assert Path(sleeper.exit_file).read_text().strip() == str(128 + signal.SIGKILL)
    crashed = request(tmp_path, "raise RuntimeError('boom')", "crashed")
    p3 = await zygote.launch(crashed)
    assert await asyncio.wait_for(p3.wait(), 30) == 1
    assert "RuntimeError: boom" in Path(crashed.stderr).read_text()
    # SystemExit from the module itself (json.tool's argparse on a missing file: 2).
    usage = request(tmp_path, "", "usage", module="json", argv=[str(tmp_path / "missing.json")])
    usage = wire.WarmLaunch(**{**{f: getattr(usage, f) for f in usage.__struct_fields__},
                               "module": "json.tool"})
    p4 = await zygote.launch(usage)
    assert await asyncio.wait_for(p4.wait(), 30) == 2
    assert "missing.json" in Path(usage.stderr).read_text()


async def test_the_container_joins_its_cgroups_before_it_runs(zygote: WarmLauncher, tmp_path: Path) -> None:
    procs = tmp_path / "cgroup.procs"          # a stand-in for the cgroup's procs file
    procs.write_text("")
    req = request(tmp_path, "print('ran')", cgroup_procs=[str(procs)])
    proc = await zygote.launch(req)
    assert await asyncio.wait_for(proc.wait(), 30) == 0
    assert procs.read_text() == str(proc.pid)
    # A cgroup it cannot join: the container does not run, and says why (as the cold wrapper).
    bad = request(tmp_path, "print('ran')", "bad", cgroup_procs=[str(tmp_path / "no" / "cgroup.procs")])
    proc = await zygote.launch(bad)
    assert await asyncio.wait_for(proc.wait(), 30) == wire.CGROUP_JOIN_FAILED_EXIT
    assert "cannot join cgroup" in Path(bad.stderr).read_text() and "ran" not in Path(bad.stdout).read_text()


async def test_without_a_zygote_a_launch_is_refused_for_the_cold_path(tmp_path: Path) -> None:
    w = WarmLauncher(["timeit"])
    assert not w.serves("timeit")
    with pytest.raises(WarmLaunchError, match="not running"):
        await w.launch(request(tmp_path, "pass"))
    await w.start()
    assert w.serves("timeit") and not w.serves("psruntime.executor")
    assert w.pid is not None
    os.kill(w.pid, signal.SIGKILL)              # the zygote dies: the NM sees the channel close
    await asyncio.wait_for(w.wait_channel_closed(), 30)
    assert not w.alive
    with pytest.raises(WarmLaunchError):
        await w.launch(request(tmp_path, "pass", "late"))
    await w.close()


async def test_the_zygote_says_when_its_modules_are_imported(tmp_path: Path) -> None:
    """Not ready until it has imported its preloads (node info shows it); then ready, with the time."""
    w = WarmLauncher(["timeit"])
    assert not w.ready
    await w.start()
    try:
        await async_wait_until(lambda: w.ready, timeout_s=30, what="the zygote's ready message")
        assert w.preload_s is not None and w.preload_s >= 0
        started = await w.launch(request(tmp_path, "pass"))      # and it serves
        assert await started.wait() == 0
    finally:
        await w.close()
    assert not w.ready


def test_frames_round_trip_and_refuse_garbage() -> None:
    for msg in (wire.WarmExited(pid=12, status=9), wire.WarmReady(preload_s=0.25)):
        data = wire.frame(msg)
        assert wire.body_length(data[:4]) == len(data) - 4 and wire.decode_reply(data[4:]) == msg
    with pytest.raises(wire.FrameError):
        wire.decode_reply(b"\x01\x02")
    with pytest.raises(wire.FrameError):
        wire.body_length((wire.MAX_FRAME + 1).to_bytes(4, "big"))


async def test_a_preloaded_modules_warm_entry_is_called_after_its_warm_up_not_the_module_run_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module offering `WARM_ENTRY` (psruntime.executor does) has that called in the child, with
    the container's argv and its return value as the exit code; its body ran once, in the zygote,
    and so did its `warm_up()`."""
    (tmp_path / "warm_probe.py").write_text(
        "import sys\n"
        "print('module body ran')\n"
        "warmed = []\n"
        "def warm_up():\n"
        "    warmed.append(1)\n"
        "def _entry():\n"
        "    print('entry', sys.argv[1:], 'warmed', len(warmed))\n"
        "    sys.stdout.flush()\n"
        "    return 7\n"
        "WARM_ENTRY = _entry\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    w = WarmLauncher(["warm_probe"])
    await w.start()
    try:
        req = request(tmp_path, "", "probe", module="warm_probe", argv=["a", "b"])
        proc = await w.launch(req)
        assert await asyncio.wait_for(proc.wait(), 30) == 7
        assert Path(req.stdout).read_text() == "entry ['a', 'b'] warmed 1\n"    # no second run of the body
        assert Path(req.exit_file).read_text().strip() == "7"
    finally:
        await w.close()


async def test_a_spare_joins_first_and_a_launch_naming_it_runs_there_without_another_join(
        zygote: WarmLauncher, tmp_path: Path) -> None:
    """A spare (WarmSpare) leads its own session and sits in its cgroup before any launch; the
    container then runs in that process, set up as a fresh child is (dir, environment, logs, exit
    file), and nothing writes to the cgroup again. A launch naming no waiting spare is refused."""
    procs = tmp_path / "cgroup.procs"
    procs.write_text("")
    pid, exited = await zygote.spare([str(procs)])
    assert procs.read_text() == str(pid)                        # joined before it was used
    assert os.getsid(pid) == pid and not exited.done()
    procs.write_text("")                                        # a second join would show here
    code = ("import os; print('cwd', os.getcwd()); print('env', sorted(os.environ)); "
            "print('pid', os.getpid(), os.getsid(0) == os.getpid())")
    req = request(tmp_path, code, cgroup_procs=[str(procs)], spare_pid=pid)
    proc = await zygote.launch(req)
    assert proc.pid == pid
    assert await asyncio.wait_for(proc.wait(), 30) == 0
    out = Path(req.stdout).read_text()
    assert f"cwd {req.cwd}" in out and "env ['CONTAINER_ID', 'PATH']" in out and f"pid {pid} True" in out
    assert procs.read_text() == ""
    assert Path(req.exit_file).read_text().strip() == "0"
    assert exited.done() and exited.result() == 0               # one exit: the spare's is the container's
    with pytest.raises(WarmLaunchError, match="no spare"):
        await zygote.launch(request(tmp_path, "pass", "again", spare_pid=pid))


async def test_a_spare_that_cannot_join_is_refused_and_idle_spares_end_with_the_zygote(tmp_path: Path) -> None:
    w = WarmLauncher(["timeit"])
    await w.start()
    try:
        with pytest.raises(WarmLaunchError, match="did not join"):
            await w.spare([str(tmp_path / "no" / "cgroup.procs")])
        procs = tmp_path / "cgroup.procs"
        procs.write_text("")
        pid, exited = await w.spare([str(procs)])
    finally:
        await w.close()             # waits for the zygote, which waits for its idle spare
    assert exited.done() and not Path(f"/proc/{pid}").exists()


def test_spare_requests_round_trip() -> None:
    for msg in (wire.WarmSpare(request_id=3, cgroup_procs=["/a/cgroup.procs"]),
                wire.WarmLaunch(request_id=4, container_id="c", module="m", argv=[], env={}, cwd="/",
                                stdout="o", stderr="e", exit_file="x", spare_pid=77)):
        data = wire.frame(msg)
        assert wire.decode_request(data[4:]) == msg


# Drives a Zygote in a process of its own (it forks: not from the test runner's process) through
# the race of a spare that exits before its join is read: the zygote reaps it first.
_EARLY_EXIT_DRIVER = """
import json, os, select, signal, socket, sys
from nodemanager.zygote import Zygote
from protocol import zygote_wire as wire
ours, theirs = socket.socketpair()
z = Zygote(theirs)
z._fork_spare(wire.WarmSpare(request_id=1, cgroup_procs=[sys.argv[1]]))
(ready_r, (_, pid, _)), = z._joining.items()
select.select([ready_r], [], [])            # it has joined (or given up): its answer is in the pipe
os.kill(pid, signal.SIGKILL)
os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)   # exited, not reaped
z._reap()
z._spare_joined(ready_r)
theirs.close()
data = b"".join(iter(lambda: ours.recv(1 << 16), b""))
said = []
while data:
    n = wire.body_length(data[:wire.HEADER.size])
    msg = wire.decode_reply(data[wire.HEADER.size:wire.HEADER.size + n])
    data = data[wire.HEADER.size + n:]
    said.append([type(msg).__name__, getattr(msg, "pid", None) == pid])
print(json.dumps({"said": said, "spares": list(z.spares), "held": list(z._exited_joining)}))
"""


@pytest.mark.parametrize("joins", [True, False])
def test_a_spare_reaped_before_its_join_is_read_is_reported_started_or_failed_before_its_exit(
        tmp_path: Path, joins: bool) -> None:
    """Its exit is held back until its join's answer: the NM hears WarmStarted (it joined) or
    WarmFailed (it could not) first, then WarmExited, and the zygote keeps no spare for it. Told
    the other way round, the NM kept the dead pid as an idle spare."""
    import json
    import subprocess
    import sys
    procs = tmp_path / "cgroup.procs" if joins else tmp_path / "no" / "cgroup.procs"
    if joins:
        procs.write_text("")
    out = subprocess.run([sys.executable, "-c", _EARLY_EXIT_DRIVER, str(procs)], capture_output=True, text=True,
                         timeout=60, cwd=Path(__file__).resolve().parents[2], check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    first = "WarmStarted" if joins else "WarmFailed"
    assert got["said"] == [[first, joins], ["WarmExited", True]]
    assert got["spares"] == [] and got["held"] == []


async def test_a_container_the_zygote_starts_after_its_request_was_given_up_is_killed(
        zygote: WarmLauncher, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The NM gives up on a warm start that does not come in time and starts the container cold; if
    the zygote's child comes after all, it would be a second copy of that container: it is killed."""
    import nodemanager.warm_launcher as warm   # noqa: PLC0415
    monkeypatch.setattr(warm, "START_TIMEOUT_S", 0.0)
    monkeypatch.setattr(warm, "LAUNCH_TIMEOUT_S", 0.0)
    late = request(tmp_path, "import time; time.sleep(60)", "late")
    with pytest.raises(WarmLaunchError, match="did not start"):
        await zygote.launch(late)
    exit_file = Path(late.exit_file)
    await async_wait_until(lambda: exit_file.exists() and exit_file.read_text().strip(), 30,
                           what="the late child's exit")
    assert exit_file.read_text().strip() == str(128 + signal.SIGKILL)


async def test_a_container_whose_zygote_died_first_ends_aborted_not_with_a_made_up_exit_code(
        zygote: WarmLauncher, tmp_path: Path) -> None:
    """The zygote reaps its children and writes their exit files: once it is gone, a child that
    then exits (here with 0) leaves no code anywhere. The container ends ABORTED, "no exit code",
    as recovery reports the same case -- not 1, a failure the container never had."""
    from nodemanager.container_state import NMContainerState as St  # noqa: PLC0415
    from nodemanager.warm_launcher import _returncode_from_exit_file  # noqa: PLC0415
    from protocol.internal_api import LaunchContext, WarmStart  # noqa: PLC0415
    from protocol.records import ExitStatus, Resource  # noqa: PLC0415
    from test_container_shell_pool import claims, manager  # noqa: PLC0415

    assert _returncode_from_exit_file(str(tmp_path / "no-such-exit-file")) is None
    m = manager(tmp_path, None, None)
    m.warm = zygote
    go = tmp_path / "go"
    ctx = LaunchContext(commands=["false"], warm_start=WarmStart(module="timeit", argv=[
        "-n", "1", "-r", "1", "import os, time", f"while not os.path.exists({str(go)!r}): time.sleep(0.01)"]))
    c = await m.start(claims(), Resource(128, 1), ctx)
    try:
        assert c.launch_path == "zygote" and c.state is St.RUNNING
        assert zygote.pid is not None
        os.kill(zygote.pid, signal.SIGKILL)
        await zygote.wait_channel_closed()
        go.write_text("")       # the orphaned container exits 0
        await async_wait_until(lambda: c.exited.is_set(), what="the container's exit")
        assert c.exit_status == ExitStatus.ABORTED, c.diagnostics
        assert "zygote died" in c.diagnostics and "no exit code" in c.diagnostics
        assert not Path(c.exit_file).exists()
    finally:
        go.write_text("")
        await m.shutdown()
