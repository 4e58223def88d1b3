"""LocalCluster: the harness on its own against tiny fake daemons, then against the real RM + NMs.

The fakes follow the daemon contract of docs/internals.md (flags, ready file, SIGTERM) so the
harness's start / readiness / failure / stop / reap / save-load logic is tested without the RM.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from elastane_cli import container_reaper, processes
from elastane_cli.local_cluster import ClusterStartError, LocalCluster
from polling import wait_until

FAKE_RM = textwrap.dedent('''
    import argparse, json, os, signal, sys, threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--ready-file")
    p.add_argument("--cluster-config")
    ns, _ = p.parse_known_args()
    if os.environ.get("FAKE_RM_FAIL"):
        print("fake rm: bad config: no such policy", file=sys.stderr)
        sys.exit(2)
    nodes = {}

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a): pass
        def _send(self, obj):
            body = json.dumps(obj).encode()
            self.send_response(200); self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
        def do_GET(self):
            self._send({"nodes": {"node": list(nodes.values())}} if nodes else {"nodes": None})
        def do_POST(self):
            n = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            nodes[n["id"]] = {"id": n["id"], "state": "RUNNING", "nodeHTTPAddress": n["addr"]}
            self._send({})

    srv = ThreadingHTTPServer((ns.host, ns.port), H)
    port = srv.server_address[1]
    signal.signal(signal.SIGTERM, lambda *a: threading.Thread(target=srv.shutdown).start())
    info = {"pid": os.getpid(), "http_address": f"127.0.0.1:{port}", "node_id": "",
            "url": f"http://127.0.0.1:{port}"}
    tmp = ns.ready_file + ".tmp"
    open(tmp, "w").write(json.dumps(info)); os.replace(tmp, ns.ready_file)
    srv.serve_forever()
''')

FAKE_NM = textwrap.dedent('''
    import argparse, json, os, signal, subprocess, sys, urllib.request
    p = argparse.ArgumentParser()
    p.add_argument("--rm-address"); p.add_argument("--ready-file"); p.add_argument("--recovery-dir")
    p.add_argument("--memory-mb"); p.add_argument("--cluster-config")
    ns, _ = p.parse_known_args()
    if os.environ.get("FAKE_NM_HANG"):
        signal.pause()
    node_id = f"127.0.0.1:{os.getpid()}"
    # A "container": its own session, CONTAINER_ID in its env, recorded as one file (the NM's old
    # layout, which recovery_store.read_records still reads).
    cid = f"container_1_0001_01_{os.getpid():06d}"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True,
                             env=dict(os.environ, CONTAINER_ID=cid))
    ticks = int(open(f"/proc/{child.pid}/stat").read().rsplit(")", 1)[1].split()[19])
    d = os.path.join(ns.recovery_dir, "containers"); os.makedirs(d, exist_ok=True)
    rec = {"container_id": cid, "pid": child.pid, "pgid": child.pid, "start_time": ticks, "final": None}
    open(os.path.join(d, cid + ".json"), "w").write(json.dumps(rec))
    def term(*a):
        os.killpg(child.pid, signal.SIGKILL); child.wait(); os.remove(os.path.join(d, cid + ".json"))
        sys.exit(0)
    signal.signal(signal.SIGTERM, term)
    req = urllib.request.Request(ns.rm_address + "/register", method="POST",
                                 data=json.dumps({"id": node_id, "addr": "127.0.0.1:1"}).encode())
    urllib.request.urlopen(req).read()
    info = {"pid": os.getpid(), "http_address": "127.0.0.1:1", "node_id": node_id, "url": "http://127.0.0.1:1"}
    tmp = ns.ready_file + ".tmp"
    open(tmp, "w").write(json.dumps(info)); os.replace(tmp, ns.ready_file)
    while True:
        signal.pause()
''')


class FakeCluster(LocalCluster):
    rm_module = "fake_rm"
    nm_module = "fake_nm"


def _fakes(tmp_path: Path) -> dict[str, str]:
    d = tmp_path / "fakes"
    d.mkdir(exist_ok=True)
    (d / "fake_rm.py").write_text(FAKE_RM)
    (d / "fake_nm.py").write_text(FAKE_NM)
    return {"PYTHONPATH": str(d)}


def _recorded_children(c: LocalCluster) -> list[tuple[int, int | None]]:
    out = []
    for n in c.nodes:
        for rec in container_reaper.recorded_containers(n.recovery_dir):
            out.append((rec.pid, rec.start_ticks))
    return out


def test_rejects_bad_parameters(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nodes"):
        LocalCluster(tmp_path, nodes=0)
    with pytest.raises(ValueError, match="rm_port"):
        LocalCluster(tmp_path, rm_port=70000)


def test_fake_cluster_start_and_clean_stop(tmp_path: Path) -> None:
    c = FakeCluster(tmp_path / "c", nodes=2, env=_fakes(tmp_path))
    with c:
        assert c.rm_url.startswith("http://127.0.0.1:")
        assert len(c.nodes) == 2 and all(n.node_id and processes.is_alive(n.pid) for n in c.nodes)
        conf = (c.base_dir / "conf" / "cluster.toml").read_text()
        assert c.secret in conf and c.rm_url in conf
        assert oct((c.base_dir / "conf" / "cluster.toml").stat().st_mode & 0o777) == "0o600"
        state = json.loads((c.base_dir / "cluster.json").read_text())
        assert state["rm_pid"] == c.rm_pid and [n["pid"] for n in state["nodes"]] == [n.pid for n in c.nodes]
        pids = c.pids()
    assert not any(processes.is_alive(p) for p in pids)
    c.stop()  # idempotent


def test_killed_node_leaves_its_container_until_stop(tmp_path: Path) -> None:
    c = FakeCluster(tmp_path / "c", nodes=2, env=_fakes(tmp_path)).start()
    try:
        children = _recorded_children(c)
        assert len(children) == 2
        c.kill_node(0)
        assert not processes.is_alive(c.nodes[0].pid)
        # Like a crashed host's: the container of the SIGKILLed NM still runs.
        orphan = [ch for ch in children if processes.is_alive(*ch)]
        assert len(orphan) >= 1
    finally:
        c.stop()
    assert not any(processes.is_alive(p, t) for p, t in children)
    assert not any(processes.is_alive(p) for p in c.pids())


def test_stop_from_another_process_via_cluster_json(tmp_path: Path) -> None:
    c = FakeCluster(tmp_path / "c", nodes=1, env=_fakes(tmp_path)).start()
    pids = c.pids()
    try:
        loaded = LocalCluster.load(tmp_path / "c")
        assert loaded.rm_url == c.rm_url and loaded.secret == c.secret and loaded.pids() == pids
        assert loaded.running()
        out = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                              "from elastane_cli.local_cluster import LocalCluster; "
                              "LocalCluster.load(Path(sys.argv[1])).stop()", str(tmp_path / "c")],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        for p in pids:  # reap our own children so they are not zombies
            assert processes.wait_gone([(p, None)], 10.0) == []
    finally:
        c.stop()


def test_daemon_that_exits_fails_start_with_its_stderr(tmp_path: Path) -> None:
    env = dict(_fakes(tmp_path), FAKE_RM_FAIL="1")
    c = FakeCluster(tmp_path / "c", nodes=1, env=env)
    with pytest.raises(ClusterStartError, match="no such policy"):
        c.start(timeout_s=30)
    assert not processes.is_alive(c.rm_pid)


def test_node_that_never_gets_ready_times_out_and_everything_stops(tmp_path: Path) -> None:
    env = dict(_fakes(tmp_path), FAKE_NM_HANG="1")
    c = FakeCluster(tmp_path / "c", nodes=1, env=env)
    with pytest.raises(ClusterStartError, match="nm0 was not ready"):
        c.start(timeout_s=3)
    assert not any(processes.is_alive(p) for p in c.pids())


def test_reaper_ignores_records_of_other_processes(tmp_path: Path) -> None:
    """A recorded pid that is alive but is not that container (wrong env / start time) is spared."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True,
                            env=dict(os.environ, CONTAINER_ID="container_1_0001_01_000009"))
    try:
        d = tmp_path / "recovery" / "containers"
        d.mkdir(parents=True)
        ticks = processes.proc_start_ticks(proc.pid)
        (d / "a.json").write_text(json.dumps({"container_id": "container_1_0001_01_000002", "pid": proc.pid,
                                              "pgid": proc.pid, "start_time": ticks}))
        (d / "b.json").write_text(json.dumps({"container_id": "container_1_0001_01_000009", "pid": proc.pid,
                                              "pgid": proc.pid, "start_time": (ticks or 0) + 1}))
        assert container_reaper.reap([tmp_path / "recovery"], not_before_unix=0) == []
        assert container_reaper.reap([tmp_path / "recovery"], not_before_unix=time.time() + 3600) == []
        assert proc.poll() is None
        (d / "c.json").write_text(json.dumps({"container_id": "container_1_0001_01_000009", "pid": proc.pid,
                                              "pgid": proc.pid, "start_time": ticks}))
        assert container_reaper.reap([tmp_path / "recovery"], not_before_unix=0) == [proc.pid]
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_reaper_spares_the_group_of_a_recycled_leader_but_not_the_containers_own_stragglers(tmp_path: Path) -> None:
    """A recorded pgid whose leader is now another process (the number was reused) names someone
    else's group: its members are spared. A container whose leader exited leaves stragglers in its
    group that carry its CONTAINER_ID: those are killed."""
    child = "import time; time.sleep(60)"
    foreign = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys, time; "
                                f"subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(60)"],
                               start_new_session=True)                        # no CONTAINER_ID
    mine = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {child!r}])"],
                            start_new_session=True, env=dict(os.environ, CONTAINER_ID="container_1_0001_01_000003"))
    mine_ticks = processes.proc_start_ticks(mine.pid)
    try:
        mine.wait(timeout=10)                                                  # its leader is gone, its child stays
        wait_until(lambda: len(processes.group_members(foreign.pid)) == 2 and len(processes.group_members(mine.pid)) == 1,
                   10, "the foreign session with its child, the container's straggler")
        d = tmp_path / "recovery" / "containers"
        d.mkdir(parents=True)
        ticks = processes.proc_start_ticks(foreign.pid)
        for name, pid, start in (("f", foreign.pid, (ticks or 0) + 1), ("m", mine.pid, mine_ticks)):
            (d / f"{name}.json").write_text(json.dumps({"container_id": "container_1_0001_01_000003", "pid": pid,
                                                        "pgid": pid, "start_time": start}))
        stragglers, foreign_members = set(processes.group_members(mine.pid)), set(processes.group_members(foreign.pid))
        killed = container_reaper.reap([tmp_path / "recovery"], not_before_unix=0)
        assert set(killed) == stragglers
        assert foreign.poll() is None and set(processes.group_members(foreign.pid)) == foreign_members
    finally:
        for pid in processes.group_members(foreign.pid) + processes.group_members(mine.pid):
            processes.signal_pid(pid, signal.SIGKILL)
        foreign.wait()


def test_reaper_reads_the_nm_journal_and_skips_containers_it_removed(tmp_path: Path) -> None:
    """The NM's recovery journal: a record put and later deleted (the RM saw it complete) is not
    the reaper's to kill; one still put is."""
    from nodemanager.recovery_store import RecoveryStore

    store = RecoveryStore(str(tmp_path / "recovery"))
    store.save({"container_id": "container_1_0001_01_000002", "pid": 4242, "start_time": 7})
    store.save({"container_id": "container_1_0001_01_000003", "pid": 4343, "start_time": 8})
    store.remove("container_1_0001_01_000002")
    recs = container_reaper.recorded_containers(tmp_path / "recovery")
    assert [(r.container_id, r.pid) for r in recs] == [("container_1_0001_01_000003", 4343)]


def test_a_dead_nms_recorded_and_shell_cgroups_are_removed(tmp_path: Path) -> None:
    """After an NM died without cleaning up: the container cgroups its journal records and its
    pre-started shells' cgroups go (empty dirs), then its node dir; a dir still in use stays."""
    from nodemanager.recovery_store import RecoveryStore

    root = tmp_path / "cg"
    node = "127.0.0.1:4242"
    node_dirs = [root / ctl / "elastane" / "127.0.0.1_4242" for ctl in ("cpu", "memory")]
    gone = [d / "container_1_0001_01_000002" for d in node_dirs]
    busy = node_dirs[1] / "container_1_0001_01_000003"
    for d in [*gone, busy, *(n / f"shell-99-{i}" for n in node_dirs for i in (1, 2))]:
        d.mkdir(parents=True)
    (busy / "cgroup.procs").write_text("1\n")            # a plain dir with a file: rmdir refuses
    store = RecoveryStore(str(tmp_path / "recovery"))
    store.save({"container_id": "container_1_0001_01_000002", "pid": 4242,
                "cgroup": {"dirs": [str(d) for d in gone]}})
    store.save({"container_id": "container_1_0001_01_000003", "pid": 4343, "cgroup": {"dirs": [str(busy)]}})
    removed = container_reaper.remove_recorded_cgroups(tmp_path / "recovery", cgroup_root=str(root))
    assert sorted(removed) == sorted(str(d) for d in gone) and busy.is_dir()
    removed = container_reaper.remove_node_cgroup_dirs([node], root=root)
    assert not node_dirs[0].exists() and str(node_dirs[0]) in removed
    assert node_dirs[1].is_dir() and sorted(p.name for p in node_dirs[1].iterdir()) == [busy.name]


def _real_daemons_available() -> bool:
    root = Path(__file__).resolve().parents[2]
    return (root / "rm" / "__main__.py").exists() and (root / "nodemanager" / "__main__.py").exists()


@pytest.mark.cluster
@pytest.mark.skipif(not _real_daemons_available(), reason="python -m rm / nodemanager not available yet")
def test_real_cluster_starts_registers_and_stops(tmp_path: Path) -> None:
    c = LocalCluster(tmp_path / "c", nodes=2, node_memory_mb=512, node_vcores=1, heartbeat_interval_ms=250,
                     cgroups="off")
    with c:
        nodes = {n["id"]: n for n in c._rm_nodes()}
        assert set(nodes) == {n.node_id for n in c.nodes}
        assert all(n["state"] == "RUNNING" for n in nodes.values())
        pids = c.pids()
    assert not any(processes.is_alive(p) for p in pids)


@pytest.mark.cluster
@pytest.mark.skipif(not _real_daemons_available(), reason="python -m rm / nodemanager not available yet")
def test_real_containers_of_a_killed_nm_are_reaped_at_stop(tmp_path: Path) -> None:
    """SIGKILL an NM mid-app: its containers survive (a crashed host); stop() kills exactly those."""
    import asyncio  # noqa: PLC0415

    from elastane_cli.app_commands import submit_shell  # noqa: PLC0415
    from elastane_cli.rm_rest_client import RmRestClient  # noqa: PLC0415

    c = LocalCluster(tmp_path / "c", nodes=1, node_memory_mb=1024, node_vcores=2, heartbeat_interval_ms=250,
                     cgroups="off").start()
    try:
        async def submit() -> str:
            async with RmRestClient(c.rm_url, "alice") as client:
                return await submit_shell(client, ["sleep", "300"], num_containers=1, memory=128, vcores=1)
        asyncio.run(submit())

        def live_records() -> list[container_reaper.RecordedContainer]:
            recs = container_reaper.recorded_containers(c.nodes[0].recovery_dir)
            return [r for r in recs if processes.is_alive(r.pid, r.start_ticks)]
        # the AM and its sleep container
        recs = wait_until(lambda: r if len(r := live_records()) >= 2 else None, 60, "both containers started")
        c.kill_node(0)
        assert all(processes.is_alive(r.pid, r.start_ticks) for r in recs)
    finally:
        c.stop()
    assert not any(processes.is_alive(r.pid, r.start_ticks) for r in recs)
    assert not any(processes.is_alive(p) for p in c.pids())
