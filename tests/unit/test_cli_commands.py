"""The `elastane` commands against a scripted fake RM + NM speaking YARN's REST API."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

import pytest

from elastane_cli import app_commands
from elastane_cli import main as cli
from threaded_http import serve_routes

APP = "application_1700000000000_0001"
AM = "container_1700000000000_0001_01_000001"
WORKER = "container_1700000000000_0001_01_000002"
OTHER = "container_1700000000000_0002_01_000002"


@dataclass
class FakeYarn:
    """RM and NM REST endpoints on one port; apps finish after `polls_to_finish` GETs."""

    address: str = ""
    apps: dict[str, dict[str, Any]] = field(default_factory=dict)
    queries: list[dict[str, list[str]]] = field(default_factory=list)
    submissions: list[dict[str, Any]] = field(default_factory=list)
    polls_to_finish: int = 2
    seq: int = 1
    health_report: str = ""         # the node's; non-empty: it is UNHEALTHY

    def route(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        self.queries.append(query)
        base = "/ws/v1/cluster/apps"
        if method == "GET" and path == "/ws/v1/cluster/nodes":
            return 200, {"nodes": {"node": [{
                "id": "127.0.0.1:40001", "state": "UNHEALTHY" if self.health_report else "RUNNING",
                "nodeHTTPAddress": self.address, "numContainers": 2,
                "usedMemoryMB": 512, "availMemoryMB": 1536, "usedVirtualCores": 1, "availableVirtualCores": 1,
                "lastHealthUpdate": 0, "healthReport": self.health_report}]}}
        if method == "GET" and path == base:
            states = query.get("states", [""])[0].split(",")
            apps = [a for a in self.apps.values() if not states[0] or a["state"] in states]
            return 200, {"apps": {"app": apps} if apps else None}
        if method == "POST" and path == base + "/new-application":
            app_id = f"application_1700000000000_{self.seq:04d}"
            self.seq += 1
            return 200, {"application-id": app_id, "maximum-resource-capability": {"memory": 2048, "vCores": 2}}
        if method == "POST" and path == base:
            if body.get("queue") == "nope":
                return 400, _remote("BadRequestException", "queue 'nope' does not exist")
            self.submissions.append(body)
            cmd = body["am-container-spec"]["commands"]["command"]
            self.apps[body["application-id"]] = {
                "id": body["application-id"], "name": body["application-name"], "user": query["user.name"][0],
                "queue": body["queue"], "state": "ACCEPTED", "finalStatus": "UNDEFINED", "progress": 0.0,
                "polls": 0, "fails": " false" in cmd or cmd.endswith("false"), "elapsedTime": 1500}
            return 202, None
        if path.startswith(base + "/"):
            parts = path[len(base) + 1:].split("/")
            app = self.apps.get(parts[0])
            if app is None:
                return 404, _remote("NotFoundException", f"app with id: {parts[0]} not found")
            if method == "GET" and len(parts) == 1:
                self._advance(app)
                return 200, {"app": {k: v for k, v in app.items() if k not in ("polls", "fails")}}
            if method == "GET" and parts[1:] == ["appattempts"]:
                return 200, {"appAttempts": {"appAttempt": [
                    {"id": 1, "containerId": AM, "nodeHttpAddress": self.address}]}}
            if method == "PUT" and parts[1:] == ["state"]:
                if body != {"state": "KILLED"}:
                    return 400, _remote("BadRequestException", "state must be KILLED")
                app.update(state="KILLED", finalStatus="KILLED")
                return 202, {"state": "KILLED"}
        if method == "GET" and path == "/ws/v1/node/containers":
            return 200, {"containers": {"container": [{"id": WORKER}, {"id": OTHER}]}}
        if method == "GET" and path.startswith("/ws/v1/node/containerlogs/"):
            cid, file = path.rsplit("/", 2)[1:]
            if cid == OTHER:
                raise AssertionError("fetched a container of another app")
            return 200, f"{file} of {cid}\n"
        return 404, _remote("NotFoundException", f"no route {method} {path}")

    def _advance(self, app: dict[str, Any]) -> None:
        if app["state"] in ("FINISHED", "FAILED", "KILLED"):
            return
        app["polls"] += 1
        if app["polls"] >= self.polls_to_finish:
            app.update(state="FINISHED", progress=100.0,
                       finalStatus="FAILED" if app["fails"] else "SUCCEEDED",
                       diagnostics="container_..._000002 exited with 1" if app["fails"] else "")
        else:
            app.update(state="RUNNING", progress=50.0)


def _remote(exc: str, msg: str) -> dict[str, Any]:
    return {"RemoteException": {"exception": exc, "message": msg, "javaClassName": "x"}}


@pytest.fixture
def yarn() -> Iterator[FakeYarn]:
    fake = FakeYarn()

    with serve_routes(lambda *request: fake.route(*request)) as address:   # late: tests may patch route
        fake.address = address
        yield fake


@pytest.fixture(autouse=True)
def fast_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(app_commands, "POLL_S", 0.01)


def run(yarn: FakeYarn, argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = cli.main(["--rm", f"http://{yarn.address}", "--user", "alice", *argv])
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def _submit(yarn: FakeYarn, cmd: str = "true") -> str:
    app_id = f"application_1700000000000_{yarn.seq:04d}"
    yarn.seq += 1
    yarn.apps[app_id] = {"id": app_id, "name": "x", "user": "alice", "queue": "default", "state": "RUNNING",
                         "finalStatus": "UNDEFINED", "progress": 10.0, "polls": 0, "fails": False,
                         "startedTime": 1_700_000_000_000, "elapsedTime": 65_000}
    return app_id


def test_node_list_table(yarn: FakeYarn, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(yarn, ["node", "list"], capsys)
    assert code == 0
    header, row, total = out.splitlines()
    assert header.split() == ["NODE-ID", "STATE", "HTTP-ADDRESS", "CONTAINERS", "MEM-USED/TOTAL(MB)",
                              "VCORES-USED/TOTAL", "LAST-HEARTBEAT"]
    assert row.split() == ["127.0.0.1:40001", "RUNNING", yarn.address, "2", "512/2048", "1/2", "-"]
    assert total == "Total nodes: 1"


def test_node_list_details_add_the_health_report(yarn: FakeYarn, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(yarn, ["node", "list", "--show-details"], capsys)
    assert code == 0
    header, row, _total = out.splitlines()
    assert header.split()[-1] == "HEALTH-REPORT" and row.split()[-1] == "-"      # healthy: no report
    yarn.health_report = "local dirs are bad: /d: 95.0% full\nhealth script: ERROR: fan"
    code, out, _ = run(yarn, ["node", "list", "--show-details"], capsys)
    assert code == 0
    row = out.splitlines()[1]
    assert "UNHEALTHY" in row and row.endswith("local dirs are bad: /d: 95.0% full; health script: ERROR: fan")


def test_app_list_filters_and_user(yarn: FakeYarn, capsys: pytest.CaptureFixture[str]) -> None:
    app_id = _submit(yarn)
    code, out, _ = run(yarn, ["app", "list", "--state", "running,accepted", "--queue", "default",
                              "--user", "bob", "--limit", "5"], capsys)
    assert code == 0
    q = yarn.queries[-1]
    assert q["states"] == ["RUNNING,ACCEPTED"] and q["queue"] == ["default"] and q["user"] == ["bob"]
    assert q["limit"] == ["5"] and q["user.name"] == ["alice"]
    lines = out.splitlines()
    assert lines[0].split()[0] == "APPLICATION-ID" and lines[1].split()[0] == app_id
    assert "1m05s" in lines[1] and lines[-1] == "Total applications: 1"
    code, out, _ = run(yarn, ["app", "list", "--state", "KILLED"], capsys)
    assert code == 0 and out.splitlines()[-1] == "Total applications: 0"


def test_app_status_and_not_found(yarn: FakeYarn, capsys: pytest.CaptureFixture[str]) -> None:
    app_id = _submit(yarn)
    code, out, _ = run(yarn, ["app", "status", app_id], capsys)
    assert code == 0
    fields = dict(line.split(" : ", 1) for line in out.splitlines())
    assert fields["Application-Id    "].strip() == app_id and "RUNNING" in fields["State             "]
    code, out, err = run(yarn, ["app", "status", "application_1700000000000_0099"], capsys)
    assert code == 2
    assert err.strip() == "elastane: error: app with id: application_1700000000000_0099 not found"


def test_app_kill(yarn: FakeYarn, capsys: pytest.CaptureFixture[str]) -> None:
    app_id = _submit(yarn)
    code, out, _ = run(yarn, ["app", "kill", app_id], capsys)
    assert code == 0 and f"Killed application {app_id}" in out
    assert yarn.apps[app_id]["state"] == "KILLED"
    code, out, _ = run(yarn, ["app", "kill", app_id], capsys)
    assert code == 0 and "already finished: KILLED" in out


def test_app_logs_finds_the_apps_containers_only(yarn: FakeYarn, capsys: pytest.CaptureFixture[str]) -> None:
    _submit(yarn)
    code, out, _ = run(yarn, ["app", "logs", APP], capsys)
    assert code == 0
    assert f"=== {AM} on {yarn.address}: stdout ===\nstdout of {AM}\n" in out
    assert f"stderr of {WORKER}" in out and OTHER not in out
    code, out, _ = run(yarn, ["app", "logs", APP, "--container", WORKER, "--file", "stdout"], capsys)
    assert code == 0 and out == f"=== {WORKER} on {yarn.address}: stdout ===\nstdout of {WORKER}\n"
    code, _, err = run(yarn, ["app", "logs", APP, "--container", "container_1700000000000_0001_01_000007"],
                       capsys)
    assert code == 2 and "was not found on any node" in err


def test_app_run_succeeds_with_exit_0(yarn: FakeYarn, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(yarn, ["app", "run", "-n", "3", "--memory", "256", "--vcores", "1", "--name", "hello",
                              "--", "python", "-c", "print(42)"], capsys)
    assert code == 0, out
    sub = yarn.submissions[-1]
    assert sub["application-name"] == "hello" and sub["application-id"] == APP
    cmd = sub["am-container-spec"]["commands"]["command"]
    assert "--num-containers 3 --container-memory 256 --container-vcores 1" in cmd
    assert cmd.endswith("-- python -c 'print(42)'")
    lines = out.splitlines()
    assert lines[0] == f"Submitted application {APP}"
    assert any("RUNNING" in line and "progress  50%" in line for line in lines)
    assert lines[-1] == f"{APP} FINISHED with final status SUCCEEDED"


def test_app_run_failure_exits_1_with_diagnostics(yarn: FakeYarn, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(yarn, ["app", "run", "--", "false"], capsys)
    assert code == 1
    assert "FINISHED with final status FAILED" in out and "diagnostics: container_..._000002 exited" in out


def test_app_run_rejected_submission_exits_2(yarn: FakeYarn, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(yarn, ["app", "run", "--queue", "nope", "--", "true"], capsys)
    assert code == 2
    assert err.strip() == "elastane: error: queue 'nope' does not exist"
