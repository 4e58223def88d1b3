"""The records of a checkpoint directory are typed: the block manifest is written as BlockManifest
and read back as one (format 1 entries still read; one missing its block count is refused); the
job record, job.json, is a JobCheckpoint with its spec, table and histories typed, and job.json
files of earlier versions still load."""
from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest

from protocol.checkpoint_manifest import (BlockManifest, JobRecord, OwnershipTableRecord, decode_job_checkpoint,
                                          encode_job_checkpoint, job_checkpoint)
from protocol.ps_job_spec import validate
from protocol.ps_status import EpochResult
from protocol.shape_history import EpsChange, ExecutorCounts
from psruntime.store.block_store import BlockArrays
from psruntime.store.checkpoint import CheckpointError, load_manifests, read_block, write_block, write_manifest

DATA = Path(__file__).resolve().parent.parent / "data"


def test_written_and_read_as_the_typed_record(tmp_path: Path) -> None:
    data = BlockArrays(np.array([1, 5], np.int64), np.ones((2, 3)), ["audit"], [np.array([7])])
    entry = write_block(tmp_path, 3, data, durable=True)
    path = write_manifest(tmp_path, "exec-1", 8, 4, {3: entry})
    m = msgspec.json.decode(path.read_bytes(), type=BlockManifest)
    assert (m.format, m.num_blocks, m.table_version, list(m.blocks)) == (3, 8, 4, [3])
    merged = load_manifests(tmp_path, 8)
    back = read_block(tmp_path, 3, merged[3])
    assert back.keys.tolist() == [1, 5] and back.other_keys == ["audit"]
    with pytest.raises(CheckpointError, match="8 blocks"):
        load_manifests(tmp_path, 9)


def test_format_1_manifest_is_still_read(tmp_path: Path) -> None:
    (tmp_path / "block_0").mkdir()
    np.save(tmp_path / "block_0" / "0.npy", np.arange(3.0))
    (tmp_path / "manifest-e.json").write_text(
        '{"format": 1, "num_blocks": 2, "blocks": {"0": [[4, "block_0/0.npy"]]}}')
    entries = load_manifests(tmp_path, 2)
    assert read_block(tmp_path, 0, entries[0]).keys.tolist() == [4]


def test_a_manifest_without_its_block_count_is_unreadable(tmp_path: Path) -> None:
    (tmp_path / "manifest-e.json").write_text('{"format": 2, "blocks": {}}')
    with pytest.raises(CheckpointError, match="unreadable manifest"):
        load_manifests(tmp_path, 2)


def test_the_job_checkpoint_round_trips_as_its_typed_record() -> None:
    spec = validate({"app": "mlr", "workers": 2, "servers": 2})
    added = EpsChange(changed=True, op="add_workers", requested=1, before=ExecutorCounts(1, 2), workers=2, servers=2,
                      time=1.0, seconds=0.5, lost_s=0.1)
    job = JobRecord(spec=spec, attempt_id="a1", initial_objective=2.0,
                    objective_history=[EpochResult(epoch=0, objective=1.0, epoch_time_s=0.5, time=2.0)],
                    shape_history=[added], iterations=30, clocks=6, minibatches_run=120,
                    objective=0.5, reason="pause", positions={0: (1, 20)})
    table = OwnershipTableRecord(num_blocks=4, owners=["e1", "e2", "e1", "e2"], addresses={"e1": "h:1"}, version=2)
    rec = job_checkpoint(job, epoch=3, clock=5, time=1.5e9, num_blocks=4, table=table, servers=["e1", "e2"],
                         worker_state=True)
    back = decode_job_checkpoint(encode_job_checkpoint(rec))
    assert back == rec and back.spec == spec and back.shape_history == [added] and back.positions == {0: (1, 20)}
    assert msgspec.structs.asdict(back).keys() >= msgspec.structs.asdict(job).keys()


def test_a_job_json_of_the_previous_format_loads_typed() -> None:
    # written by the AM before the record was typed (job_record's dict, msgspec.convert'ed): the
    # spec as PSJobSpec.to_json, the table as OwnershipTable.to_wire, the histories as JSON, and a
    # non-finite objective as null
    rec = decode_job_checkpoint((DATA / "job_checkpoint_v1.json").read_bytes())
    assert (rec.epoch, rec.clock, rec.num_blocks, rec.servers, rec.worker_state) == (2, 3, 4, ["server-0", "server-1"],
                                                                                    False)
    assert rec.spec == validate({"app": "mlr", "workers": 2, "servers": 2, "max_epochs": 6})
    assert rec.table is not None and rec.table.owners == ["server-0", "server-1"] * 2
    assert rec.table.addresses == {"server-0": "h:1", "server-1": "h:2"}
    assert rec.objective_history is not None
    assert [(e.epoch, e.objective) for e in rec.objective_history] == [(0, 0.52), (1, 0.47), (2, None)]
    assert [type(c) for c in rec.shape_history] == [EpsChange] and rec.shape_history[0].splits_moved == 3
    assert (rec.iterations, rec.clocks, rec.minibatches_run, rec.reason) == (90, 9, 360, "pause")
    assert rec.positions == {0: (2, 40), 1: (2, 0)}


def test_an_old_job_json_decodes_with_defaults_and_unknown_fields_ignored() -> None:
    # as an AM before resumable checkpoints wrote it (a partial table, a spec of another version),
    # a shape change of a kind this version does not know, and a field it does not know
    old = b'{"epoch": 2, "time": 1700000000.0, "num_blocks": 4, "table": {"num_blocks": 4}, "servers": ["e1"], ' \
          b'"spec": {"app": "mlr", "retired_option": 1}, "objective": 0.75, "future_field": [1, 2], ' \
          b'"shape_history": [{"mode": "teleport", "to": "moon"}]}'
    rec = decode_job_checkpoint(old)
    assert (rec.epoch, rec.clock, rec.objective, rec.servers, rec.worker_state) == (2, 0, 0.75, ["e1"], False)
    assert rec.objective_history is None and rec.iterations is None and rec.positions is None
    assert rec.spec is None and rec.table is None and rec.shape_history == []
    with pytest.raises(msgspec.DecodeError):
        decode_job_checkpoint(b'{"clock": 1}')            # no epoch: not a checkpoint record
    with pytest.raises(msgspec.DecodeError):
        decode_job_checkpoint(b'{"epoch": 1, "clo')       # torn
    with pytest.raises(msgspec.DecodeError):
        decode_job_checkpoint(b'[1, 2]')                  # not an object
