"""Unit tests of the NM's smaller parts: /proc parsing, RSS monitor, launcher, settings, recovery,
token checks of the container API (in process), reporting and expiry with an injected clock."""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from protocol import config, internal_api as api, tokens
from protocol.config import ClusterConfig, ConfigError, NMConfig
from protocol.local_resources import LocalResource
from protocol.records import ExitStatus, Resource
from protocol.remote_exception import BadRequest, Conflict

from nodemanager import launcher, node_settings, procfs
from nodemanager.container import Container
from nodemanager.container_manager import ContainerManager
from nodemanager.container_state import ContainerEvent as E, NMContainerState as S
from nodemanager.enforcement import Enforcement
from nodemanager.log_aggregation_service import regular_files
from nodemanager.recovery_store import RecoveryStore
from nodemanager.rss_monitor import Watched, find_overruns
from nodemanager.web_api import NodeWebApi
from polling import async_wait_until
from nm_harness import REPO, SECRET, container_token, new_ids

MB = 1024 * 1024


def stat_line(pid: int, comm: str, ppid: int, sid: int, rss_pages: int, start: int = 100) -> str:
    fields = ["S", str(ppid), str(pid), str(sid)] + ["0"] * 7 + ["5", "6"] + ["0"] * 6 + [str(start), "0",
                                                                                       str(rss_pages)]
    return f"{pid} ({comm}) " + " ".join(fields)


def test_parse_stat_handles_odd_command_names():
    st = procfs.parse_stat(stat_line(42, "we ird) (name", ppid=1, sid=42, rss_pages=10, start=777))
    assert (st.pid, st.ppid, st.sid, st.utime, st.stime, st.start_time, st.rss_pages) == (42, 1, 42, 5, 6, 777, 10)


def test_own_process_is_recognised_by_start_time():
    me = procfs.read_stat(os.getpid())
    assert me is not None and procfs.is_same_process(os.getpid(), me.start_time)
    assert not procfs.is_same_process(os.getpid(), me.start_time + 1)
    assert procfs.read_stat(2 ** 22 + 12345) is None


def test_rss_monitor_sums_the_tree_and_flags_only_overruns():
    pages_per_mb = MB // procfs.PAGE_SIZE
    stats = [procfs.parse_stat(s) for s in (
        stat_line(100, "bash", 1, 100, 1 * pages_per_mb),
        stat_line(101, "python", 100, 100, 40 * pages_per_mb),
        stat_line(102, "escaped", 101, 102, 30 * pages_per_mb),   # setsid'd child: still in the tree
        stat_line(200, "other", 1, 200, 500 * pages_per_mb),
    )]
    assert procfs.tree_pids(100, stats) == {100, 101, 102}
    out = find_overruns([Watched("c1", 100, 64), Watched("c2", 200, 1024), Watched("c3", 100, 0)], stats)
    assert [(o.container_id, o.rss_bytes // MB) for o in out] == [("c1", 71)]
    assert "Container [pid=100,containerID=c1] is running beyond physical memory limits" in out[0].diagnostics()
    assert "71.0 MB of 64.0 MB" in out[0].diagnostics()


def _spec(tmp_path: Path, join: tuple[str, ...] = ()) -> launcher.LaunchSpec:
    return launcher.LaunchSpec("container_1_0001_01_000001", "application_1_0001", "appattempt_1_0001_000001",
                               "alice", 128, 1, str(tmp_path / "work"), str(tmp_path / "logs"),
                               str(tmp_path / "exit"), "127.0.0.1", 8042, join)


def test_launch_env_and_command(tmp_path):
    spec = _spec(tmp_path)
    ctx = api.LaunchContext(commands=["echo a", "cat <LOG_DIR>/x"],
                            environment={"FOO": "<LOG_DIR>/f", "CONTAINER_ID": "spoofed", "PATH": "/opt/bin"})
    env = launcher.build_env(spec, ctx)
    assert env["CONTAINER_ID"] == spec.container_id  # the NM's names win over the launch context
    assert env["FOO"] == f"{spec.log_dir}/f"
    assert env["PATH"].split(os.pathsep)[:2] == [os.path.dirname(sys.executable), "/opt/bin"]
    assert env["NM_HTTP_ADDRESS"] == "127.0.0.1:8042" and env["CONTAINER_MEMORY_MB"] == "128"
    assert launcher.build_command(spec, ctx) == f"echo a && cat {spec.log_dir}/x"


def test_wrapper_joins_cgroups_first_and_records_the_exit_code(tmp_path):
    procs = tmp_path / "cgroup.procs"
    spec = _spec(tmp_path, (str(procs),))
    script = launcher.wrapper_script(spec, "echo out; exit 3")
    lines = script.splitlines()
    assert lines[2].startswith("echo $$ >") and "cgroup.procs" in lines[2]
    path = tmp_path / "w.sh"
    path.write_text(script)
    r = subprocess.run(["/bin/bash", str(path)], capture_output=True, text=True)
    assert r.returncode == 3 and r.stdout == "out\n"
    assert procs.read_text().strip().isdigit()
    assert Path(spec.exit_file).read_text().strip() == "3"
    bad = launcher.wrapper_script(_spec(tmp_path, (str(tmp_path / "missing" / "cgroup.procs"),)), "echo never")
    path.write_text(bad)
    r = subprocess.run(["/bin/bash", str(path)], capture_output=True, text=True)
    assert r.returncode == launcher.JOIN_FAILED_EXIT and "never" not in r.stdout and "cannot join" in r.stderr


def test_exit_codes_map_signals_like_a_shell():
    assert launcher.exit_code_from_returncode(0) == 0
    assert launcher.exit_code_from_returncode(7) == 7
    assert launcher.exit_code_from_returncode(-9) == 137
    assert launcher.exit_code_from_returncode(-15) == 143


def test_settings_capacity_host_and_validation(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:        8388608 kB\nMemFree: 1 kB\n")
    cfg = NMConfig(reserved_memory_mb=1024)
    assert node_settings.capability(cfg, str(meminfo)) == Resource(8192 - 1024, os.cpu_count() or 1)
    assert node_settings.capability(NMConfig(memory_mb=300, vcores=3), str(meminfo)) == Resource(300, 3)
    rm = "http://127.0.0.1:8088"
    assert node_settings.advertise_host(NMConfig(host="0.0.0.0"), rm) == "127.0.0.1"
    assert node_settings.advertise_host(NMConfig(host="0.0.0.0", advertise_host="nm7"), rm) == "nm7"
    assert node_settings.rm_address(NMConfig(), ClusterConfig(rm_address="rm:8088")) == "http://rm:8088"
    assert node_settings.rm_address(NMConfig(rm_address="http://x:1/"), ClusterConfig()) == "http://x:1"
    good = ClusterConfig(secret="s")
    node_settings.validate(NMConfig(), good)
    for bad, field in ((NMConfig(cgroups="v3"), "cgroups"), (NMConfig(port=70000), "port"),
                       (NMConfig(memory_mb=-1), "memory_mb"), (NMConfig(cpu_enforcement="x"), "cpu_enforcement"),
                       (NMConfig(heartbeat_interval_ms=0), "heartbeat_interval_ms"),
                       (NMConfig(cpu_limit_cores=-1), "cpu_limit_cores"),
                       (NMConfig(cpu_limit_cores=(os.cpu_count() or 1) + 1), "cpu_limit_cores"),
                       (NMConfig(cpu_period_us=999), "cpu_period_us"),
                       # 0.25 core over 4 vcores is 625 us per 10 ms: the kernel would make it 1 ms
                       (NMConfig(cpu_limit_cores=0.25, vcores=4, cpu_period_us=10000), "cpu_period_us")):
        with pytest.raises(ConfigError, match=field):
            node_settings.validate(bad, good)
    node_settings.validate(NMConfig(cpu_limit_cores=0.25, vcores=4, cpu_period_us=20000), good)
    with pytest.raises(ConfigError, match="secret"):
        node_settings.validate(NMConfig(), ClusterConfig())
    assert node_settings.cores_per_vcore(NMConfig(), Resource(1024, 4)) == 1.0
    assert node_settings.cores_per_vcore(NMConfig(cpu_limit_cores=1.0), Resource(1024, 4)) == 0.25


@pytest.mark.parametrize("key,value", [("cpu_limit_cores", "nan"), ("cpu_limit_cores", "inf"),
                                       ("localizer_fetch_timeout_s", "nan"), ("localizer_fetch_timeout_s", "inf"),
                                       ("localizer_fetch_timeout_s", "-inf")])
def test_a_nan_or_infinite_float_setting_is_a_config_error_naming_it(tmp_path, key: str, value: str) -> None:
    # NaN compares False to everything: `x <= 0` let it through, and it broke every hard-mode
    # launch (cpu_limit_cores) or timed out every fetch at once (localizer_fetch_timeout_s).
    path = tmp_path / "nm.toml"
    path.write_text(f"[nm]\n{key} = {value}\n")
    cfg = config.load_nm(str(path), hostname="none")
    with pytest.raises(ConfigError, match=f"{key} must be a number"):
        node_settings.validate(cfg, ClusterConfig(secret="s"))


def test_cli_rejects_bad_flags_and_config_with_exit_2(tmp_path):
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "nodemanager", *args], cwd=REPO, capture_output=True,
                              text=True, timeout=60)
    r = run("--cgroups", "v9")
    assert r.returncode == 2 and "--cgroups" in r.stderr
    bad = tmp_path / "nm.toml"
    bad.write_text("[nm]\nno_such_key = 1\n")
    r = run("--config", str(bad))
    assert r.returncode == 2 and "no_such_key" in r.stderr
    empty = tmp_path / "cluster.toml"
    empty.write_text("[cluster]\n")
    r = run("--cluster-config", str(empty), "--port", "0")
    assert r.returncode == 2 and "secret" in r.stderr
    good = tmp_path / "good.toml"
    good.write_text(f'[cluster]\nsecret = "{SECRET}"\n')
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        r = run("--cluster-config", str(good), "--host", "127.0.0.1", "--port", str(busy.getsockname()[1]),
                "--local-dir", str(tmp_path / "l"), "--log-dir", str(tmp_path / "g"),
                "--recovery-dir", str(tmp_path / "r"))
    assert r.returncode == 2 and "in use" in r.stderr


def _manager(tmp_path: Path, clock) -> ContainerManager:
    cfg = NMConfig(local_dir=str(tmp_path / "local"), log_dir=str(tmp_path / "logs"),
                   recovery_dir=str(tmp_path / "rec"), keep_finished_logs_s=60.0)
    return ContainerManager(cfg, "127.0.0.1:1", "127.0.0.1", 1, Resource(1024, 2), Enforcement(None),
                            RecoveryStore(cfg.recovery_dir), clock=clock)


def _finished(m: ContainerManager, cid: str, app: str, at: float, code: int = 0) -> Container:
    c = Container(cid, app, "", "alice", Resource(128, 1), 0.0, os.path.join(m.cfg.local_dir, app, cid),
                  os.path.join(m.cfg.log_dir, app, cid), m.store.exit_file(cid))
    for e in (E.LOCALIZED, E.LAUNCHED, E.EXITED_SUCCESS if code == 0 else E.EXITED_FAILURE, E.CLEANED_UP):
        c.apply(e)
    c.exit_status, c.finished_at = code, at
    os.makedirs(c.log_dir)
    Path(c.log_dir, "stdout").write_text("x")
    m.containers[cid] = c
    m.store.save(c.to_record())
    return c


def test_completed_are_reported_until_acknowledged_then_expire(tmp_path):
    now = [1000.0]
    m = _manager(tmp_path, lambda: now[0])
    app, _, cid = new_ids()
    c = _finished(m, cid, app, at=1000.0, code=3)
    assert [s.container_id for s in m.statuses()] == [cid] and m.statuses()[0].state == "COMPLETE"
    assert m.expire_finished(5000.0) == []      # not yet seen by the RM: kept whatever its age
    m.mark_reported([cid])
    assert m.statuses() == [] and not m.store.exists(cid)
    assert m.expire_finished(1030.0) == []      # within keep_finished_logs_s
    assert Path(c.log_dir).exists()
    assert m.expire_finished(1061.0) == [cid]
    assert cid not in m.containers and not Path(c.log_dir).exists()
    assert m.used() == Resource(0, 0)


async def test_recovery_settles_dead_containers(tmp_path):
    m = _manager(tmp_path, lambda: 50.0)
    app, _, cid = new_ids()
    app2, _, cid2 = new_ids()
    for i, (a, c_id) in enumerate(((app, cid), (app2, cid2))):
        c = Container(c_id, a, "", "bob", Resource(64, 1), 0.0, str(tmp_path / f"w{i}"), str(tmp_path / f"l{i}"),
                      m.store.exit_file(c_id), pid=2 ** 22 + 999, start_time=1)
        m.store.save(c.to_record())
    Path(m.store.exit_file(cid)).write_text("9\n")   # the wrapper wrote an exit code; cid2 left none
    m2 = _manager(tmp_path, lambda: 60.0)
    found = {c.container_id: c for c in await m2.recover()}
    assert found[cid].state is S.DONE and found[cid].exit_status == 9
    assert found[cid2].exit_status == ExitStatus.ABORTED
    assert {s.container_id: s.state for s in m2.statuses()} == {cid: "COMPLETE", cid2: "COMPLETE"}
    # After the RM saw them, nothing is left to recover.
    m2.mark_reported([cid, cid2])
    assert RecoveryStore(m2.cfg.recovery_dir).load_all() == []


async def test_recovery_kills_a_dead_containers_stragglers_but_not_a_group_its_pid_now_leads(tmp_path):
    """Records can be hours old: a recorded pid that now names another process leads someone
    else's group, which the NM leaves alone; processes of the recorded group that carry the
    container's id are its stragglers, and go."""
    child = "import time; time.sleep(60)"
    spawn_child = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}])"
    foreign = subprocess.Popen([sys.executable, "-c", spawn_child + "; time.sleep(60)"], start_new_session=True)
    app, _, cid = new_ids()
    app2, _, cid2 = new_ids()
    gone = subprocess.Popen([sys.executable, "-c", spawn_child], start_new_session=True,
                            env=dict(os.environ, CONTAINER_ID=cid2))      # its leader exits, its child stays
    gone_ticks = procfs.read_stat(gone.pid).start_time
    gone.wait(timeout=10)
    try:
        await async_wait_until(lambda: len([s for s in procfs.all_stats() if s.pgid == foreign.pid]) == 2
                               and len([s for s in procfs.all_stats() if s.pgid == gone.pid]) == 1,
                               what="the foreign session's child, the dead container's straggler")
        foreign_group = sorted(s.pid for s in procfs.all_stats() if s.pgid == foreign.pid)
        m = _manager(tmp_path, lambda: 50.0)
        ticks = procfs.read_stat(foreign.pid).start_time
        for i, (a, c_id, pid, start) in enumerate(((app, cid, foreign.pid, ticks + 1), (app2, cid2, gone.pid, gone_ticks))):
            c = Container(c_id, a, "", "bob", Resource(64, 1), 0.0, str(tmp_path / f"w{i}"), str(tmp_path / f"l{i}"),
                          m.store.exit_file(c_id), pid=pid, pgid=pid, start_time=start)
            m.store.save(c.to_record())
        found = {c.container_id: c for c in await _manager(tmp_path, lambda: 60.0).recover()}
        assert found[cid].state is S.DONE and found[cid2].state is S.DONE
        await async_wait_until(lambda: not [s for s in procfs.all_stats() if s.pgid == gone.pid and s.state != "Z"],
                               what="the straggler killed")
        assert foreign.poll() is None
        assert sorted(s.pid for s in procfs.all_stats() if s.pgid == foreign.pid) == foreign_group
    finally:
        for st in procfs.all_stats():
            if st.pgid in (foreign.pid, gone.pid):
                os.kill(st.pid, signal.SIGKILL)
        foreign.wait()


def _open_fds_on(path: Path) -> int:
    return sum(1 for fd in os.listdir("/proc/self/fd")
               if os.path.realpath(f"/proc/self/fd/{fd}") == os.path.realpath(path))


async def test_shutdown_closes_the_recovery_journal_and_keeps_its_records(tmp_path):
    m = _manager(tmp_path, lambda: 0.0)
    app, _, cid = new_ids()
    _finished(m, cid, app, at=0.0)
    journal = Path(m.cfg.recovery_dir, "containers", "containers.jsonl")
    assert _open_fds_on(journal) == 1
    await m.shutdown()
    assert _open_fds_on(journal) == 0            # an NM stopped in process leaks no descriptor
    assert [r["container_id"] for r in RecoveryStore(m.cfg.recovery_dir).load_all()] == [cid]


async def test_container_api_token_checks_in_process(tmp_path):
    m = _manager(tmp_path, lambda: 0.0)
    web = NodeWebApi(m, SECRET, "127.0.0.1:1", lambda: "http://127.0.0.1:1", lambda: {"id": "127.0.0.1:1"})
    app, attempt, cid = new_ids()
    async with TestClient(TestServer(web.app())) as cl:
        body = {"container_token": container_token("127.0.0.1:1", cid, app, attempt), "launch_context":
                {"commands": ["true"]}}
        forged = container_token("127.0.0.1:1", cid, app, attempt, secret="x")
        r = await cl.post(api.CONTAINER_START, json=body, headers=tokens.bearer(forged))
        assert r.status == 401 and "signature" in (await r.json())["RemoteException"]["message"]
        r = await cl.post(api.CONTAINER_START, json=dict(body, container_token=forged))
        assert r.status == 401
        am_tok = tokens.sign(SECRET, tokens.AM, {"app_id": app}, 60)
        r = await cl.post(api.CONTAINER_START, json=dict(body, container_token=am_tok))
        assert r.status == 401 and "container" in (await r.json())["RemoteException"]["message"]
        r = await cl.get(api.container_status_path(cid))
        assert r.status == 401
        r = await cl.get(api.container_status_path(cid), headers=tokens.bearer(body["container_token"]))
        assert r.status == 404
        r = await cl.get("/ws/v1/node/containerlogs/nope/stdout")
        assert r.status == 404 and "RemoteException" in await r.json()
        r = await cl.get("/ws/v1/node/info")
        assert (await r.json())["nodeInfo"]["id"] == "127.0.0.1:1"
    assert m.containers == {}


async def test_no_container_of_an_app_that_is_over_starts(tmp_path):
    """Once the RM says an app is over here, a start still on its way for it (a late AM launch, an
    executor its AM asked for last) is refused: started, it would outlive the app's cleanup."""
    m = _manager(tmp_path, lambda: 1.0)
    app, attempt, cid = new_ids()
    other_app, _, other_cid = new_ids()
    await m.stop_app(app)
    claims = tokens.verify(SECRET, container_token("127.0.0.1:1", cid, app, attempt, memory=256), tokens.CONTAINER)
    with pytest.raises(Conflict, match=f"application {app} is over on this node"):
        await m.start(claims, Resource(256, 1), api.LaunchContext(commands=["true"]))
    assert m.containers == {} and m.used() == Resource(0, 0) and app in m.finished_apps
    assert other_app not in m.finished_apps and other_cid not in m.containers


async def test_an_environment_no_process_can_have_is_refused_and_reserves_nothing(tmp_path):
    m = _manager(tmp_path, lambda: 1.0)
    app, attempt, cid = new_ids()
    claims = tokens.verify(SECRET, container_token("127.0.0.1:1", cid, app, attempt, memory=256), tokens.CONTAINER)
    for env, needle in [({"A=B": "x"}, "key 'A=B' must not contain '=' or NUL"),
                        ({"C": "x\0y"}, "the value of 'C' must not contain NUL")]:
        with pytest.raises(BadRequest, match=f"launch_context.environment: {needle}"):
            await m.start(claims, Resource(256, 1), api.LaunchContext(commands=["true"], environment=env))
    assert m.containers == {} and m.used() == Resource(0, 0)


async def test_a_log_file_that_expires_while_it_is_read_is_a_404_not_a_500(tmp_path, monkeypatch):
    """The janitor may delete a finished container's log dir between the handler's check and its
    read in a thread: the answer is the one for a file that is not there (here, with no
    aggregated logs, 404), not an unhandled FileNotFoundError."""
    import nodemanager.web_api as web_api   # noqa: PLC0415
    m = _manager(tmp_path, lambda: 0.0)
    app, _, cid = new_ids()
    c = _finished(m, cid, app, at=0.0)
    Path(c.log_dir, "stdout").write_text("hello")
    real = web_api._read_from

    def expired_meanwhile(path: str, start: int) -> bytes:
        os.unlink(path)
        return real(path, start)
    monkeypatch.setattr(web_api, "_read_from", expired_meanwhile)
    web = NodeWebApi(m, SECRET, "127.0.0.1:1", lambda: "http://127.0.0.1:1", lambda: {"id": "127.0.0.1:1"})
    async with TestClient(TestServer(web.app())) as cl:
        r = await cl.get(f"/ws/v1/node/containerlogs/{cid}/stdout")
        assert r.status == 404 and "not found" in (await r.json())["RemoteException"]["message"]


async def test_log_reads_take_any_offset_and_the_arbiter_view_refuses_a_negative_limit(tmp_path):
    m = _manager(tmp_path, lambda: 0.0)
    app, _, cid = new_ids()
    c = _finished(m, cid, app, at=0.0)
    Path(c.log_dir, "stdout").write_text("hello")
    web = NodeWebApi(m, SECRET, "127.0.0.1:1", lambda: "http://127.0.0.1:1", lambda: {"id": "127.0.0.1:1"},
                     arbiter_view=lambda limit: {"grantLog": [], "limit": limit})
    async with TestClient(TestServer(web.app())) as cl:
        for start, body in [("2", "llo"), ("-3", "llo"), ("5", ""), (str(10 ** 20), ""), (str(-10 ** 20), "hello")]:
            r = await cl.get(f"/ws/v1/node/containerlogs/{cid}/stdout", params={"start": start})
            assert (r.status, await r.text()) == (200, body), start
        # A link the container put in its log dir is neither listed nor served (nor aggregated).
        secret = tmp_path / "node-secret"
        secret.write_text("not the container's")
        Path(c.log_dir, "x").symlink_to(secret)
        r = await cl.get(f"/ws/v1/node/containerlogs/{cid}/x")
        assert r.status == 404 and "not the container's" not in await r.text()
        assert [n for n, _ in regular_files(c.log_dir)] == ["stdout"]
        # The log page links each file as one path segment, whatever its name.
        Path(c.log_dir, "a?b#c").write_text("odd")
        page = await (await cl.get(f"/node/containerlogs/{cid}/alice")).text()
        assert f'href="/ws/v1/node/containerlogs/{cid}/a%3Fb%23c"' in page
        r = await cl.get(f"/ws/v1/node/containerlogs/{cid}/a%3Fb%23c")
        assert (r.status, await r.text()) == (200, "odd")
        r = await cl.get("/ws/v1/node/arbiter", params={"limit": "-5"})
        assert r.status == 400 and "limit must be >= 0, got -5" in (await r.json())["RemoteException"]["message"]
        r = await cl.get("/ws/v1/node/arbiter", params={"limit": "0"})
        assert r.status == 200 and (await r.json())["arbiter"]["limit"] == 0


async def test_under_token_auth_a_containers_logs_are_its_owners_and_the_admins(tmp_path):
    m = _manager(tmp_path, lambda: 0.0)
    app, _, cid = new_ids()
    _finished(m, cid, app, at=0.0)                      # alice's container, its stdout "x"
    cluster = ClusterConfig(secret=SECRET, client_auth="token", admins=["root"],
                            client_tokens={"t-alice": "alice", "t-bob": "bob", "t-root": "root"})
    web = NodeWebApi(m, SECRET, "127.0.0.1:1", lambda: "http://127.0.0.1:1", lambda: {"id": "127.0.0.1:1"},
                     cluster=cluster)
    async with TestClient(TestServer(web.app())) as cl:
        for path in (f"/ws/v1/node/containerlogs/{cid}/stdout", f"/ws/v1/node/containerlogs/{cid}",
                     f"/node/containerlogs/{cid}/alice"):
            for token, status in ((None, 401), ("t-bob", 403), ("t-alice", 200), ("t-root", 200)):
                r = await cl.get(path, headers={"Authorization": f"Bearer {token}"} if token else {})
                assert r.status == status, (path, token, await r.text())


async def test_failed_launch_is_reported_and_releases_capacity(tmp_path):
    m = _manager(tmp_path, lambda: 1.0)
    (tmp_path / "local").write_text("a file where the local dir should be")
    app, attempt, cid = new_ids()
    claims = tokens.verify(SECRET, container_token("127.0.0.1:1", cid, app, attempt, memory=256), tokens.CONTAINER)
    c = await m.start(claims, Resource(256, 1), api.LaunchContext(commands=["true"]))
    assert c.status().state == "COMPLETE" and c.exit_status == ExitStatus.INVALID
    assert "container launch failed" in c.diagnostics
    await async_wait_until(lambda: c.state is S.DONE, what="cleanup")
    assert m.used() == Resource(0, 0) and [s.container_id for s in m.statuses()] == [cid]



async def test_a_stop_while_a_container_waits_for_its_resources_ends_it_at_once_with_the_stops_status(
        tmp_path, monkeypatch):
    """The stop does not wait for the fetch (up to localizer_fetch_timeout_s): the container ends
    with the stop's status and frees its capacity at once, and a fetch nobody else waits for is
    given up -- not reported later as a launch failure when it fails."""
    from nodemanager import localizer as L   # noqa: PLC0415
    gate, gave_up = threading.Event(), threading.Event()

    def slow_source(res, target, cancel=None):
        while not gate.wait(0.01):
            if cancel is not None and cancel.is_set():
                gave_up.set()
                raise L._Cancelled()
        raise OSError("source went away")
    monkeypatch.setattr(L, "fetch", slow_source)
    m = _manager(tmp_path, lambda: 1.0)
    (tmp_path / "f").write_text("x")
    app, attempt, cid = new_ids()
    claims = tokens.verify(SECRET, container_token("127.0.0.1:1", cid, app, attempt, memory=1024, vcores=2),
                           tokens.CONTAINER)
    try:
        c = await m.start(claims, Resource(1024, 2), api.LaunchContext(
            commands=["true"], local_resources={"f": LocalResource(resource=str(tmp_path / "f"))}))
        await async_wait_until(lambda: m.localizer.fetches_started == 1, what="the fetch under way")
        assert c.state is S.NEW and m.free() == Resource(0, 0)
        assert await m.stop(cid, ExitStatus.KILLED_BY_APPMASTER, "Container stopped by the AM") is c
        assert c.exited.is_set() and c.state is S.DONE and m.used() == Resource(0, 0)
        assert (c.exit_status, c.diagnostics) == (ExitStatus.KILLED_BY_APPMASTER, "Container stopped by the AM")
        await async_wait_until(gave_up.is_set, what="the fetch given up (nobody else waits for it)")
        assert m.localizer.book.entries == {}
        assert [s.state for s in m.statuses()] == ["COMPLETE"]
    finally:
        gate.set()
        await m.shutdown()
    assert (c.exit_status, c.pid) == (ExitStatus.KILLED_BY_APPMASTER, None)     # and it never ran


async def test_a_launch_that_fails_after_a_stop_ends_with_the_stops_status(tmp_path, monkeypatch):
    m = _manager(tmp_path, lambda: 1.0)
    entered, go = threading.Event(), threading.Event()

    def failing_spawn(c, ctx):
        entered.set()
        go.wait(30)
        raise OSError("cannot create the cgroup")
    monkeypatch.setattr(m, "_prepare_and_spawn", failing_spawn)
    app, attempt, cid = new_ids()
    claims = tokens.verify(SECRET, container_token("127.0.0.1:1", cid, app, attempt, memory=256), tokens.CONTAINER)
    starting = asyncio.get_running_loop().create_task(
        m.start(claims, Resource(256, 1), api.LaunchContext(commands=["true"])))
    try:
        await async_wait_until(entered.is_set, what="the launch in its worker thread")
        c = m.containers[cid]
        await m.stop(cid, ExitStatus.KILLED_BY_RESOURCEMANAGER, "Container killed by the RM", wait=False)
        go.set()
        assert await starting is c
        assert (c.exit_status, c.diagnostics) == (ExitStatus.KILLED_BY_RESOURCEMANAGER, "Container killed by the RM")
        await async_wait_until(lambda: c.state is S.DONE, what="cleanup")
        assert m.used() == Resource(0, 0)
    finally:
        go.set()
        await m.shutdown()

def test_the_arbiter_cpu_pool_is_the_cgroup_roots_cores_unless_set(tmp_path) -> None:
    cpus = os.cpu_count() or 1
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("45000 100000\n")       # a testbed host's 0.45-core budget
    assert node_settings.cgroup_root_cores(str(v2)) == pytest.approx(0.45)
    assert node_settings.arbiter_cpu_pool(NMConfig(), str(v2)) == 1
    (v2 / "cpu.max").write_text(f"{cpus * 100000} 100000\n")
    assert node_settings.arbiter_cpu_pool(NMConfig(), str(v2)) == cpus
    (v2 / "cpu.max").write_text("max 100000\n")          # unlimited: the CPU count
    assert node_settings.cgroup_root_cores(str(v2)) is None and node_settings.arbiter_cpu_pool(NMConfig(), str(v2)) == cpus
    v1 = tmp_path / "v1" / "cpu,cpuacct"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("150000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert node_settings.cgroup_root_cores(str(tmp_path / "v1")) == pytest.approx(1.5)
    assert node_settings.arbiter_cpu_pool(NMConfig(), str(tmp_path / "v1")) == min(cpus, 2)
    assert node_settings.arbiter_cpu_pool(NMConfig(arbiter_cpu_pool=8), str(v2)) == 8       # set: taken as is
    with pytest.raises(ConfigError, match="arbiter_cpu_pool must be >= 0"):
        node_settings.validate(NMConfig(arbiter_cpu_pool=-1), ClusterConfig(secret="s"))


@pytest.mark.parametrize("flag", ["--config", "--cluster-config"])
def test_the_nm_refuses_a_config_file_that_is_not_there(tmp_path, capsys, flag: str) -> None:
    """A misspelt path is said and exit 2 -- it ran the NM on defaults (detected memory, /tmp dirs),
    or failed later with "cluster secret is empty"."""
    from nodemanager.__main__ import main  # noqa: PLC0415

    missing = tmp_path / "no-such.toml"
    assert main([flag, str(missing)]) == 2
    assert f"{flag}: {missing} does not exist" in capsys.readouterr().err
