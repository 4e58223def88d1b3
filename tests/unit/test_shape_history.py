"""protocol.shape_history: each kind of record keeps the JSON keys the AM's `/status` always had
(a key a record has only sometimes stays absent, not null), decodes back to the same Struct by
its `mode`, and reads as a row of `elastane ps scale`."""
from __future__ import annotations

import msgspec
import pytest

from appmaster.ps.eps_records import ElasticOpRecord
from elastane_cli.ps_scale_command import change_rows
from protocol import codec
from protocol.shape_history import (EpsChange, ExecutorCounts, KillRestartChange, RecoveryChange, ShapeChange,
                                    StragglerChange, SuspendChange, decode_change, decode_history, history_json)

TWO_ONE = ExecutorCounts(2, 1)


def pause() -> SuspendChange:
    return SuspendChange(op="pause", time=10.0, seconds=0.5, ok=True, epoch=3, clock=2, objective_before=0.4,
                         checkpoint="/am/ckpt-3")


def resume() -> SuspendChange:
    return SuspendChange(op="resume", time=20.0, seconds=1.25, ok=True, epoch=3, clock=2, objective_before=0.4,
                         objective_restored=0.4001, workers=3, servers=1, nodes=["n1"])


def failed_restart() -> KillRestartChange:
    """A kill-based restart that failed before its cut: no epoch, checkpoint or objectives."""
    return KillRestartChange(changed=False, phase="FAILED", before=TWO_ONE, workers=4, servers=1, time=30.0,
                             seconds=2.0, lost_s=2.0, steps={"pause": 0.5}, error="LaunchFailed: no room",
                             op="kill_restart", requested=2, after=ExecutorCounts(4, 1), duration_s=2.0,
                             training_time_lost_s=2.0, ok=False)


def recovery() -> RecoveryChange:
    return RecoveryChange(op="recover", time=40.0, lost=["worker-1 (node n2 lost)"], workers=2, servers=1,
                          checkpoint="/am/ckpt-2", epoch=2, epochs_redone=1, checkpoint_time=None, before=TWO_ONE,
                          after=TWO_ONE, changed=True, error="", seconds=3.0, duration_s=3.0, lost_s=3.0,
                          objective_restored=0.5)


def eps() -> EpsChange:
    return ElasticOpRecord(op="add_workers", requested=1, started=50.0, epoch_started=4, workers_before=2,
                           servers_before=1, workers_after=3, servers_after=1, duration_s=0.75,
                           containers_added=["c_9"], blocks_moved=0, splits_moved=4).to_history()


def test_optional_keys_are_absent_not_null_as_before() -> None:
    p, r, k = (msgspec.to_builtins(x) for x in (pause(), resume(), failed_restart()))
    assert p["mode"] == "suspend" and p["checkpoint"] == "/am/ckpt-3"
    assert not {"workers", "servers", "nodes", "objective_restored"} & p.keys()
    assert (r["workers"], r["servers"], r["nodes"]) == (3, 1, ["n1"]) and "checkpoint" not in r
    assert k["mode"] == "kill" and k["after"] == {"workers": 4, "servers": 1}
    assert not {"epoch", "checkpoint", "objective_before", "objective_restored"} & k.keys()
    assert msgspec.to_builtins(eps())["before"] == {"workers": 2, "servers": 1}


@pytest.mark.parametrize("make", [pause, resume, failed_restart, recovery, eps])
def test_each_kind_decodes_back_by_its_mode(make) -> None:
    rec = make()
    wire = codec.loads(codec.dumps({"shape_history": [rec]}))["shape_history"]     # as /status serves it
    assert wire == history_json([rec])
    assert decode_history(wire) == [rec] and type(decode_change(wire[0])) is type(rec)


def test_a_straggler_is_its_own_mode() -> None:
    rec = StragglerChange(op="replace", time=1.0, lost=["3x slower"], workers=2, servers=1, epoch=1, clock=0,
                          clock_redone=False, epochs_redone=0, before=TWO_ONE, after=TWO_ONE, changed=True, error="")
    assert msgspec.to_builtins(rec)["mode"] == "straggler"
    assert type(decode_change(msgspec.to_builtins(rec))) is StragglerChange


def test_records_a_reader_cannot_decode_are_left_out() -> None:
    good = history_json([pause()])[0]
    assert decode_history([{"workers": 1, "servers": 2}, {"mode": "teleport"}, good]) == [pause()]
    with pytest.raises(msgspec.ValidationError):
        decode_change({"mode": "teleport"})


def test_ps_scale_rows_for_every_kind() -> None:
    records: list[ShapeChange] = [eps(), failed_restart(), pause(), resume(), recovery()]
    assert change_rows(records) == [
        ["add_workers", 1, "2/1 -> 3/1", "0.75s", "4 splits", "0.000s", "+1"],
        ["kill_restart (failed: LaunchFailed: no room)", 2, "2/1 -> 4/1", "2.00s", "-", "2.000s", "+0"],
        ["pause", "-", "-", "0.50s", "-", "-", "+0"],
        ["resume", "-", "? -> 3/1", "1.25s", "-", "-", "+0"],
        ["recover", "-", "2/1", "3.00s", "-", "3.000s", "+0"]]
