"""EPS on a real localhost cluster (RM + 3 NMs as processes): add and remove workers and servers of
a training MLR job over the AM's HTTP API and the CLI, without restarting it.

Stated tolerance: under BSP the elastic run's objective after every epoch is within 5% (relative)
of an unchanged run of the same seed and spec (in practice it is within a fraction of a percent:
the data and the model are the same, only which process trains which split changes).
Exactly-once: the job runs with `audit_updates`, so every mini-batch also pushes +1 to one model
key; that key's block migrates to an added server and back when servers are removed while the
workers push, and the servers' count must equal the mini-batches the workers ran.
"""
from __future__ import annotations

import json
import os
import signal
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from appmaster.ps.submission import build_ps_submission
from conftest import (am_control_headers, app_post_mortem, get_app, kill_unless_final, pids_with_env,
                      rest, running_cluster, submit_app, wait_app, warm_pids_with)
from polling import wait_until
from ps_am_status import final_status
from protocol import container_env, tokens
from protocol.ps_status import PsStatus, decode_status
from protocol.shape_history import EpsChange
from psruntime.store.checkpoint import load_manifests
from psruntime.store.ownership_table import block_of

pytestmark = pytest.mark.cluster

TOLERANCE = 0.05
REFERENCE_EPOCHS = 25
SPEC: dict[str, Any] = {
    "app": "mlr", "workers": 2, "servers": 2, "max_workers": 3, "max_servers": 3, "blocks": 12,
    "max_epochs": REFERENCE_EPOCHS, "convergence_threshold": 1e-9, "audit_updates": True,
    "executor_memory_mb": 320, "data": {"num_samples": 16000, "seed": 7},   # 64 input splits of 250 rows
}


@pytest.fixture(scope="module")
def eps_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One RM + 3 NMs (2048 MB, 5 vcores each: room for two AMs and 10 executors) for this module."""
    with running_cluster(tmp_path_factory.mktemp("eps-cluster"), node_memory_mb=2048, node_vcores=5,
                         nm_expiry_s=10, am_expiry_s=30) as c:
        yield c


def http(url: str, body: Any = None, timeout_s: float = 300.0, headers: dict[str, str] | None = None
         ) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, method="GET" if body is None else "POST", data=data,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def am_status(url: str) -> PsStatus:
    """The AM's GET /status, decoded as the record it serves."""
    code, body = http(url + "/status")
    assert code == 200, body
    return decode_status(body)


def gone(cluster: Any, app_id: str) -> None:
    wait_until(lambda: not pids_with_env(container_env.APP_ID, app_id), 30, "every process of the job gone")


@pytest.fixture(scope="module")
def reference(eps_cluster: Any) -> str:
    """The same job (same seed) trained without any change, submitted first and left running
    beside the elastic one: its trajectory is the reference."""
    return submit_app(eps_cluster.rm_url, build_ps_submission(SPEC, name="eps-reference", am_memory=384))


def reference_run(cluster: Any, app_id: str) -> PsStatus:
    app = wait_app(cluster.rm_url, app_id, ("FINISHED",), 300)
    assert app["finalStatus"] == "SUCCEEDED", app["diagnostics"]
    gone(cluster, app_id)
    return final_status(cluster, app_id)


def scale(url: str, auth: dict[str, str], **change: int) -> list[dict[str, Any]]:
    code, body = http(url + "/scale", change, headers=auth)
    assert code == 200, body
    assert all(c["ok"] for c in body["changes"]), body
    return body["changes"]


def test_add_and_remove_each_role_while_training_follows_the_unchanged_run(
        eps_cluster: Any, reference: str, capsys: pytest.CaptureFixture[str]) -> None:
    from elastane_cli.main import main as cli

    # Effectively endless, so the job surely trains through every change; stopped by the test.
    spec = {**SPEC, "max_epochs": 10_000}
    app_id = submit_app(eps_cluster.rm_url, build_ps_submission(spec, name="eps-elastic", am_memory=384))
    try:
        url = wait_until(lambda: (a := get_app(eps_cluster.rm_url, app_id))["state"] == "RUNNING"
                         and a.get("trackingUrl"), 60, "the AM's tracking URL").rstrip("/")
        wait_until(lambda: len(am_status(url).objective_history) >= 2, 120, "two epochs trained")
        status = check_elastic_job(eps_cluster, app_id, url, cli, capsys)
    except BaseException as e:
        e.add_note(app_post_mortem(eps_cluster, app_id))
        raise
    finally:
        kill_unless_final(eps_cluster.rm_url, app_id)   # never leave it training
        gone(eps_cluster, app_id)
    ref = reference_run(eps_cluster, reference)

    # BSP epochs stayed consistent, and the trajectory follows the unchanged run of the same seed.
    hist = status.objective_history
    assert [h.epoch for h in hist] == list(range(len(hist))) and len(hist) >= REFERENCE_EPOCHS
    elastic = [h.objective for h in hist[:REFERENCE_EPOCHS]]
    unchanged = [h.objective for h in ref.objective_history]
    assert len(unchanged) == REFERENCE_EPOCHS and None not in elastic + unchanged    # every objective finite
    worst = max(abs(a - b) / abs(b) for a, b in zip(elastic, unchanged) if a is not None and b is not None)
    assert worst <= TOLERANCE, (worst, elastic, unchanged)


def check_job_secret_stays_in_the_environment(cluster: Any, app_id: str, status: PsStatus) -> None:
    """The attempt's job secret reached the AM and every executor through their environment, and
    no command line, launch script, log or state file holds it."""
    assert status.attempt_id is not None and status.shape is not None
    secret = tokens.job_secret(cluster.secret, status.attempt_id)
    holders = set(pids_with_env(container_env.JOB_SECRET, secret))
    job = set(pids_with_env(container_env.APP_ID, app_id))
    # Executors forked warm from an NM's zygote got their environment in memory, not in /proc:
    # that they hold the secret shows in their authenticated data plane (the job trains).
    warm = set(warm_pids_with(container_env.APP_ID, app_id))
    pids = {e.pid for e in status.shape.serving()}
    assert pids and pids <= holders | warm and holders <= job and holders - pids    # the executors and the AM
    for pid in job:
        assert secret.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    leaks = [str(f) for f in Path(cluster.base_dir).rglob("*")
             if f.is_file() and secret.encode() in f.read_bytes()]
    assert leaks == [], leaks


def check_elastic_job(cluster: Any, app_id: str, url: str, cli: Any,
                      capsys: pytest.CaptureFixture[str]) -> PsStatus:
    """Every change and every refusal, checked on the running job; returns its last status."""
    # The AM's control endpoints act only with the app's token (users go through the RM): without
    # one 401, with a forged one 403, and nothing changes; /status stays readable.
    code, err = http(url + "/scale", {"workers": 1})
    assert code == 401 and "token" in err["RemoteException"]["message"], err
    forged = tokens.am_control_token("not the job secret", am_status(url).attempt_id or "")
    code, err = http(url + "/scale", {"workers": 1}, headers=tokens.bearer(forged))
    assert code == 403, err
    code, err = http(url + "/checkpoint", {})
    assert code == 401, err
    check_job_secret_stays_in_the_environment(cluster, app_id, am_status(url))
    # Through the RM another user is refused (403, the app ACL), and nothing changes.
    assert cli(["ps", "scale", app_id, "--workers", "+1", "--rm", cluster.rm_url, "--user", "mallory"]) == 1
    assert "403" in capsys.readouterr().err
    auth = am_control_headers(cluster, url)
    # Impossible changes: a clear 400, nothing changes.
    for body, msg in [({"workers": 2}, "more than this job's maximum of 3"),
                      ({"servers": -2}, "at least 1 server"), ({"workers": -2}, "at least 1 worker"),
                      ({}, "nothing to change"), ({"workers": "x"}, "workers"), ({"cores": 1}, "cores")]:
        code, err = http(url + "/scale", body, headers=auth)
        assert code == 400 and msg in err["RemoteException"]["message"], (body, err)
    eps = am_status(url).eps
    assert eps is not None and eps.history == []

    # add_workers(1) over HTTP; a second change while it runs gets 409. An add takes about 0.1 s,
    # so one worker is held stopped (SIGSTOP) meanwhile: the add switches in at a clock boundary,
    # which that worker holds back, so the probe always meets the change running.
    held = next(x.pid for x in am_status(url).shape.executors    # type: ignore[union-attr]
                if x.role == "worker" and x.state == "READY" and x.pid)
    result: dict[str, Any] = {}
    t = threading.Thread(target=lambda: result.update(changes=scale(url, auth, workers=1)))
    os.kill(held, signal.SIGSTOP)
    try:
        t.start()
        wait_until(lambda: (e := am_status(url).eps) is not None and e.running or not t.is_alive(), 60,
                   "the change running")
        code, err = http(url + "/scale", {"servers": 1}, headers=auth)
    finally:
        os.kill(held, signal.SIGCONT)
    t.join(120)
    assert code == 409 and "another change is running" in err["RemoteException"]["message"], err
    [add_w] = result["changes"]
    assert add_w["op"] == "add_workers" and add_w["after"] == {"workers": 3, "servers": 2}
    assert len(add_w["containers_added"]) == 1 and add_w["splits_moved"] == 21 and add_w["bytes_sent"] > 0
    # switched in at a clock boundary: in the epoch the change started in, or a later one
    assert add_w["epoch_switched"] >= add_w["epoch_started"]
    # where its time went, step by step, within the change's own duration
    assert {"allocate", "start", "register", "stage_splits", "boundary"} <= add_w["phases"].keys()
    assert sum(add_w["phases"].values()) <= add_w["duration_s"] + 0.01, add_w

    # add_servers(1) through the CLI, as the owner: it PUTs the shape to the RM, no token needed.
    assert cli(["ps", "scale", app_id, "--servers", "+1", "--rm", cluster.rm_url, "--user", "alice"]) == 0
    out = capsys.readouterr().out
    assert "add_servers" in out and "4 model blocks" in out, out
    # ... and returns once the RM's record of the job has the new shape (what `app status` shows)
    current = rest(cluster.rm_url, "GET", f"/ws/v1/cluster/apps/{app_id}/shape")["shape"]["current"]
    assert (current["workers"], current["servers"], current["changing"]) == (3, 3, False), current
    eps = am_status(url).eps
    assert eps is not None
    add_s = eps.history[-1]
    audit_block = block_of("eps:minibatches", SPEC["blocks"])
    assert add_s.op == "add_servers" and add_s.blocks_moved == 4
    assert {"allocate", "start", "register", "move_blocks"} <= add_s.phases.keys()
    assert audit_block in [t.item for t in add_s.transfers if t.kind == "block"]    # the audit key migrates
    assert (eps.workers, eps.servers) == (["worker-0", "worker-1", "worker-2"], ["server-0", "server-1", "server-2"])

    # Down to one worker and one server (removals), then back up.
    rm_s, rm_w = scale(url, auth, workers=-2, servers=-2)
    assert rm_s["op"] == "remove_servers" and rm_s["blocks_moved"] == 8
    assert audit_block in [t["item"] for t in rm_s["transfers"]]         # and migrates back
    # The two removals run concurrently: each op's "after" is the shape when it ended, so only its
    # own role is certain there; the job's shape once both ended is 1 worker, 1 server.
    assert rm_w["op"] == "remove_workers" and rm_w["after"]["workers"] == 1 and rm_s["after"]["servers"] == 1
    down = am_status(url).eps
    assert down is not None and (down.workers, down.servers) == (["worker-0"], ["server-0"]), down
    # worker-0 kept inactive copies of the 11 splits it gave worker-2: they come back without
    # resending; worker-1's own 22 splits and the 10 it gave worker-2 travel.
    assert rm_w["splits_reactivated"] == 11 and rm_w["splits_moved"] == 22 + 10
    assert len(rm_s["containers_released"]) == 2 and len(rm_w["containers_released"]) == 2
    up = scale(url, auth, workers=1, servers=1)
    assert [c["op"] for c in up] == ["add_servers", "add_workers"]   # run concurrently by /scale
    shape = am_status(url).eps
    assert shape is not None and (len(shape.workers), len(shape.servers)) == (2, 2), shape

    # Train on past the reference's epochs, then take a checkpoint: the model is whole.
    wait_until(lambda: len(am_status(url).objective_history) >= REFERENCE_EPOCHS + 1, 300,
               f"{REFERENCE_EPOCHS + 1} epochs")
    code, ckpt = http(url + "/checkpoint", {}, headers=am_control_headers(cluster, url))
    assert code == 200, ckpt
    assert sorted(load_manifests(ckpt["dir"], SPEC["blocks"])) == list(range(SPEC["blocks"]))
    status = am_status(url)
    eps = status.eps
    assert eps is not None and status.shape is not None
    changes = [h for h in status.shape_history if isinstance(h, EpsChange)]
    assert changes == status.shape_history and all(h.changed for h in changes)
    ops = [h.op for h in changes]
    # In the order they ended: the two removals ran concurrently, and so did the last two additions.
    assert ops[:2] == ["add_workers", "add_servers"], ops
    assert sorted(ops[2:4]) == ["remove_servers", "remove_workers"], ops
    assert sorted(ops[4:]) == ["add_servers", "add_workers"], ops
    # Exactly-once, checked by the AM at every epoch's end: each mini-batch run (by any worker,
    # removed ones included) was applied once, across every migration of the audit key's block.
    assert eps.audit_mismatches == [] and eps.minibatches_applied == eps.minibatches_run > 0
    retired = {e.id for e in status.shape.executors if e.state == "EXITED"}
    assert {"server-1", "server-2", "worker-1", "worker-2"} <= retired
    return status


def test_a_job_that_ended_cannot_be_scaled(eps_cluster: Any, reference: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from elastane_cli.main import main as cli

    final = reference_run(eps_cluster, reference)
    assert final.eps is not None and final.eps.history == [] and final.eps.running is False
    assert final.eps.audit_mismatches == [] and final.eps.minibatches_applied == 64 * 5 * REFERENCE_EPOCHS
    assert cli(["ps", "scale", reference, "--workers", "+1", "--rm", eps_cluster.rm_url]) == 2
    assert "only a running PS job can be scaled" in capsys.readouterr().err
