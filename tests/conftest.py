"""Shared fixtures: an in-test fake RM + NM for AM-library tests, and real localhost clusters
(LocalCluster: one RM and three NMs as processes) with REST helpers for end-to-end tests."""
from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest
from aiohttp import web

from protocol import container_env, tokens
from fakes import AM_TOKEN, FakeNM, FakeRM
from polling import wait_until
from protocol.ps_status import PsStatus
from protocol.shape_history import KillRestartChange
from ps_am_status import running_status
import parallel_plan


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long modules first, for make test's xdist workers (tests/support/parallel_plan.py)."""
    parallel_plan.plan(items)

# ===== fake RM / NM (in-process aiohttp servers: tests/support/fakes.py) =========================

@dataclass
class FakeCluster:
    rm: FakeRM
    nm: FakeNM
    env: dict[str, str]


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"127.0.0.1:{port}"


@pytest.fixture
async def fake_cluster() -> Any:
    """A fake RM + NM on ephemeral ports and the AM environment pointing at them."""
    nm = FakeNM()
    nm_runner, nm.address = await _serve(nm.app())
    rm = FakeRM(nm=nm)
    rm_runner, rm.address = await _serve(rm.app())
    env = {container_env.RM_ADDRESS: f"http://{rm.address}", container_env.AM_TOKEN: AM_TOKEN,
           container_env.APP_ATTEMPT_ID: "appattempt_1_0001_000001"}
    try:
        yield FakeCluster(rm, nm, env)
    finally:
        await rm_runner.cleanup()
        await nm_runner.cleanup()


# ===== real localhost clusters ===================================================================

# am_expiry_s: an AM registers within it of its launch. 5 s failed AMs that started slowly (the
# interpreter's imports) on a loaded 2-core machine running three clusters at once; the tests that
# time an AM's expiry set their own.
CLUSTER_KW = dict(nodes=3, node_memory_mb=1024, node_vcores=2, nm_expiry_s=3, am_expiry_s=15,
                  heartbeat_interval_ms=250)
FINAL_STATES = ("FINISHED", "FAILED", "KILLED")


@contextmanager
def running_cluster(base: Path, **options: Any) -> Iterator[Any]:
    """A LocalCluster under `base`, started, with CLUSTER_KW's settings overridden by `options`
    (nodes, node_memory_mb, node_vcores, expiries, policy, node_bandwidth, network, ...); stopped
    on exit, also when starting it failed half-way. Module fixtures that need other capacities
    build their cluster with this."""
    local_cluster = pytest.importorskip("elastane_cli.local_cluster",
                                        reason="elastane_cli.local_cluster is not available")
    c = local_cluster.LocalCluster(base, **{**CLUSTER_KW, **options})
    try:
        c.start(timeout_s=60)
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One RM + 3 NMs (1024 MB, 2 vcores each) shared by every non-destructive cluster test
    (each such test kills or waits out its own apps, so the next one finds the cluster idle)."""
    with running_cluster(tmp_path_factory.mktemp("cluster")) as c:
        yield c


@pytest.fixture
def private_cluster(tmp_path: Path) -> Iterator[Any]:
    """A cluster of its own for a test that breaks it (kills an NM)."""
    with running_cluster(tmp_path / "cluster") as c:
        yield c


class RestError(Exception):
    """A non-2xx answer from the RM REST API."""

    def __init__(self, status: int, body: Any):
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body


def rest(base_url: str, method: str, path: str, body: Any = None, user: Optional[str] = None,
         raw: Optional[bytes] = None, timeout_s: float = 15.0) -> Any:
    """One synchronous JSON call to the RM REST API (stdlib only, so usable from sync fixtures)."""
    url = base_url.rstrip("/") + path
    if user is not None:
        url += ("&" if "?" in url else "?") + urllib.parse.urlencode({"user.name": user})
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", "Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            payload = r.read()
            return json.loads(payload) if payload else None
    except urllib.error.HTTPError as e:
        payload = e.read()
        try:
            parsed: Any = json.loads(payload)
        except ValueError:
            parsed = payload.decode(errors="replace")
        raise RestError(e.code, parsed) from None


def am_control_headers(cluster: Any, am_url: str) -> dict[str, str]:
    """The Authorization header a PS AM's /scale and /checkpoint need: an AM-control token signed
    with the job's secret, which whoever holds the cluster secret (the RM, an operator, this test)
    can derive from the attempt id the AM's readable /status shows."""
    with urllib.request.urlopen(am_url.rstrip("/") + "/status", timeout=15) as r:
        attempt_id = json.loads(r.read())["attempt_id"]
    return tokens.bearer(tokens.am_control_token(tokens.job_secret(cluster.secret, attempt_id), attempt_id))


def submit_app(base_url: str, submission: dict[str, Any], user: str = "alice") -> str:
    """new-application + POST /apps as `user`; returns the application id."""
    new = rest(base_url, "POST", "/ws/v1/cluster/apps/new-application", user=user)
    app_id = new["application-id"]
    rest(base_url, "POST", "/ws/v1/cluster/apps", dict(submission, **{"application-id": app_id}), user=user)
    return app_id


def get_app(base_url: str, app_id: str) -> dict[str, Any]:
    return rest(base_url, "GET", f"/ws/v1/cluster/apps/{app_id}")["app"]


def kill_unless_final(base_url: str, app_id: str) -> None:
    """Kill `app_id` (as its owner, alice) unless it has ended: a test's `finally`, so that no job
    is left training whatever the test did."""
    if get_app(base_url, app_id)["state"] not in FINAL_STATES:
        rest(base_url, "PUT", f"/ws/v1/cluster/apps/{app_id}/state", {"state": "KILLED"}, user="alice")


def am_status(cluster: Any, app_id: str) -> PsStatus | None:
    """A running PS job's status from its AM (the app's tracking URL), decoded as the PsStatus it
    is, or None while there is none to ask: not RUNNING yet or any more, or the AM not answering
    (starting, restarting, gone). An answer that is no PsStatus fails the test."""
    return running_status(get_app(cluster.rm_url, app_id))


def restarted_and_trained_on(cluster: Any, app_id: str) -> PsStatus | None:
    """The job's AM status once its first shape change is a kill-based restart that changed the
    shape and the job has trained two epochs past it, else None (a `wait_until` condition)."""
    st = am_status(cluster, app_id)
    first = st.shape_history[0] if st and st.shape_history else None
    if st is None or not isinstance(first, KillRestartChange) or not first.changed or not isinstance(first.epoch, int):
        return None
    return st if (st.epoch or 0) >= first.epoch + 2 else None


def wait_app(base_url: str, app_id: str, states: tuple[str, ...] = FINAL_STATES,
             timeout_s: float = 60.0) -> dict[str, Any]:
    """Poll GET /apps/{id} until its state is one of `states`; fails with the last report on timeout.
    Reaching a different final state fails at once."""
    last: dict[str, Any] = {}

    def reached() -> dict[str, Any] | None:
        app = get_app(base_url, app_id)
        last.update(app)
        if app["state"] in states:
            return app
        if app["state"] in FINAL_STATES:
            raise AssertionError(f"{app_id} ended {app['state']}/{app.get('finalStatus')} "
                                 f"while waiting for {states}: {app.get('diagnostics')}")
        return None
    try:
        return wait_until(reached, timeout_s, f"{app_id} in {states}")
    except AssertionError as e:
        e.add_note(f"last report: {last}")
        raise


def app_post_mortem(cluster: Any, app_id: str, lines: int = 60) -> str:
    """What a failed cluster test should show: the app's state and diagnostics, and the tail of each
    of its AM attempts' stderr (the NM's container log)."""
    try:
        app = get_app(cluster.rm_url, app_id)
        out = [f"{app_id}: {app['state']}/{app.get('finalStatus')}: {app.get('diagnostics')}"]
    except Exception as e:  # noqa: BLE001 - the RM itself may be the problem
        out = [f"{app_id}: no report from the RM ({e})"]
    for log in sorted(Path(cluster.base_dir).glob(f"nm*/logs/{app_id}/container_*_000001/stderr")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        out += [f"--- {log}", *tail]
    return "\n".join(out)


# ===== process inspection (what the NMs really left running) =====================================

def pids_with_env(name: str, value: str) -> list[int]:
    """Live (non-zombie) processes whose environment has name=value, e.g. APPLICATION_ID=<app>.
    A container forked warm from an NM's zygote keeps the zygote's initial environment in /proc;
    it shows its container identity (CONTAINER_ID, APPLICATION_ID) in its process title instead
    (`warm_pids_with`), which counts here too."""
    return sorted(set(_pids_where(name, value, in_env=True)) | set(warm_pids_with(name, value)))


def warm_pids_with(name: str, value: str) -> list[int]:
    """Live warm-started executors (forked from an NM's zygote) whose title names name=value."""
    return _pids_where(name, value, in_env=False)


def _pids_where(name: str, value: str, in_env: bool) -> list[int]:
    needle = f"{name}={value}".encode()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            raw = (d / ("environ" if in_env else "cmdline")).read_bytes()
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        found = (needle in raw.split(b"\0") if in_env else
                 b"psruntime.executor" in raw and needle in raw.replace(b"\0", b" ").split())
        if state != "Z" and found:
            out.append(int(d.name))
    return out


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def cpu_seconds(pid: int) -> float:
    """utime + stime of one live process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ===== a real S3 server (tests/support/s3_server.py) =============================================

@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """SeaweedFS S3 on loopback, one for the session (stopped by its pid at the end); the tests
    that use it skip, naming why, where the `weed` binary or s3fs is not installed."""
    import s3_server as s3mod  # noqa: PLC0415  # imports s3fs lazily; a plain test run never loads it

    reason = s3mod.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    server = s3mod.start_s3_server(tmp_path_factory.mktemp("s3"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A fresh bucket on the session's S3 server (an s3_server.S3Bucket: endpoint_url, bucket, env,
    url(*parts)), with its credentials and endpoint in os.environ for the test -- so code under
    test, and daemons the test starts, reach it as a cluster's processes do."""
    import s3_server as s3mod  # noqa: PLC0415

    for k, v in s3_server.env.items():
        monkeypatch.setenv(k, v)
    s3mod.forget_cached_filesystems()
    try:
        yield s3mod.S3Bucket(s3_server, s3_server.create_bucket())
    finally:
        s3mod.forget_cached_filesystems()


# ===== a real etcd (tests/support/etcd_server.py) ================================================

@pytest.fixture
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A fresh one-member etcd on loopback per test (an etcd_server.EtcdServer: endpoint, stop(),
    restart()), stopped by its pid after the test; tests that use it skip, naming why, where the
    etcd binary or the aetcd client is not installed. Per test, not per session: tests stop and
    restart it, and each election must start from an empty keyspace."""
    import etcd_server as etcdmod  # noqa: PLC0415

    reason = etcdmod.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    server = etcdmod.start_etcd_server(tmp_path_factory.mktemp("etcd"))
    try:
        yield server
    finally:
        server.stop()
