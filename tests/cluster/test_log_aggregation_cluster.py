"""End to end, own clusters: log aggregation to cluster.toml's remote_app_log_dir.

(a) an app's logs outlive its nodes' local copies: once it finishes, each NM uploads them, frees
its log dirs, and `elastane app logs` still prints every container's stdout and stderr (and any
NM's log REST calls answer from the aggregated files);
(b) a node SIGKILLed mid-app after a rolled upload: its containers' logs up to that roll are
readable with `elastane app logs`;
(c) a node down (SIGTERM or SIGKILL) when the app ended, back later on the same dirs: the RM tells
it at registration that the app is over, so it uploads its final file (SIGTERM: it uploaded it as
it stopped, and keeps that file) and frees its local copies; the app view's logAggregationStatus
goes RUNNING (one node to come) then SUCCEEDED.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from appmaster.distributed_shell import build_submission
from conftest import rest, running_cluster, submit_app, wait_app
from polling import wait_until
from protocol.aggregated_logs import RemoteLogDir, app_node_logs, node_file_name, read_log

pytestmark = pytest.mark.cluster

# Each container says who it is on stdout and on stderr, then holds until the test releases it.
SAY = "echo out-$CONTAINER_ID; echo err-$CONTAINER_ID >&2; "


def elastane(cluster_dir: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it against this cluster (its conf dir, hence its remote_app_log_dir)."""
    env = dict(os.environ, ELASTANE_CLUSTER_DIR=str(cluster_dir))
    env.pop("ELASTANE_RM", None)
    return subprocess.run([sys.executable, "-m", "elastane_cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def aggregating_cluster(tmp_path: Path, remote: str, nm_toml: str, nodes: int = 2) -> Any:
    """A cluster of its own (cgroups off: a SIGKILLed NM leaves none behind) whose cluster.toml
    names `remote` as remote_app_log_dir and whose NMs read `nm_toml`'s [nm] keys."""
    path = tmp_path / "nm.toml"
    path.write_text("[nm]\n" + nm_toml)
    return running_cluster(tmp_path / "cluster", nodes=nodes, cgroups="off", extra_nm_args=["--config", str(path)],
                           cluster_settings={"remote_app_log_dir": remote})


def printed_logs(out: str) -> dict[tuple[str, str], tuple[str, str]]:
    """(container, file) -> (where, text) from `elastane app logs` output."""
    parts = re.split(r"^=== (\S+) on (.+): (stdout|stderr) ===\n", out, flags=re.M)
    return {(parts[i], parts[i + 2]): (parts[i + 1], parts[i + 3]) for i in range(1, len(parts) - 1, 4)}


def nm_get(address: str, path: str) -> str:
    with urllib.request.urlopen(f"http://{address}{path}", timeout=15) as r:
        return str(r.read().decode())


def test_finished_apps_logs_are_aggregated_and_local_copies_freed(tmp_path: Path) -> None:
    remote = tmp_path / "app-logs"
    release = tmp_path / "release"
    with aggregating_cluster(tmp_path, str(remote), "keep_finished_logs_s = 0.0\n") as c:
        cmd = ["sh", "-c", SAY + f"while [ ! -e {release} ]; do sleep 0.1; done"]
        app_id = submit_app(c.rm_url, build_submission("agg", cmd, 3, 128, 1, am_memory=256))
        # While it runs, every container's logs are on its node.
        held = wait_until(lambda: (d := [n for n in c.nodes if any((n.log_dir / app_id).glob("*/stdout"))]) and
                          sum(len(list((n.log_dir / app_id).glob("*/stdout"))) for n in d) == 4 and d,
                          60, "the AM and 3 containers' logs on the nodes")
        release.touch()
        wait_app(c.rm_url, app_id, ("FINISHED",), 60)
        # Each node that ran a container uploads its final file, then frees its local copies.
        store = RemoteLogDir(str(remote))
        wait_until(lambda: sorted(n for n in store.names(app_id)) == sorted(node_file_name(n.node_id) for n in held),
                   60, "one final aggregated file per node that ran the app")
        wait_until(lambda: not any((n.log_dir / app_id).exists() for n in c.nodes), 60, "local log dirs freed")

        r = elastane(c.base_dir, "app", "logs", app_id)
        assert r.returncode == 0, r.stdout + r.stderr
        logs = printed_logs(r.stdout)
        cids = {cid for cid, _ in logs}
        assert len(cids) == 4 and all(cid.startswith("container_") for cid in cids), r.stdout
        am, *shells = sorted(cids)
        assert am.endswith("_000001") and all("(aggregated)" in where for where, _ in logs.values()), r.stdout
        assert logs[(am, "stderr")][1], r.stdout        # the AM's own log
        for cid in shells:
            assert logs[(cid, "stdout")][1] == f"out-{cid}\n", (cid, r.stdout)
            assert logs[(cid, "stderr")][1].startswith(f"err-{cid}\n"), (cid, r.stdout)
        # One container alone, one file.
        one = shells[0]
        r = elastane(c.base_dir, "app", "logs", app_id, "--container", one, "--file", "stderr")
        assert r.returncode == 0 and list(printed_logs(r.stdout)) == [(one, "stderr")], r.stdout + r.stderr
        # Any NM's log REST calls answer from the aggregated files, for containers it never ran too.
        for n in c.nodes:
            listing = json.loads(nm_get(n.http_address, f"/ws/v1/node/containerlogs/{one}"))["containerLogsInfo"]
            assert listing["logAggregationType"] == "AGGREGATED"
            assert {f["fileName"] for f in listing["containerLogInfo"]} >= {"stdout", "stderr"}
            assert nm_get(n.http_address, f"/ws/v1/node/containerlogs/{one}/stdout") == f"out-{one}\n"
            page = nm_get(n.http_address, f"/node/containerlogs/{one}/alice")
            assert f"/ws/v1/node/containerlogs/{one}/stdout" in page and "aggregated from node" in page
        # The web UI's links: the app page points at the RM's log pages, which serve every file.
        rm = c.rm_url.removeprefix("http://")
        assert f'href="/cluster/logs/{app_id}"' in nm_get(rm, f"/cluster/app/{app_id}")
        listing = nm_get(rm, f"/cluster/logs/{app_id}")
        for cid in shells:
            assert f'href="/cluster/logs/{app_id}/{cid}/stdout"' in listing, listing
        assert nm_get(rm, f"/cluster/logs/{app_id}/{one}/stdout") == f"out-{one}\n"
        assert nm_get(rm, f"/cluster/logs/{app_id}/{one}/stdout?start=-4") == f"{one[-3:]}\n"


def test_a_node_killed_mid_app_leaves_its_logs_up_to_the_last_roll(tmp_path: Path) -> None:
    remote = tmp_path / "app-logs"
    release = tmp_path / "release"
    with aggregating_cluster(tmp_path, str(remote), "log_roll_interval_s = 1.0\n", nodes=3) as c:
        # AM 256 MB; two 800 MB containers cannot share a 1024 MB node nor the AM's node, so they
        # land on the two other nodes: killing one of those never kills the AM.
        cmd = ["sh", "-c", SAY + f"echo $NM_HTTP_ADDRESS > {tmp_path}/$CONTAINER_ID.node; "
                                 f"while [ ! -e {release} ]; do sleep 0.1; done; echo after-release"]
        app_id = submit_app(c.rm_url, build_submission("agg-roll", cmd, 2, 800, 1, am_memory=256))
        try:
            wait_app(c.rm_url, app_id, ("RUNNING",), 60)
            files = wait_until(lambda: (fs := sorted(tmp_path.glob("*.node"))) and len(fs) == 2 and
                               all(f.read_text().strip() for f in fs) and fs, 60, "both containers running")
            victim_cid, victim_addr = files[0].stem, files[0].read_text().strip()
            victim = next(n for n in c.nodes if n.http_address == victim_addr)
            store = RemoteLogDir(str(remote))

            def rolled() -> bool:
                nodes = [n for n in app_node_logs(store, app_id) if n.node_file == node_file_name(victim.node_id)]
                return bool(nodes) and not nodes[0].final and \
                    read_log(store, app_id, nodes[0], victim_cid, "stdout") == f"out-{victim_cid}\n".encode()
            wait_until(rolled, 60, "a rolled upload of the victim's container logs")
            c.kill_node(victim.index)           # the host crashes: the NM and its local logs are gone
            r = elastane(c.base_dir, "app", "logs", app_id)
            assert r.returncode == 0, r.stdout + r.stderr
            logs = printed_logs(r.stdout)
            where, out = logs[(victim_cid, "stdout")]
            assert out == f"out-{victim_cid}\n" and "rolled while running" in where, r.stdout
            assert logs[(victim_cid, "stderr")][1].startswith(f"err-{victim_cid}\n"), r.stdout
            # The containers on the live nodes are read from their NMs.
            other_cid = files[1].stem
            assert logs[(other_cid, "stdout")][1] == f"out-{other_cid}\n", r.stdout
        finally:
            release.touch()


def test_logs_aggregate_to_s3(tmp_path: Path, s3: Any) -> None:
    """The same on a real S3 server (SeaweedFS): the NMs upload through s3fs, the CLI reads back."""
    remote = s3.url("app-logs")
    with aggregating_cluster(tmp_path, remote, "keep_finished_logs_s = 0.0\n") as c:
        app_id = submit_app(c.rm_url, build_submission("agg-s3", ["sh", "-c", SAY], 2, 128, 1, am_memory=256))
        wait_app(c.rm_url, app_id, ("FINISHED",), 60)
        wait_until(lambda: not any((n.log_dir / app_id).exists() for n in c.nodes), 60, "local log dirs freed")
        r = elastane(c.base_dir, "app", "logs", app_id, "--file", "stdout")
        assert r.returncode == 0, r.stdout + r.stderr
        logs = printed_logs(r.stdout)
        shells = sorted(cid for cid, _ in logs)[1:]
        assert len(shells) == 2 and all(logs[(cid, "stdout")][1] == f"out-{cid}\n" for cid in shells), r.stdout
        assert all(f.startswith("127.0.0.1_") for f in RemoteLogDir(remote).names(app_id))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_node_down_when_the_app_ended_aggregates_its_logs_once_it_is_back(tmp_path: Path, sig: int) -> None:
    remote = tmp_path / "app-logs"
    release = tmp_path / "release"
    with aggregating_cluster(tmp_path, str(remote), "keep_finished_logs_s = 0.0\n") as c:
        # AM 256 MB: the 800 MB container cannot share its 1024 MB node, so it runs on the other one.
        cmd = ["sh", "-c", SAY + f"echo $NM_HTTP_ADDRESS > {tmp_path}/$CONTAINER_ID.node; "
                                 f"while [ ! -e {release} ]; do sleep 0.1; done"]
        app_id = submit_app(c.rm_url, build_submission("agg-back", cmd, 1, 800, 1, am_memory=256))
        try:
            [f] = wait_until(lambda: (fs := [p for p in tmp_path.glob("*.node") if p.read_text().strip()]) and fs,
                             60, "the container running")
            cid = f.stem
            victim = next(n for n in c.nodes if n.http_address == f.read_text().strip())
            local = victim.log_dir / app_id / cid / "stdout"
            wait_until(lambda: local.exists() and local.read_text() == f"out-{cid}\n", 60, "the container's stdout")
            c.kill_node(victim.index, sig)
            # The node goes LOST with its container; the shell AM (no retries) ends the app.
            wait_app(c.rm_url, app_id, ("FINISHED", "FAILED", "KILLED"), 60)

            def view() -> dict[str, Any]:
                return dict(rest(c.rm_url, "GET", f"/ws/v1/cluster/apps/{app_id}")["app"])
            # The AM's node uploaded its file and told the RM.
            wait_until(lambda: view()["logAggregationStatus"] == "RUNNING", 60, "one node's logs aggregated")
            store = RemoteLogDir(str(remote))
            if sig == signal.SIGTERM:
                # A stopping NM uploads what it holds of the app (docs/operating.md, "When an NM
                # stops"), but cannot tell the RM any more: that waits for its next run.
                [early] = [n for n in app_node_logs(store, app_id) if n.node_file == node_file_name(victim.node_id)]
                assert early.final and read_log(store, app_id, early, cid, "stdout") == f"out-{cid}\n".encode()
            else:
                assert node_file_name(victim.node_id) not in store.names(app_id)     # killed: still to come
            assert local.read_text() == f"out-{cid}\n"         # kept on the node while it is down

            c.restart_node(victim.index)
            mine = node_file_name(victim.node_id)
            wait_until(lambda: any(n.node_file == mine and n.final for n in app_node_logs(store, app_id)), 60,
                       "the restarted node's final aggregated file")
            [node] = [n for n in app_node_logs(store, app_id) if n.node_file == mine]
            assert read_log(store, app_id, node, cid, "stdout") == f"out-{cid}\n".encode()
            wait_until(lambda: not (victim.log_dir / app_id).exists(), 60, "the restarted node's local logs freed")
            wait_until(lambda: view()["logAggregationStatus"] == "SUCCEEDED", 60, "logAggregationStatus SUCCEEDED")
            # The AM's logs link is the RM's page, which lists the AM container's aggregated files.
            am = app_id.replace("application_", "container_") + "_01_000001"
            link = view()["amContainerLogs"]
            assert link == f"{c.rm_url}/cluster/logs/{app_id}/{am}", link
            assert f'href="/cluster/logs/{app_id}/{am}/stderr"' in nm_get(link.removeprefix("http://"), "")
        finally:
            release.touch()
