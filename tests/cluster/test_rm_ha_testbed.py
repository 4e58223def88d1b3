"""Active/standby ResourceManagers on the multi-host testbed (issue 37's part 7).

One cluster for the module (elastane_cli.ha_testbed_cluster, started as operators start one):
etcd, one member, on its own host `etcd`; the RM hosts `rm1` and `rm2` listed in cluster.toml's
[ha] with the documented default lease (5 s) and client failover; two NM hosts. `bin/start-cluster`
on rm1 starts both RMs (rm2 over ssh) and the NMs (over ssh). Each test starts from one RM active
and the other standby, and leaves the cluster so (a killed host revived, a cut link restored, etcd
running), so they share it; at the end bin/stop-cluster must leave no process, cgroup dir or
network device on any host.

- the active RM's host dies (its link cut, every process on it SIGKILLed) while two PS jobs train:
  the standby becomes active, both jobs SUCCEED in their first attempt with the executors they had
  (work-preserving: no restart), no container id is launched twice on any NM, and the old host,
  when it returns and the operator starts its RM (bin/start-rm), is a standby following the new
  active;
- the active's link is cut with its process alive: it loses etcd, its term ends (its lease runs
  out or its token is fenced), it steps down and says why, and it never answers as active once the
  other one has: its own haState is sampled from inside its host all along (the test process
  cannot reach it while its link is cut) and the other's from outside, each sample stamped on the
  one monotonic clock of the machine;
- a submission made by the CLI (both RMs given) while the active's link is cut either succeeds
  once or fails with a clear error, and the RM never holds two applications of that name;
- etcd is stopped: both RMs go standby and say why (clusterInfo and their logs); started again,
  one becomes active, the other standby, and the NMs are RUNNING at the active.

The PS jobs run a throttled AM (tests/support/scripted_am.py) until the test opens a gate on the
shared storage, so they train through the failover however fast the hosts are.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

from appmaster.ps.submission import build_ps_submission
from conftest import FINAL_STATES, rest, submit_app
from elastane_cli import testbed_hosts
from elastane_cli.ha_testbed_cluster import RM_HOSTS, HaTestbedCluster, duplicate_container_ids, get
from elastane_cli.testbed_cluster import PROJECT, RM_PORT
from polling import wait_until
from protocol.ps_status import PsStatus
from ps_am_status import live_status
from scripted_am import GATE_ENV, throttle_until_gate, use_scripted_am

_reason = testbed_hosts.unavailable_reason(sshd=True) or (
    None if shutil.which("etcd") else "no etcd binary (Debian's etcd-server)")
pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(_reason is not None, reason=f"no multi-host testbed with etcd here: {_reason}")]

NODES = 2
# Until the gate file exists each BSP clock (one epoch of these jobs) takes 0.4 s longer, so both
# jobs are still training when the failover is over; the test opens the gate after it.
THROTTLE_UNTIL_GATE = throttle_until_gate(0.4)
SPEC: dict[str, Any] = {"app": "mlr", "workers": 1, "servers": 1, "max_epochs": 16, "convergence_threshold": 1e-12,
                        "checkpoint_every_epochs": 0, "hparams": {"learning_rate": 0.5}, "executor_memory_mb": 320,
                        "data": {"num_samples": 4000}}
# The jobs that train through the host's death: throttled, 200 epochs take 80 s, far more than a
# failover on a loaded machine (at 16 the jobs had ended before the test saw them at the new active);
# once the gate opens they run out in seconds.
THROUGH_DEATH_SPEC: dict[str, Any] = {**SPEC, "max_epochs": 200}

# Samples an RM's haState into a file, one JSON line per answer: [sent, received, haState,
# haZooKeeperConnectionState, haReason], both times on the machine's monotonic clock (hosts share
# it), until the stop file exists. "" for a refusal (a deposed RM's 503), NONE when nothing answers.
SAMPLER = r"""
import json, os, sys, time, urllib.error, urllib.request
url, out, stop = sys.argv[1:4]
with open(out, "a", buffering=1) as f:
    while not os.path.exists(stop):
        sent = time.monotonic()
        row = ["NONE", "", ""]
        try:
            with urllib.request.urlopen(url + "/ws/v1/cluster/info?user.name=sampler", timeout=3) as r:
                info = json.loads(r.read()).get("clusterInfo") or {}
            row = [info.get("haState", ""), info.get("haZooKeeperConnectionState", ""), info.get("haReason", "")]
        except urllib.error.HTTPError:
            row = ["", "", ""]
        except (OSError, ValueError):
            pass
        f.write(json.dumps([sent, time.monotonic(), *row]) + "\n")
        time.sleep(0.05)    # the sampling period (a sample is a reading, not a wait for anything)
"""

# One submission (new-application, then POST /apps of a trivial app named argv[2]) to the RM at
# argv[1]; writes {"new": [status, body], "submit": [status, body]} to argv[3].
SUBMIT_ONCE = r"""
import json, sys, urllib.error, urllib.request
url, name, out = sys.argv[1:4]

def call(method, path, body=None):
    req = urllib.request.Request(url + path + "?user.name=alice", method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return [r.status, json.loads(r.read() or b"{}")]
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return [e.code, json.loads(raw or b"{}")]
        except ValueError:
            return [e.code, {"text": raw.decode(errors="replace")}]
    except (OSError, ValueError) as e:
        return [0, {"error": str(e)}]

res = {"new": call("POST", "/ws/v1/cluster/apps/new-application")}
if res["new"][0] == 200:
    sub = {"application-id": res["new"][1]["application-id"], "application-name": name, "application-type": "YARN",
           "am-container-spec": {"commands": {"command": "sleep 600"}}, "resource": {"memory": 128, "vCores": 1}}
    res["submit"] = call("POST", "/ws/v1/cluster/apps", sub)
with open(out, "w") as f:
    json.dump(res, f)
"""


# ----- the shared cluster -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HaTestbedCluster]:
    # HaTestbedCluster runs the RM's documented NM and AM expiries: after a failover every NM and
    # AM must be heard from by the new active within them.
    c = HaTestbedCluster(tmp_path_factory.mktemp("rm-ha-testbed"), nodes=NODES, node_vcores=4)
    c.start(timeout_s=240)
    try:
        yield c
    finally:
        dead = [i for i in RM_HOSTS if not c.testbed.host(i).anchor_pid]
        for h in c.testbed.hosts:
            if h.anchor_pid:
                c.testbed.restore_link(h.name)
        c.stop()
    left = c.left_behind(dead[0] if dead else None)
    assert left == [], f"left behind on the hosts: {left}"


def heal(c: HaTestbedCluster) -> None:
    """What an earlier test may have left broken if it failed half-way: every RM host up, its link
    up and its RM running; etcd running."""
    if c.etcd is None or c.etcd.poll() is not None:
        c.start_etcd(60)
    for rm_id in RM_HOSTS:
        h = c.testbed.host(rm_id)
        if not h.anchor_pid:
            c.revive_rm_host(rm_id)
        else:
            c.testbed.restore_link(rm_id)
            if not c.ha_info(rm_id):
                c.start_rm(rm_id)


def one_active(c: HaTestbedCluster) -> tuple[str, str]:
    """(active, standby) once one RM answers ACTIVE and the other STANDBY, following it."""
    heal(c)

    def roles() -> Optional[tuple[str, str]]:
        info = {i: c.ha_info(i) for i in RM_HOSTS}
        act = [i for i in RM_HOSTS if info[i].get("haState") == "ACTIVE"]
        std = [i for i in RM_HOSTS if info[i].get("haState") == "STANDBY"]
        if len(act) == 1 and len(std) == 1 and info[std[0]].get("haActiveRmId") == act[0]:
            return act[0], std[0]
        return None
    return wait_until(roles, 120, "one RM active and the other standby following it", 0.2)  # type: ignore[no-any-return]


def other(rm_id: str) -> str:
    return next(i for i in RM_HOSTS if i != rm_id)


def ha_status(c: HaTestbedCluster, rm_id: str) -> dict[str, Any]:
    """The RM's /ws/v1/cluster/ha (its role's history), {} when it does not answer."""
    return ((get(c.rm_address(rm_id) + "/ws/v1/cluster/ha") or {}).get("ha")) or {}


def app_report(c: HaTestbedCluster, rm_id: str, app_id: str) -> dict[str, Any]:
    return ((get(f"{c.rm_address(rm_id)}/ws/v1/cluster/apps/{app_id}") or {}).get("app")) or {}


def apps_named(c: HaTestbedCluster, rm_id: str, name: str) -> list[dict[str, Any]]:
    apps = (((rest(c.rm_address(rm_id), "GET", "/ws/v1/cluster/apps", user="alice") or {}).get("apps")) or {}).get("app")
    return [a for a in apps or [] if a.get("name") == name]


def kill_app(c: HaTestbedCluster, rm_id: str, app_id: str) -> None:
    if app_report(c, rm_id, app_id).get("state") not in (*FINAL_STATES, None):
        rest(c.rm_address(rm_id), "PUT", f"/ws/v1/cluster/apps/{app_id}/state", {"state": "KILLED"}, user="alice")
    wait_until(lambda: app_report(c, rm_id, app_id).get("state") in FINAL_STATES, 60, f"{app_id} ended", 0.2)


@contextmanager
def sampling(c: HaTestbedCluster, rm_id: str, inside: bool, tag: str) -> Iterator[Path]:
    """A SAMPLER of `rm_id`'s haState for the block, run on the RM's own host (`inside`: it reaches
    its own address with the host's link cut) or on this machine; yields its output file, ended
    (stop file, then by its pid) when the block ends."""
    out, stop = c.shared_dir / f"samples-{tag}-{rm_id}.jsonl", c.shared_dir / f"samples-{tag}-{rm_id}.stop"
    cmd = [sys.executable, "-c", SAMPLER, c.rm_address(rm_id), str(out), str(stop)]
    if inside:
        cmd = [*c.testbed.host(rm_id).exec_prefix(), *cmd]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: proc.poll() is None and out.exists() and bool(out.read_text().strip())
                   or proc.poll() is not None, 30, f"the sampler of {rm_id} answering", 0.05)
        assert proc.poll() is None, (proc.stderr.read() if proc.stderr else b"").decode()
        yield out
    finally:
        stop.touch()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        if proc.stderr is not None:
            proc.stderr.close()


def samples(out: Path) -> list[tuple[float, float, str, str, str]]:
    return [tuple(json.loads(line)) for line in out.read_text().splitlines() if line.strip()]  # type: ignore[misc]


# ----- the active RM's host dies while two PS jobs train ----------------------------------------

def training(c: HaTestbedCluster, rm_id: str, app_id: str, past_epoch: int) -> Optional[PsStatus]:
    """The job's AM status once it RUNS at `rm_id` (its tracking URL from that RM) with its two
    executors serving and more than `past_epoch` epochs done."""
    app = app_report(c, rm_id, app_id)
    st = live_status(app["trackingUrl"]) if app.get("state") == "RUNNING" and app.get("trackingUrl") else None
    if st is None or st.shape is None or len(st.shape.serving()) != 2 or len(st.objective_history) <= past_epoch:
        return None
    return st


def test_the_active_rms_host_dies_while_two_ps_jobs_train_and_both_succeed_in_their_first_attempt(ha):
    c = ha
    active, standby = one_active(c)
    epoch0 = int(c.ha_info(active)["haEpoch"])
    script_dir, gate = c.shared_dir / "throttled-am", c.shared_dir / "gate-host-death"
    script_dir.mkdir(exist_ok=True)
    apps = []
    for i in range(2):
        sub = build_ps_submission(THROUGH_DEATH_SPEC, name=f"through-host-death-{i}", am_memory=384,
                                  max_app_attempts=2)
        use_scripted_am(sub, script_dir, THROTTLE_UNTIL_GATE, {GATE_ENV: str(gate)})
        apps.append(submit_app(c.rm_address(active), sub))
    survivor = standby
    try:
        before = {a: wait_until(lambda a=a: training(c, active, a, 1), 240, f"{a} training on its 2 executors", 0.2)
                  for a in apps}
        executors = {a: {e.container_id for e in st.shape.executors} for a, st in before.items() if st.shape}

        killed = c.testbed.kill_host(active)            # link cut, every process on the host SIGKILLed
        assert killed and not c.testbed.pids(active)
        wait_until(lambda: c.ha_info(standby).get("haState") == "ACTIVE", 120, f"{standby} active after the kill", 0.1)
        info = c.ha_info(standby)
        assert info["haEpoch"] > epoch0 and info["haRmId"] == standby, info
        # Both jobs go on training at the new active (their AMs re-registered), with the same
        # executors, and then run to their end.
        for a in apps:
            epochs_then = len(before[a].objective_history)
            st = wait_until(lambda a=a, n=epochs_then: training(c, standby, a, n), 120,
                            f"{a} training on at {standby}", 0.2)
            assert st.shape is not None and {e.container_id for e in st.shape.executors} == executors[a]
        gate.touch()
        for a in apps:
            app = wait_until(lambda a=a: (r := app_report(c, standby, a)).get("state") in FINAL_STATES and r,
                             240, f"{a} over", 0.5)
            assert (app["state"], app["finalStatus"]) == ("FINISHED", "SUCCEEDED"), app
            attempts = rest(c.rm_address(standby), "GET", f"/ws/v1/cluster/apps/{a}/appattempts",
                            user="alice")["appAttempts"]["appAttempt"]
            assert len(attempts) == 1, attempts
            final = c.final_status(a)
            assert final.attempt_id is not None and final.attempt_id.endswith("_000001") and final.resumed_from is None
            assert final.shape is not None and {e.container_id for e in final.shape.executors} == executors[a]
            assert final.recovery is None or final.recovery.failures == 0, final.recovery
            assert [h.epoch for h in final.objective_history] == list(range(THROUGH_DEATH_SPEC["max_epochs"]))
        # Every container of both terms was launched once, on one node.
        dups, ids, launched = duplicate_container_ids(c.nm_logs())
        assert (dups, ids) == (0, []) and launched >= 6, (dups, ids, launched)
    except BaseException as e:
        e.add_note(c.logs(30))
        raise
    finally:
        gate.touch()
        for a in apps:
            if c.testbed.host(survivor).anchor_pid and c.ha_info(survivor).get("haState") == "ACTIVE":
                kill_app(c, survivor, a)

    # The old host returns; the operator starts its RM, which comes back as a standby.
    r = c.revive_rm_host(active)
    assert r.returncode == 0, r.stdout + r.stderr
    wait_until(lambda: (i := c.ha_info(active)).get("haState") == "STANDBY" and i.get("haActiveRmId") == standby,
               60, f"{active} back as standby following {standby}", 0.1)
    assert c.ha_info(standby)["haState"] == "ACTIVE"


# ----- the active is partitioned with its process alive -----------------------------------------

def test_a_partitioned_active_loses_its_term_steps_down_and_never_acts_while_the_other_does(ha):
    c = ha
    old, new = one_active(c)
    epoch0 = int(c.ha_info(old)["haEpoch"])
    restored = True
    name, result = f"to-the-partitioned-{uuid.uuid4().hex[:8]}", c.shared_dir / "partitioned-submission.json"
    submitter: Optional[subprocess.Popen[bytes]] = None
    with sampling(c, old, inside=True, tag="partition") as old_out, \
            sampling(c, new, inside=False, tag="partition") as new_out:
        try:
            t_cut = time.monotonic()
            c.testbed.cut_link(old)                     # its process runs on; nothing reaches it
            restored = False
            # A client on its host submits to it as it is cut off: the store write can only fail.
            submitter = subprocess.Popen([*c.testbed.host(old).exec_prefix(), sys.executable, "-c", SUBMIT_ONCE,
                                          c.rm_address(old), name, str(result)], stdin=subprocess.DEVNULL)
            wait_until(lambda: c.ha_info(new).get("haState") == "ACTIVE", 120, f"{new} active", 0.1)
            assert int(c.ha_info(new)["haEpoch"]) > epoch0
            # The old one, seen from its own host: its term over, a standby that says why.
            wait_until(lambda: any(s[0] > t_cut and s[2] == "STANDBY" for s in samples(old_out)), 120,
                       f"{old} standby on its own host", 0.1)
            c.testbed.restore_link(old)
            restored = True
            t_restored = time.monotonic()
            wait_until(lambda: (i := c.ha_info(old)).get("haState") == "STANDBY" and i.get("haActiveRmId") == new,
                       60, f"{old} back on the network, a standby following {new}", 0.1)
            # Some samples of both after the heal (the old one has had time to try to act).
            wait_until(lambda: sum(s[0] > t_restored for s in samples(old_out)) >= 20
                       and sum(s[0] > t_restored for s in samples(new_out)) >= 20, 60, "samples after the heal", 0.1)
            assert submitter.wait(120) == 0
        finally:
            if not restored:
                c.testbed.restore_link(old)
            if submitter is not None and submitter.poll() is None:
                submitter.kill()
                submitter.wait(10)
    # The submission was not acknowledged (its save failed, or the RM was no longer active), and
    # no RM holds it.
    sub = json.loads(result.read_text())
    print(f"the submission to the partitioned {old}: {sub}")
    assert "submit" not in sub or sub["submit"][0] != 202, sub
    if sub["new"][0] == 200 and sub["submit"][0] == 503:
        msg = sub["submit"][1]["RemoteException"]["message"]
        assert "could not save application" in msg or "no longer active" in msg or "standby" in msg, msg
    assert apps_named(c, new, name) == []
    olds, news = samples(old_out), samples(new_out)
    old_active = [s[0] for s in olds if s[2] == "ACTIVE"]       # sent: it answered so at or after this
    new_active = [s[1] for s in news if s[2] == "ACTIVE"]       # received: it answered so at or before this
    assert old_active and new_active, (olds[:3], news[:3])
    # Never both: the old one's last ACTIVE answer was read before the new one's first.
    assert max(old_active) < min(new_active), (max(old_active) - t_cut, min(new_active) - t_cut)
    # While cut off it could not reach etcd, and said so.
    cut_off = [s for s in olds if s[0] > t_cut and s[2] == "STANDBY"]
    assert any("etcd unreachable" in s[3] for s in cut_off), cut_off[:3]
    # Its term ended the way a deposed active's does: lease run out without etcd, or fenced.
    history = ha_status(c, old).get("history") or []
    down = [h for h in history if h["from"] in ("ACTIVE", "BECOMING_ACTIVE") and h["to"] == "STANDBY"]
    assert down and down[-1]["event"] in ("LEASE_EXPIRED", "FENCED"), history
    assert "etcd unreachable" in down[-1]["reason"] or "fenced" in down[-1]["reason"], down[-1]
    log = c.rm_log(old)
    assert "etcd unreachable" in log and f"ResourceManager {old} is standby" in log, log[-3000:]


# ----- a submission during a failover ------------------------------------------------------------

def test_a_submission_during_a_failover_succeeds_once_or_fails_clearly(ha):
    c = ha
    old, new = one_active(c)
    name = f"during-failover-{uuid.uuid4().hex[:8]}"
    client = c.node_names[0]
    urls = ",".join(f"http://{i}:{RM_PORT}" for i in RM_HOSTS)
    env = {**c.env(), "PYTHONPATH": str(PROJECT), "ELASTANE_CLUSTER_DIR": str(c.shared_dir / "no-local-cluster")}
    cmd = [*c.testbed.host(client).exec_prefix(), sys.executable, "-m", "elastane_cli.main", "--rm", urls,
           "--user", "alice", "ps", "submit", "--app", "mlr", "--workers", "1", "--servers", "1",
           "--max-epochs", "1", "--name", name]
    restored = True
    try:
        # The operator's CLI on a node host submits as the active's link goes down.
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, cwd=PROJECT, env=env)
        c.testbed.cut_link(old)
        restored = False
        try:
            out, err = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"the CLI did not end: {out}\n{err}") from None
        wait_until(lambda: c.ha_info(new).get("haState") == "ACTIVE", 120, f"{new} active", 0.1)
        named = apps_named(c, new, name)
        print(f"the CLI exited {proc.returncode}: {out.strip()} {err.strip()[-300:]}; {len(named)} app(s) named {name}")
        assert len(named) <= 1, named                       # never twice
        if proc.returncode == 0:
            assert len(named) == 1 and f"Submitted application {named[0]['id']}" in out, (out, named)
        else:
            # A clear error: the CLI's exit code for a failure, one message and no traceback.
            assert proc.returncode == 1 and err.strip() and "Traceback" not in err, (proc.returncode, err)
    finally:
        if not restored:
            c.testbed.restore_link(old)
    for a in apps_named(c, new, name):
        kill_app(c, new, a["id"])
    wait_until(lambda: (i := c.ha_info(old)).get("haState") == "STANDBY" and i.get("haActiveRmId") == new,
               120, f"{old} a standby following {new}", 0.1)
    assert len(apps_named(c, new, name)) == (1 if proc.returncode == 0 else len(named))


# ----- etcd stopped and started ------------------------------------------------------------------

def test_etcd_stopped_sends_both_rms_to_standby_saying_why_and_started_again_one_is_active(ha):
    c = ha
    active, standby = one_active(c)
    c.stop_etcd()
    try:
        def both_standby() -> Optional[dict[str, dict[str, Any]]]:
            info = {i: c.ha_info(i) for i in RM_HOSTS}
            ok = all(v.get("haState") == "STANDBY" and "etcd unreachable" in v.get("haZooKeeperConnectionState", "")
                     for v in info.values())
            return info if ok else None
        info = wait_until(both_standby, 120, "both RMs standby, saying etcd is unreachable", 0.2)
        # The one that was active says why it is not any more: its lease ran out without etcd.
        reason = info[active]["haReason"]
        assert "no lease renewal acknowledged" in reason and "etcd unreachable" in reason, info[active]
        assert "etcd unreachable" in c.rm_log(active) and f"ResourceManager {active} is standby" in c.rm_log(active)
        assert "etcd unreachable" in c.rm_log(standby)
        history = ha_status(c, active).get("history") or []
        assert history and history[-1]["event"] == "LEASE_EXPIRED" and history[-1]["to"] == "STANDBY", history
    finally:
        if c.etcd is None or c.etcd.poll() is not None:
            c.start_etcd(60)
    now_active, _ = one_active(c)
    assert c.ha_info(now_active)["haZooKeeperConnectionState"] == "etcd: CONNECTED"
    assert c.ha_info(now_active)["haEpoch"] > info[active]["haEpoch"]
    c.await_nodes_running(c.node_names, time.monotonic() + 120)
