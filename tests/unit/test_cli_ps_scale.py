"""`elastane ps scale` against a fake RM and AM that serve what the PS AM really reports: its shape
history entries are made by the AM's own record types (appmaster.ps.eps_records, directives), so a
key the command reads that the AM does not write shows up here, not on a cluster."""
from __future__ import annotations

from typing import Any, cast

import msgspec
import pytest

from appmaster.ps.eps_records import ElasticOpRecord
from elastane_cli import main as cli
from elastane_cli import ps_scale_command
from elastane_cli.ps_reports import shape_change
from protocol.ps_status import DirectiveRecord, EpsLimits, EpsStatus, ExecutorStatus, PsStatus, ShapeStatus
from protocol.shape_history import EpsChange, ExecutorCounts
from threaded_http import serve_routes

APP = "application_1700000000000_0007"
APPS = "/ws/v1/cluster/apps"


def add_workers_record() -> EpsChange:
    """What the AM records for `add_workers(2)` taking a 2-worker, 1-server job to 4 workers."""
    rec = ElasticOpRecord(op="add_workers", requested=2, started=1_700_000_100.0, epoch_started=3,
                          workers_before=2, servers_before=1, workers_after=4, servers_after=1,
                          epoch_switched=4, duration_s=1.23456, containers_added=["c_5", "c_6"],
                          splits_moved=6, training_time_lost_s=0.0421)
    return rec.to_history()


def test_a_shape_change_reads_what_the_am_records() -> None:
    c = shape_change(add_workers_record())
    assert (c.op, c.requested, c.before, c.after) == ("add_workers", 2, (2, 1), (4, 1))
    assert c.seconds == pytest.approx(1.2346) and c.lost_s == pytest.approx(0.0421)
    assert c.moved == "6 splits" and c.containers == 2 and c.error == ""
    assert c.shape_text == "2/1 -> 4/1"
    failed = ElasticOpRecord(op="remove_servers", requested=1, started=0.0, epoch_started=1, workers_before=2,
                             servers_before=2, workers_after=2, servers_after=2, duration_s=0.5,
                             error="executor server-1 failed").to_history()
    assert ps_scale_command.change_rows([failed]) == [
        ["remove_servers (failed: executor server-1 failed)", 1, "2/2", "0.50s", "-", "0.000s", "+0"]]


class FakeRmAndAm:
    """The RM's app and shape endpoints and, at /am/status, the AM's status: a 2-worker, 1-server
    job that, once the RM has its directive, reports the directive done and the change it made."""

    def __init__(self, rm_lag: int = 0) -> None:
        self.address = ""
        self.put: dict[str, Any] | None = None
        # The RM's record of the job lags: its AM's report after the change arrives only after the
        # RM's shape has been read `rm_lag` times since the change ended.
        self.rm_lag = rm_lag
        self.rm_reads: list[dict[str, Any]] = []

    def rm_shape(self) -> dict[str, Any]:
        done = self.put is not None and len(self.rm_reads) >= self.rm_lag
        current = {"workers": 4 if done else 2, "servers": 1, "directive_version": 1 if done else 0,
                   "changing": False}
        self.rm_reads.append(current)
        return {"shape": {"appId": APP, "current": current}}

    def status(self) -> dict[str, Any]:
        """The AM's /status as the AM builds it (a PsStatus), served as JSON."""
        executors = ([ExecutorStatus(id=f"worker-{i}", role="worker", state="READY") for i in range(4 if self.put else 2)]
                     + [ExecutorStatus(id="server-0", role="server", state="READY")])
        status = PsStatus(shape=ShapeStatus(executors=executors),
                          eps=EpsStatus(running=False, limits=EpsLimits(workers=8, servers=4)))
        if self.put is not None:
            status.shape_history = [add_workers_record()]
            status.directives = [DirectiveRecord(version=1, workers=4, servers=1, before=ExecutorCounts(2, 1),
                                                 steps=[("add_workers", 2)], started=1_700_000_100.0, seconds=1.3)]
        return cast(dict[str, Any], msgspec.to_builtins(status))

    def route(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        if method == "GET" and path == f"{APPS}/{APP}":
            return 200, {"app": {"id": APP, "applicationType": "ELASTANE_PS", "state": "RUNNING",
                                 "trackingUrl": f"http://{self.address}/am/"}}
        if method == "PUT" and path == f"{APPS}/{APP}/shape":
            self.put = body
            return 200, {"shape": {"directive": {"version": 1, "workers": body["workers"],
                                                 "servers": body["servers"]}}}
        if method == "GET" and path == f"{APPS}/{APP}/shape":
            return 200, self.rm_shape()
        if method == "GET" and path == "/am/status":
            return 200, self.status()
        return 404, None


def test_scale_prints_the_change_the_am_made(capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ps_scale_command, "POLL_S", 0.01)
    fake = FakeRmAndAm()
    with serve_routes(fake.route, ("GET", "PUT")) as address:
        fake.address = address
        code = cli.main(["--rm", f"http://{address}", "ps", "scale", APP, "--workers", "+2"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert fake.put is not None and (fake.put["workers"], fake.put["servers"]) == (4, 1)
    header, row = [ln.split() for ln in out.splitlines() if ln.strip() and not set(ln) <= {"-", " "}]
    assert header == ["FUNCTION", "N", "WORKERS/SERVERS", "TOOK", "MOVED", "TRAINING-WAITED", "CONTAINERS"]
    assert row == ["add_workers", "2", "2/1", "->", "4/1", "1.23s", "6", "splits", "0.042s", "+2"]
    assert "None" not in out


def test_scale_returns_once_the_rms_record_has_the_new_shape(capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The AM is done before the RM has heard of it: the command waits for the RM's record, so the
    app read back after it returns has the new shape."""
    monkeypatch.setattr(ps_scale_command, "POLL_S", 0.01)
    fake = FakeRmAndAm(rm_lag=3)
    with serve_routes(fake.route, ("GET", "PUT")) as address:
        fake.address = address
        code = cli.main(["--rm", f"http://{address}", "ps", "scale", APP, "--workers", "+2"])
        after = fake.rm_shape()["shape"]["current"]
    out, err = capsys.readouterr()
    assert code == 0, err
    assert [r["workers"] for r in fake.rm_reads[:3]] == [2, 2, 2]     # read while the RM lagged ...
    assert fake.rm_reads[3]["workers"] == 4 and after["workers"] == 4  # ... and returned on the new shape
    assert len(fake.rm_reads) == 5                                   # the command's 4 reads and ours
    assert not ps_scale_command.rm_has_shape({"current": {"directive_version": 1, "changing": True}}, 1)
    assert not ps_scale_command.rm_has_shape({"current": None}, 1)
    assert ps_scale_command.rm_has_shape({"current": {"directive_version": 2, "changing": False}}, 1)
