"""Table, key-value and live status-line rendering of the CLI."""
from __future__ import annotations

import io

import pytest

from elastane_cli.node_commands import NODE_HEADERS, node_rows
from elastane_cli.status_line import StatusLine, format_status
from elastane_cli.tables import format_age, format_duration, render_key_values, render_table


def test_columns_align_and_numbers_right_align() -> None:
    text = render_table(["ID", "STATE", "N"], [["a", "RUNNING", 5], ["longer-id", "LOST", 12]])
    lines = text.splitlines()
    assert lines[0] == "ID         STATE    N"
    assert lines[1] == "a          RUNNING   5"
    assert lines[2] == "longer-id  LOST     12"
    # every column starts at the same offset on every line
    assert {line.index(w) for line, w in zip(lines, ["STATE", "RUNNING", "LOST"])} == {11}


def test_empty_table_is_just_the_header_and_bad_rows_are_refused() -> None:
    assert render_table(["A", "B"], []) == "A  B"
    with pytest.raises(ValueError, match="row 0 has 1 cells, expected 2"):
        render_table(["A", "B"], [["x"]])


def test_key_values_align_colons() -> None:
    assert render_key_values([("State", "RUNNING"), ("Final-State", None)]) == \
        "State       : RUNNING\nFinal-State : "


@pytest.mark.parametrize("s, text", [(0.04, "0.0s"), (3.25, "3.2s"), (65, "1m05s"), (7322, "2h02m")])
def test_durations(s: float, text: str) -> None:
    assert format_duration(s) == text


def test_node_rows_use_total_resource_or_used_plus_available() -> None:
    nodes = [
        {"id": "h:2", "state": "RUNNING", "nodeHTTPAddress": "h:8042", "numContainers": 2, "usedMemoryMB": 512,
         "availMemoryMB": 1536, "usedVirtualCores": 1, "availableVirtualCores": 1, "lastHealthUpdate": 1_000,
         "lastHeartbeat": 9_000},      # the heartbeat, not the last change of the health report
        {"id": "h:1", "state": "LOST", "nodeHTTPAddress": "h:8043", "numContainers": 0, "usedMemoryMB": 0,
         "usedVirtualCores": 0, "totalResource": {"memory": 1024, "vCores": 4}, "lastHealthUpdate": 0},
    ]
    rows = node_rows(nodes, now_ms=10_000)
    assert rows[0] == ["h:1", "LOST", "h:8043", 0, "0/1024", "0/4", "-"]
    assert rows[1] == ["h:2", "RUNNING", "h:8042", 2, "512/2048", "1/2", "1.0s ago"]
    assert len(render_table(NODE_HEADERS, rows).splitlines()) == 3
    assert format_age(4_000, now_ms=10_000) == "6.0s ago"


def test_status_line_text() -> None:
    app = {"id": "application_1_0001", "state": "RUNNING", "progress": 40.0, "finalStatus": "UNDEFINED"}
    assert format_status(app, 3.2) == "application_1_0001  RUNNING    progress  40%  elapsed 3.2s"
    done = dict(app, state="FINISHED", progress=100, finalStatus="SUCCEEDED")
    assert format_status(done, 61).endswith("elapsed 1m01s  final SUCCEEDED")


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_status_line_redraws_in_place_on_a_tty() -> None:
    out = _Tty()
    line = StatusLine(out)
    line.update("ACCEPTED long text")
    line.update("RUNNING")
    line.finish("FINISHED")
    # each frame starts with \r and blanks what the previous, longer frame left
    assert out.getvalue() == "\rACCEPTED long text\rRUNNING           \rFINISHED\n"


def test_status_line_prints_only_changes_on_a_pipe() -> None:
    out = io.StringIO()
    line = StatusLine(out)
    line.update("ACCEPTED 0.5s", key="ACCEPTED")
    line.update("ACCEPTED 1.0s", key="ACCEPTED")
    line.update("RUNNING 1.5s", key="RUNNING")
    line.finish("FINISHED 2.0s")
    assert out.getvalue() == "ACCEPTED 0.5s\nRUNNING 1.5s\nFINISHED 2.0s\n"
