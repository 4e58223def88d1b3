"""The block manifest of a checkpoint is a typed record: written as BlockManifest, read back as
one (format 1 entries still read), and a manifest missing its block count is refused."""
from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest

from protocol.checkpoint_manifest import (BlockManifest, JobCheckpoint, decode_job_checkpoint,
                                          encode_job_checkpoint)
from psruntime.store.block_store import BlockArrays
from psruntime.store.checkpoint import CheckpointError, load_manifests, read_block, write_block, write_manifest


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
    rec = JobCheckpoint(epoch=3, clock=5, time=1.5e9, num_blocks=4,
                        table={"num_blocks": 4, "owners": [0, 1, 0, 1], "addresses": {}, "version": 2},
                        servers=["e1", "e2"], worker_state=True, spec={"app": "mlr"}, attempt_id="a1",
                        initial_objective=2.0, objective_history=[{"epoch": 0, "objective": 1.0}],
                        shape_history=[{"workers": 1}], iterations=30, clocks=6, minibatches_run=120,
                        objective=0.5, reason="pause", positions={"0": [1, 20]})
    assert decode_job_checkpoint(encode_job_checkpoint(rec)) == rec


def test_an_old_job_json_decodes_with_defaults_and_unknown_fields_ignored() -> None:
    # as an AM before resumable checkpoints wrote it, plus a field this version does not know
    old = b'{"epoch": 2, "time": 1700000000.0, "num_blocks": 4, "table": {"num_blocks": 4}, "servers": ["e1"], ' \
          b'"spec": {"app": "mlr"}, "objective": 0.75, "future_field": [1, 2]}'
    rec = decode_job_checkpoint(old)
    assert (rec.epoch, rec.clock, rec.objective, rec.servers, rec.worker_state) == (2, 0, 0.75, ["e1"], False)
    assert rec.objective_history is None and rec.iterations is None and rec.positions is None
    with pytest.raises(msgspec.DecodeError):
        decode_job_checkpoint(b'{"clock": 1}')            # no epoch: not a checkpoint record
    with pytest.raises(msgspec.DecodeError):
        decode_job_checkpoint(b'{"epoch": 1, "clo')       # torn
