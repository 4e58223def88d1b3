"""`elastane top`: the frame it renders from the RM's REST answers, and `--once` over HTTP."""
from __future__ import annotations

from typing import Any

import pytest

from elastane_cli import main as cli
from elastane_cli import top_command
from elastane_cli.top_command import APP_STATES, Snapshot, render_frame
from threaded_http import serve_routes

NOW = 1_700_000_600.0
INFO = {"startedOn": 1_700_000_000_000, "policy": "eps"}
METRICS = {"totalNodes": 3, "activeNodes": 2, "lostNodes": 1, "unhealthyNodes": 0, "appsRunning": 2,
           "appsSubmitted": 5, "appsPending": 1, "appsCompleted": 2, "appsKilled": 1, "appsFailed": 0,
           "availableMB": 2048, "allocatedMB": 1024, "totalMB": 3072, "availableVirtualCores": 4,
           "allocatedVirtualCores": 2, "totalVirtualCores": 6, "containersAllocated": 4, "containersPending": 1}
PS_APP = {"id": "application_1700000000000_0002", "user": "alice", "queue": "default", "state": "RUNNING",
          "runningContainers": 3, "allocatedMB": 512, "allocatedVCores": 3, "progress": 40.0, "elapsedTime": 65_000,
          "name": "mlr", "shape": {"workers": 2, "servers": 1, "changing": True, "speed": 2.345, "iterations": 1234,
                                   "epoch": 3, "objective": 0.41234}}
BIG_APP = {"id": "application_1700000000000_0001", "user": "bob", "queue": "default", "state": "RUNNING",
           "runningContainers": 1, "allocatedMB": 2048, "allocatedVCores": 1, "progress": 10.0, "elapsedTime": 5_000,
           "name": "shell"}


def _rows(frame: str) -> list[list[str]]:
    lines = frame.split("\n")
    start = next(i for i, ln in enumerate(lines) if ln.startswith("APPLICATIONID"))
    return [ln.split() for ln in lines[start + 1:]]


def test_frame_summary_and_apps_sorted_by_memory() -> None:
    frame = render_frame(Snapshot(INFO, METRICS, [PS_APP, BIG_APP]), NOW)
    lines = frame.split("\n")
    assert lines[0].endswith(", up 10m00s, policy eps")
    assert lines[1] == "NodeManager(s): 3 total, 2 active, 0 unhealthy, 1 lost"
    assert "2 running, 5 submitted, 1 pending, 2 completed, 1 killed, 0 failed" in lines[2]
    assert lines[3] == "Queue(s) Mem(GB): 2 available, 1 allocated, 3 total"
    rows = _rows(frame)
    assert [r[0] for r in rows] == [BIG_APP["id"], PS_APP["id"]]          # 2048 MB before 512 MB
    ps = rows[1]
    assert ps[4:13] == ["3", "0.5G", "3", "2/1*", "2.35", "it/s", "1,234", "3", "0.412"]
    assert rows[0][7:13] == ["-", "-", "-", "-", "-", "10"]               # no shape: dashes


def test_frame_other_sorts_and_width() -> None:
    by_speed = _rows(render_frame(Snapshot(INFO, METRICS, [BIG_APP, PS_APP]), NOW, sort="speed"))
    assert [r[0] for r in by_speed] == [PS_APP["id"], BIG_APP["id"]]
    narrow = render_frame(Snapshot(INFO, METRICS, [PS_APP]), NOW, width=30)
    assert max(len(ln) for ln in narrow.split("\n")) <= 30
    empty = render_frame(Snapshot({}, {}, []), NOW)
    assert "(no running or waiting applications)" in empty and "up" not in empty.split("\n")[0]


def test_top_once_prints_one_frame_from_the_rm(capsys: pytest.CaptureFixture[str]) -> None:
    queries: list[tuple[str, dict[str, list[str]]]] = []

    def route(method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        queries.append((path, query))
        answers = {"/ws/v1/cluster/info": {"clusterInfo": INFO}, "/ws/v1/cluster/metrics": {"clusterMetrics": METRICS},
                   "/ws/v1/cluster/apps": {"apps": {"app": [PS_APP]}}}
        return (200, answers[path]) if path in answers else (404, {})

    with serve_routes(route) as address:
        code = cli.main(["--rm", f"http://{address}", "top", "--once"])
    out = capsys.readouterr().out
    assert code == 0
    assert "\x1b[" not in out and out.startswith("elastane top - ")
    assert PS_APP["id"] in out and "2/1*" in out
    apps_query = next(q for p, q in queries if p == "/ws/v1/cluster/apps")
    assert apps_query["states"] == [APP_STATES]


def test_top_unreachable_rm_fails_with_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["--rm", "http://127.0.0.1:9", "top", "--once"])
    assert code == 1 and "cannot reach the ResourceManager" in capsys.readouterr().err


def test_top_redraws_in_place_until_interrupted(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    frames: list[float] = []

    async def pause(seconds: float) -> None:
        frames.append(seconds)
        if len(frames) == 2:
            raise KeyboardInterrupt      # Ctrl-C during the second wait

    monkeypatch.setattr(top_command, "pause", pause)

    def route(method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        return 200, {"/ws/v1/cluster/info": {"clusterInfo": INFO}, "/ws/v1/cluster/metrics": {"clusterMetrics": METRICS},
                     "/ws/v1/cluster/apps": {"apps": None}}[path]

    with serve_routes(route) as address:
        code = cli.main(["--rm", f"http://{address}", "top", "--interval", "0.5"])
    out = capsys.readouterr().out
    assert code == 0 and frames == [0.5, 0.5]
    assert out.count(top_command.HOME) == 2 and out.count(top_command.CLEAR_BELOW) == 2
    first = out.split(top_command.HOME)[1]
    assert first.startswith("elastane top - ") and "NodeManager(s): 3 total" in first
    assert all(line.endswith(top_command.CLEAR_LINE) for line in first.split("\n")[:-1])


@pytest.mark.parametrize("interval", ["0", "-1", "nan", "inf", "soon"])
def test_an_interval_that_is_not_a_positive_time_exits_2(interval: str, capsys: pytest.CaptureFixture[str]) -> None:
    # nan would poll the RM in a tight loop, a negative one was silently replaced
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--rm", "http://127.0.0.1:9", "top", "--interval", interval])
    assert exit_.value.code == 2 and "--interval must be" in capsys.readouterr().err
