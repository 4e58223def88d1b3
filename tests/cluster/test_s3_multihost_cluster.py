"""Checkpoints in S3 on the multi-host testbed (docs/testbed.md): no shared mount holds them.

A SeaweedFS server runs on the testbed's `master` host (its own address, reachable from every
host over the bridge). The shared conf names it the way an operator would -- cluster.toml's
[storage] with the endpoint `http://master:8333` and a key pair, rm.toml's `checkpoint_dir =
"s3://elastane/checkpoints"` -- and nothing else tells any process about it: each daemon, started
over ssh, exports [storage] as the AWS variables and each NM passes them into its containers. The
host running a PS job's AM dies (every process SIGKILLed, its link cut); attempt 2 on another host
finds attempt 1's latest checkpoint in S3, resumes from it, and the job succeeds with every epoch
accounted for once.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import s3_server as s3mod
from appmaster.ps.submission import build_ps_submission
from conftest import get_app, rest, submit_app, wait_app
from elastane_cli import testbed_hosts
from elastane_cli.testbed_cluster import MASTER, TestbedCluster, toml_section
from polling import wait_until
from protocol.ps_status import FINAL_STATUS_FILE, PsStatus, decode_status, read_status

_reason = testbed_hosts.unavailable_reason(sshd=True) or s3mod.unavailable_reason()
pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(_reason is not None, reason=f"no multi-host testbed with S3 here: {_reason}")]

BUCKET = "elastane"
S3_PORT = 8333
# The master host's own network namespace: SeaweedFS's default ports are free there (the RM has 8088).
PORTS = {"master.port": 9333, "master.port.grpc": 19333, "volume.port": 9340, "volume.port.grpc": 19340,
         "filer.port": 8888, "filer.port.grpc": 18888, "s3.port": S3_PORT, "s3.port.grpc": 18333,
         "admin.port": 23646, "admin.port.grpc": 33646}
# Long enough that attempt 1 is still training when its host is killed (a checkpoint every epoch).
SPEC: dict[str, Any] = {"app": "mlr", "workers": 2, "servers": 2, "max_epochs": 40, "convergence_threshold": 1e-12,
                        "checkpoint_every_epochs": 1, "hparams": {"learning_rate": 0.5}, "executor_memory_mb": 320}


class S3TestbedCluster(TestbedCluster):
    """A TestbedCluster whose checkpoint_dir is in an S3 server on the master host, started before
    the cluster (the RM checks checkpoint_dir's bucket at start) and stopped before the cluster's
    leftovers are looked for."""

    __test__ = False

    def __init__(self, base_dir: Path, **options: Any) -> None:
        super().__init__(base_dir, rm_conf={"checkpoint_dir": f"s3://{BUCKET}/checkpoints"}, **options)
        self.s3: s3mod.S3Server | None = None

    def write_conf(self) -> None:
        super().write_conf()
        master = self.testbed.host(MASTER)
        self.s3 = s3mod.start_s3_server(self.shared_dir / "s3", ip=master.ip, prefix=master.exec_prefix(), ports=PORTS)
        self.s3.create_bucket(BUCKET)
        with open(self.conf_dir / "cluster.toml", "a") as f:    # what an operator adds: docs/operating.md
            f.write("\n" + toml_section("storage", {
                "s3_endpoint_url": f"http://{MASTER}:{S3_PORT}", "s3_region": s3mod.REGION,
                "s3_access_key_id": self.s3.access_key, "s3_secret_access_key": self.s3.secret_key}))

    def stop(self) -> None:
        if self.s3 is not None:
            self.s3.stop()
        super().stop()


def attempts(c: TestbedCluster, app_id: str) -> list[dict[str, Any]]:
    return rest(c.rm_url, "GET", f"/ws/v1/cluster/apps/{app_id}/appattempts")["appAttempts"]["appAttempt"]  # type: ignore[no-any-return]


def am_status(url: str) -> PsStatus | None:
    """The AM's /status, decoded (None while it does not answer)."""
    try:
        return decode_status(rest(url, "GET", "/status"))
    except OSError:
        return None


def post_mortem(c: S3TestbedCluster, app_id: str) -> str:
    """What is in S3 under the app's dir, the AMs' stderr (every attempt, on whichever host is
    still there) and the daemons' logs."""
    out = []
    if c.s3 is not None:
        try:
            out += ["--- S3:", *c.s3.filesystem().find(f"{BUCKET}/checkpoints/{app_id}")]
        except Exception as e:  # noqa: BLE001 - the server may be what failed
            out.append(f"--- S3: cannot list: {e}")
    out += c.am_logs(app_id)
    return "\n".join(out) + "\n" + c.logs(20)


def test_the_am_host_dies_and_attempt_2_resumes_from_checkpoints_in_s3(tmp_path: Path) -> None:
    # Four nodes: after one is lost, 3 x 2 vcores still hold the AM and its 4 executors. A generous AM
    # expiry: AMs start slowly on a busy machine, and the AM host's loss is learnt from its NM's expiry.
    c = S3TestbedCluster(tmp_path / "c", workers=4, am_expiry_s=30)
    c.start()
    dead: list[str] = []
    try:
        assert c.s3 is not None
        fs = c.s3.filesystem()
        app_id = submit_app(c.rm_url, build_ps_submission(SPEC, name="am-host-dies-s3", am_memory=384,
                                                          max_app_attempts=2))
        try:
            url = str(wait_until(lambda: (a := get_app(c.rm_url, app_id))["state"] == "RUNNING"
                                 and a.get("trackingUrl"), 90, "the AM's tracking URL")).rstrip("/")
            prefix = f"{BUCKET}/checkpoints/{app_id}/checkpoints"
            committed = wait_until(lambda: [k for k in fs.find(prefix) if k.endswith("/job.json")
                                            and "/epoch-0/" not in k], 180, "a committed checkpoint after epoch 0 in S3")
            am_host = c.host_of(attempts(c, app_id)[0]["nodeId"])
            assert am_host != MASTER
            st = am_status(url)
            assert st is not None and len(st.objective_history) < SPEC["max_epochs"] - 5, \
                "attempt 1 is (nearly) done before its host is killed: the job is too short for this test"
            dead = [am_host]
            c.testbed.kill_host(am_host)
            wait_until(lambda: len(attempts(c, app_id)) == 2, 120, "a second attempt")
            app = wait_app(c.rm_url, app_id, ("FINISHED",), 300)
            assert app["finalStatus"] == "SUCCEEDED", app["diagnostics"]
            assert committed
            second = attempts(c, app_id)[1]
            assert c.host_of(second["nodeId"]) not in (am_host, MASTER)
            # the AM's final status, in S3 too: attempt 2 resumed from a checkpoint attempt 1 put there
            st = read_status(fs.cat_file(f"{BUCKET}/checkpoints/{app_id}/{FINAL_STATUS_FILE}"))
            resumed = st.resumed_from
            assert (st.attempt_id or "").endswith("_000002") and resumed is not None and resumed.epoch > 0, resumed
            assert resumed.url.startswith(f"s3://{BUCKET}/checkpoints/{app_id}/checkpoints/"), resumed
            assert [h.epoch for h in st.objective_history] == list(range(SPEC["max_epochs"]))
        except BaseException as e:
            e.add_note(post_mortem(c, app_id))
            raise
    finally:
        c.stop()
    # bin/stop-cluster reached every live host (a killed one cannot be: it says so, naming it),
    # and nothing -- no daemon, no container, no S3 server -- is left on any host
    if dead:
        assert c.stop_returncode == 1 and f"failed on: {' '.join(dead)}" in c.stop_output, c.stop_output
    assert c.leftovers == {}, c.stop_report()
    assert c.s3 is not None and c.s3.process.returncode is not None
