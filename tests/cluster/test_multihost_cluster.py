"""A cluster of separate hosts, started as operators start one (docs/testbed.md).

Every test builds its own testbed: a `master` host (the RM) and four node hosts, each a network
namespace with its own address on a bridge, its own /tmp, hostname and sshd. The cluster is
started by `bin/start-cluster` on the master, which reaches the nodes over ssh with the one shared
conf/ (nothing in it names a node's address), and stopped by `bin/stop-cluster`, after which no
process and no cgroup dir of Elastane may be left on any host (checked for every test). PS jobs
run on it from the test process, which reaches the RM and the AMs over the bridge as a client
machine would.

What spans hosts: every NM registers with its own address; a PS job's executors span hosts and
the job SUCCEEDS, and EPS adds a worker on a host the job was not on; the host that runs a job's
AM dies (every process on it SIGKILLed, its link cut) and attempt 2 on another host resumes from
the checkpoint on shared storage with the same final objective as an undisturbed run; a host with
only executors dies; a host's link is cut with its processes still running (no RST, as when a host
loses power) and the job recovers while the link stays cut.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest

from appmaster.ps.submission import build_ps_submission
from conftest import FINAL_STATES, get_app, kill_unless_final, rest, submit_app, wait_app
from elastane_cli import testbed_hosts
from elastane_cli.testbed_cluster import MASTER, TestbedCluster
from polling import wait_until
from protocol.ps_status import ExecutorStatus, PsStatus, decode_status
from protocol.shape_history import RecoveryChange

_reason = testbed_hosts.unavailable_reason(sshd=True)
pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(_reason is not None, reason=f"no multi-host testbed here: {_reason}")]

WORKER_HOSTS = 4
SPEC: dict[str, Any] = {"app": "mlr", "workers": 2, "servers": 2, "max_epochs": 10, "convergence_threshold": 1e-12,
                        "checkpoint_every_epochs": 1, "hparams": {"learning_rate": 0.5}, "executor_memory_mb": 320}


def affinity(pid: int) -> set[int] | None:
    """The CPUs a process may run on (None: it has ended)."""
    try:
        return os.sched_getaffinity(pid)
    except ProcessLookupError:
        return None


@contextmanager
def cluster_of_hosts(base: Path, **options: Any) -> Iterator[TestbedCluster]:
    """A started TestbedCluster; on exit bin/stop-cluster must succeed and leave nothing behind."""
    c = TestbedCluster(base, workers=WORKER_HOSTS, **options)
    c.start()
    dead: list[str] = []
    try:
        yield c
    finally:
        dead = [h.name for h in c.testbed.hosts if not h.anchor_pid]
        c.stop()
    if dead:    # a killed host cannot be reached: stop-cluster says so, naming it, and only it
        assert c.stop_returncode == 1 and f"failed on: {' '.join(dead)}" in c.stop_output, c.stop_output
    else:
        assert c.stop_returncode == 0, c.stop_output
    assert c.leftovers == {}, c.stop_report()
    assert c.testbed.leftover_pids == [] and c.testbed.errors == []


def submit(c: TestbedCluster, spec: dict[str, Any], name: str, attempts: int = 2) -> str:
    return submit_app(c.rm_url, build_ps_submission(spec, name=name, am_memory=384, max_app_attempts=attempts))


def am_url(c: TestbedCluster, app_id: str) -> str:
    return str(wait_until(lambda: (a := get_app(c.rm_url, app_id))["state"] == "RUNNING" and a.get("trackingUrl"),
                          90, "the AM's tracking URL")).rstrip("/")


def status(url: str) -> PsStatus | None:
    """The AM's /status, decoded (None while it does not answer)."""
    try:
        return decode_status(rest(url, "GET", "/status"))
    except OSError:
        return None


def ready_executors(st: PsStatus | None) -> list[ExecutorStatus]:
    return st.shape.serving() if st is not None and st.shape is not None else []


def attempts(c: TestbedCluster, app_id: str) -> list[dict[str, Any]]:
    return rest(c.rm_url, "GET", f"/ws/v1/cluster/apps/{app_id}/appattempts")["appAttempts"]["appAttempt"]  # type: ignore[no-any-return]


def durable_status(c: TestbedCluster, app_id: str) -> PsStatus:
    """The AM's final status.json, on the shared storage every host sees."""
    st = c.final_status(app_id)
    assert st.app is not None, f"no readable status.json of {app_id}"
    return st


def succeeded(c: TestbedCluster, app_id: str, timeout_s: float = 300) -> dict[str, Any]:
    app = wait_app(c.rm_url, app_id, ("FINISHED",), timeout_s)
    assert app["finalStatus"] == "SUCCEEDED", app["diagnostics"]
    return app


def post_mortem(c: TestbedCluster, app_id: str) -> str:
    out = []
    try:
        app = get_app(c.rm_url, app_id)
        out.append(f"{app_id}: {app['state']}/{app.get('finalStatus')}: {app.get('diagnostics')}")
    except Exception as e:  # noqa: BLE001 - the RM may be what failed
        out.append(f"{app_id}: no report ({e})")
    out += c.am_logs(app_id)
    return "\n".join(out) + "\n" + c.logs(20)


def test_start_cluster_over_ssh_registers_every_host_with_its_own_address(tmp_path: Path) -> None:
    with cluster_of_hosts(tmp_path / "c") as c:
        nodes = {n["id"]: n for n in c.nodes()}
        assert sorted(nodes) == sorted(c.node_id(n) for n in c.node_names)
        assert all(n["state"] == "RUNNING" for n in nodes.values())
        for name in c.node_names:
            # Started over ssh, each output line tagged with its host, each NM on its own host.
            assert f"{name}: nm running as process" in c.start_output, c.start_output
            pid_file = c.testbed.host(name).tmp_dir / "elastane" / "pids" / f"elastane-root-nm-{name}.pid"
            assert int(pid_file.read_text()) in c.testbed.pids(name)
        # The RM's own line names the address clients use, not its bind address.
        assert f"http://{MASTER}:8088" in c.start_output and "127.0.0.1" not in c.start_output.split("rm running")[1].split("\n")[0]


def test_a_ps_job_spans_hosts_scales_out_across_them_and_succeeds(tmp_path: Path) -> None:
    with cluster_of_hosts(tmp_path / "c") as c:
        app_id = submit(c, {**SPEC, "max_epochs": 10_000}, "spans-hosts")
        try:
            url = am_url(c, app_id)
            st = wait_until(lambda: (s := status(url)) and len(ready_executors(s)) == 4
                            and len(s.objective_history) >= 1 and s, 120, "four executors training")
            hosts = {c.host_of(e.node) for e in ready_executors(st)}
            assert len(hosts) >= 2, ready_executors(st)
            for e in ready_executors(st):   # each executor serves on its own host's address
                assert e.address.rsplit(":", 1)[0] == c.testbed.host(c.host_of(e.node)).ip, e
            before = {e.id for e in ready_executors(st)}
            # EPS scale-out through the RM, as `elastane ps scale --workers +1` does (no `nodes`: those
            # would place the whole job on exactly them, moving executors that are fine where they are).
            rest(c.rm_url, "PUT", f"/ws/v1/cluster/apps/{app_id}/shape", {"workers": 3, "servers": 2}, user="alice")
            st = wait_until(lambda: (s := status(url)) and len([e for e in ready_executors(s) if e.role == "worker"]) == 3
                            and s, 120, "a third worker")
            added = [e for e in ready_executors(st) if e.id not in before]
            assert len(added) == 1 and added[0].role == "worker"
            # The new worker serves on its own host's address, and the job still spans hosts.
            assert added[0].address.rsplit(":", 1)[0] == c.testbed.host(c.host_of(added[0].node)).ip
            assert len({c.host_of(e.node) for e in ready_executors(st)}) >= 2
            epochs = len(st.objective_history)
            wait_until(lambda: (s := status(url)) and len(s.objective_history) >= epochs + 2, 120,
                       "two epochs trained with the added worker")
            final = status(url)
            assert final is not None and [h.epoch for h in final.objective_history] == \
                list(range(len(final.objective_history)))
        except BaseException as e:
            e.add_note(post_mortem(c, app_id))
            raise
        finally:
            kill_unless_final(c.rm_url, app_id)
            wait_app(c.rm_url, app_id, FINAL_STATES, 60)


def test_ams_run_on_the_master_and_executors_on_the_budgeted_hosts(tmp_path: Path) -> None:
    """am_host: the master's NM carries the AM label; every AM goes there and no executor does,
    so the node hosts' CPU budgets hold executors only (the paper setups' master instance). With
    pin_cpus every budgeted host's processes, the executors its NM started too, run on its CPU."""
    # Generous AM expiry: this test is about placement, not liveness, and AMs start slowly on a busy machine.
    with cluster_of_hosts(tmp_path / "c", am_host=True, worker_cpus=0.45, am_expiry_s=30, pin_cpus=True) as c:
        nodes = {n["id"]: n for n in c.nodes()}
        master_id = c.node_id(MASTER)
        assert sorted(nodes) == sorted(c.node_id(n) for n in [MASTER, *c.node_names])
        assert nodes[master_id]["nodeLabels"] == ["am"]
        assert all(nodes[c.node_id(n)]["nodeLabels"] == [] for n in c.node_names)
        assert c.testbed.host(MASTER).cpus is None and all(c.testbed.host(n).cpus == 0.45 for n in c.node_names)
        # Long enough to still be training when the test looks at where the executors are; it ends them.
        spec = {**SPEC, "max_epochs": 10_000, "checkpoint_every_epochs": 0}
        apps = [submit(c, spec, f"am-on-master-{i}") for i in range(2)]
        try:
            urls = [am_url(c, a) for a in apps]
            for app_id, url in zip(apps, urls):
                assert [at["nodeId"] for at in attempts(c, app_id)] == [master_id]
                st = wait_until(lambda u=url: (s := status(u)) and len(ready_executors(s)) == 4 and s, 120,
                                "four executors ready")
                hosts = {c.host_of(e.node) for e in ready_executors(st)}
                assert MASTER not in hosts and hosts <= set(c.node_names), ready_executors(st)
            # Pinned: a node host's every process (NM, executors, sshd) is on its one CPU; the
            # master, which has no budget, floats.
            assert c.testbed.host(MASTER).cpu_list is None
            pinned = {n: c.testbed.host(n).cpu_list for n in c.node_names}
            assert all(cpu is not None for cpu in pinned.values()), pinned
            for name in hosts:
                on = {pid: affinity(pid) for pid in c.testbed.pids(name)}
                assert len(on) >= 3 and all(a in (None, {int(str(pinned[name]))}) for a in on.values()), (name, on)
            # What benches measure hosts by: the hosts that ran executors used CPU in their own
            # cgroups, and their links carried the pushes and pulls.
            for name in hosts:
                cpu = c.testbed.cpu_seconds(name)
                assert cpu is not None and cpu > 0, name
                assert all(b > 0 for b in c.testbed.link_bytes(name)), name
        except BaseException as e:
            e.add_note("\n".join(post_mortem(c, a) for a in apps))
            raise
        finally:
            for app_id in apps:
                kill_unless_final(c.rm_url, app_id)
                wait_app(c.rm_url, app_id, FINAL_STATES, 60)


def test_the_host_running_the_am_dies_and_attempt_2_resumes_from_shared_checkpoints(tmp_path: Path) -> None:
    # A generous AM expiry: the RM is to learn of the AM's loss from its host's NM expiring (the
    # "lost" asserted below); at the 6 s default a loaded machine let the AM expiry win the race.
    with cluster_of_hosts(tmp_path / "c", am_expiry_s=30) as c:
        app_id = submit(c, SPEC, "am-host-dies")
        try:
            url = am_url(c, app_id)
            wait_until(lambda: (s := status(url)) and len(s.objective_history) >= 3, 180, "three epochs")
            am_host = c.host_of(attempts(c, app_id)[0]["nodeId"])
            ckpts = c.shared_dir / "checkpoints" / app_id
            assert any(ckpts.rglob("*")), "no checkpoint on shared storage"
            c.testbed.kill_host(am_host)
            wait_until(lambda: len(attempts(c, app_id)) == 2, 120, "a second attempt")
            app = succeeded(c, app_id)
        except BaseException as e:
            e.add_note(post_mortem(c, app_id))
            raise
        second = attempts(c, app_id)[1]
        assert c.host_of(second["nodeId"]) != am_host
        assert "lost" in (app.get("diagnostics") or "").lower() or "lost" in str(attempts(c, app_id)[0]).lower()
        st = durable_status(c, app_id)
        resumed = st.resumed_from
        assert (st.attempt_id or "").endswith("_000002") and resumed is not None and resumed.epoch > 0, resumed
        assert [h.epoch for h in st.objective_history] == list(range(SPEC["max_epochs"]))
        # The same job undisturbed, on the hosts that are left.
        ref_id = submit(c, SPEC, "undisturbed")
        succeeded(c, ref_id)
        final, expected = st.objective_history[-1].objective, durable_status(c, ref_id).objective_history[-1].objective
        assert final is not None and expected is not None
        assert abs(final - expected) <= 0.01 * abs(expected), (final, expected)


def _executor_only_host(c: TestbedCluster, app_id: str, st: PsStatus) -> str:
    am_host = c.host_of(attempts(c, app_id)[-1]["nodeId"])
    hosts = [c.host_of(e.node) for e in ready_executors(st)]
    return next(h for h in hosts if h != am_host)


@pytest.mark.parametrize("how", ["killed", "link-cut"])
def test_a_host_with_only_executors_is_lost_and_the_job_recovers(tmp_path: Path, how: str) -> None:
    # A generous AM expiry: the AM's host stays up (the lost host is one without it), and an AM
    # starved on a loaded machine must not expire meanwhile (it did, at the 6 s default).
    with cluster_of_hosts(tmp_path / "c", am_expiry_s=30) as c:
        app_id = submit(c, SPEC, f"executor-host-{how}")
        try:
            url = am_url(c, app_id)
            st = wait_until(lambda: (s := status(url)) and len(ready_executors(s)) == 4
                            and len(s.objective_history) >= 2 and s, 180, "two epochs on four executors")
            victim = _executor_only_host(c, app_id, st)
            lost = {e.id for e in ready_executors(st) if c.host_of(e.node) == victim}
            if how == "killed":
                c.testbed.kill_host(victim)
            else:
                # The host goes silent with everything on it still running: no RST, no FIN.
                c.testbed.cut_link(victim)
            succeeded(c, app_id)
            nodes = {n["id"]: n["state"] for n in c.nodes()}
            assert nodes[c.node_id(victim)] == "LOST"
        except BaseException as e:
            e.add_note(post_mortem(c, app_id))
            raise
        finally:
            if how == "link-cut":   # back on the network, so bin/stop-cluster can stop it too
                c.testbed.restore_link(victim)
        st = durable_status(c, app_id)
        assert len(attempts(c, app_id)) == 1          # the AM's host was fine: no new attempt
        assert [h.epoch for h in st.objective_history] == list(range(SPEC["max_epochs"]))
        # The lost executors were replaced by executors on the hosts that are left.
        assert st.shape is not None
        final = {e.id: e for e in st.shape.executors}
        assert all(final[i].state != "READY" for i in lost if i in final)
        assert all(c.host_of(e.node) != victim for e in final.values() if e.state == "READY")
        # Learnt from the RM's node-loss report (-100 on a LOST node), not from a socket timing out
        # or the AM's reply deadline: that is what makes a silent host as quick to recover as a dead one.
        recoveries = [r for r in st.shape_history if isinstance(r, RecoveryChange)]
        assert recoveries, st.shape_history
        assert any(f"lost* node {c.node_id(victim)}" in line for r in recoveries for line in r.lost), recoveries
