"""The AM writes `<output>/epoch-N/` and `<output>/final/` from the checkpoint the controller
recorded for that epoch: not from the checkpointer's last write, which a taken-over attempt does
not have (its final model went unwritten) and which a failed checkpoint leaves at an older epoch
(published under the newer epoch's name and metadata)."""
from __future__ import annotations

import types
from typing import Any

import pytest

from appmaster.ps.runtime.master import PSApplicationMaster
from protocol.model_output import ModelOutputError
from protocol.ps_job_spec import validate
from protocol.ps_status import CheckpointInfo


class Recorder:
    def __init__(self) -> None:
        self.written: list[tuple[str, dict[str, Any]]] = []

    def metadata(self, kind: str, epoch: int, *_: object) -> dict[str, Any]:
        return {"kind": kind, "epoch": epoch}

    async def write(self, directory: str, meta: dict[str, Any]) -> str:
        self.written.append((directory, meta))
        return "url"


def master(checkpoints: list[tuple[int, str]], last: CheckpointInfo | None) -> tuple[PSApplicationMaster, Recorder]:
    am = PSApplicationMaster.__new__(PSApplicationMaster)
    am.spec = validate({"app": "mlr", "workers": 1, "servers": 1, "max_epochs": 20,
                        "checkpoint_every_epochs": 5, "output": "/tmp/elastane-test-output"})
    am.job = types.SimpleNamespace(checkpoints=checkpoints)       # type: ignore[assignment]
    am.checkpointer = types.SimpleNamespace(last=last)            # type: ignore[assignment]
    rec = Recorder()
    am.model_output = rec                                         # type: ignore[assignment]
    am.heldout = types.SimpleNamespace(tracker=types.SimpleNamespace(history=[]))  # type: ignore[assignment]
    am.metrics = types.SimpleNamespace(objectives=[1.0] * 10, initial_objective=2.0)  # type: ignore[assignment]
    am.final_metrics = None
    am.shape_history = []                                         # type: ignore[assignment]
    return am, rec


async def test_a_failed_checkpoint_publishes_no_epoch_dir_from_an_older_one() -> None:
    am, rec = master([(5, "/ck/epoch-5")], CheckpointInfo(epoch=5, clock=0, dir="/ck/epoch-5"))
    await am._write_output("checkpoint", 10)
    assert rec.written == []


async def test_an_epochs_checkpoint_is_published_from_its_own_dir() -> None:
    am, rec = master([(5, "/ck/epoch-5"), (10, "/ck/epoch-10")], CheckpointInfo(epoch=10, clock=0, dir="/ck/epoch-10"))
    await am._write_output("checkpoint", 10)
    assert rec.written == [("/ck/epoch-10", {"kind": "checkpoint", "epoch": 10})]


async def test_a_taken_over_attempt_writes_the_final_model_from_the_checkpoint_it_took_over() -> None:
    am, rec = master([(10, "/ck/epoch-10")], None)        # this attempt wrote no checkpoint itself
    await am._write_output("final", 10)
    assert rec.written == [("/ck/epoch-10", {"kind": "final", "epoch": 10})]


async def test_no_checkpoint_of_the_last_epoch_fails_the_final_output_by_name() -> None:
    am, rec = master([(5, "/ck/epoch-5")], CheckpointInfo(epoch=5, clock=0, dir="/ck/epoch-5"))
    with pytest.raises(ModelOutputError, match="no checkpoint of epoch 10"):
        await am._write_output("final", 10)
    assert rec.written == []
