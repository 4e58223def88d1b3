"""A PS job's model output (`output`) and warm start (`init_from`) on the AM (docs/model_output.md).

Output: the AM already gathers every server block into a checkpoint directory (appmaster.ps.
checkpoints); `ModelOutput` assembles the dense model from that directory's blocks and writes it,
with its metadata, to `<output>/epoch-N/` after each checkpoint (checkpoint_every_epochs) and to
`<output>/final/` once the final held-out score is known -- no second path to the servers.
With it go the job's shipped files (`resources`: code, data files, archives) as they are linked
in the AM's working dir, so the model can be scored where the job's containers are gone
(`job_files`): a file is copied into `files/`, an archive or a big file referenced by its URL,
size and timestamp.

Warm start: `read_init_from` checks the saved model against this job's app and shape (the RM
checked it at submission only if it could read it) and `warm_start` puts its values onto the
servers once they initialised their keys, before the initial objective is taken, so training
begins from the saved model.
"""
from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import os
import time
from pathlib import Path
from typing import Mapping, Optional, Sequence

import msgspec
import numpy as np

from protocol.dataset_manifest import recorded_data_spec
from protocol.durable_storage import DurableDir, local_path
from protocol.local_resources import LocalResource
from protocol.model_output import (FILES_DIR, FINAL_DIR, AppRef, ModelFile, ModelMetadata, ModelOutputError, epoch_dir,
                                   finite_or_none, locate, mismatch, read_metadata)
from protocol.ps_job_spec import PSJobSpec
from protocol.shape_history import ShapeChange
from psruntime.apps.base import AnyPSApp
from psruntime.store.checkpoint import load_blocks
from psruntime.store.model_files import model_from_blocks, read_values, uncommit, write_model
from psruntime.store.store_client import StoreClient

from .training import Training

log = logging.getLogger(__name__)


def elastane_version() -> str:
    try:
        return importlib.metadata.version("elastane")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def app_ref(app: AnyPSApp) -> AppRef:
    """The app's name, class ("module:Class") and version (a `version` string attribute, if it has one)."""
    cls = type(app)
    version = getattr(cls, "version", None)
    return AppRef(name=app.name, cls=f"{cls.__module__}:{cls.__qualname__}",
                  version=version if isinstance(version, str) else None)


# A shipped file up to this size is copied into every model directory; a bigger one, and every
# archive (an unpacked tree, often a whole environment or data set), is referenced by its URL, size
# and timestamp instead: copies of it in each epoch-N directory would multiply the output's size.
COPY_MAX_BYTES = 64 * 2**20


def _source_stat(url: str) -> tuple[int, int]:
    """(size, mtime in ms) of a resource's source when it is a local path here, else (-1, -1)."""
    path = local_path(url)
    if path is None:
        return -1, -1
    try:
        st = os.stat(path)
    except OSError:
        return -1, -1
    return st.st_size, st.st_mtime_ns // 1_000_000


def job_files(resources: Mapping[str, LocalResource], work_dir: Path,
              copy_max_bytes: int = COPY_MAX_BYTES) -> list[ModelFile]:
    """What the model keeps of the job's shipped files, by link name: a FILE linked in `work_dir`
    (the AM's working dir: the AM container localizes every resource of the job) of at most
    `copy_max_bytes` is copied; any other resource is referenced by its URL with the size and
    timestamp its source has (the client's, or else read from a local source now). The AM cannot
    know which of them the app's code opens on which host, so each is kept."""
    out: list[ModelFile] = []
    for name, res in sorted(resources.items()):
        linked = work_dir / name
        if res.type == "FILE" and linked.is_file():
            size = linked.stat().st_size
            if size <= copy_max_bytes:
                out.append(ModelFile(name=name, size=size, copied=True))
                continue
        size, mtime = res.size, res.timestamp
        if size < 0 or mtime < 0:
            seen_size, seen_mtime = _source_stat(res.resource)
            size, mtime = (size if size >= 0 else seen_size), (mtime if mtime >= 0 else seen_mtime)
        out.append(ModelFile(name=name, type=res.type, size=size, copied=False, resource=res.resource,
                             timestamp=mtime, pattern=res.pattern))
    return out


class ModelOutput:
    """Writes the job's model to its `output` location (see the module doc). `work_dir`: where the
    job's resources are linked (the AM container's working dir, its cwd)."""

    def __init__(self, spec: PSJobSpec, app: AnyPSApp, attempt_id: str, work_dir: Optional[Path] = None) -> None:
        self.spec = spec
        self.app = app
        self.attempt_id = attempt_id
        self.root = DurableDir(spec.output)
        self.work_dir = Path.cwd() if work_dir is None else work_dir
        self.files = job_files(spec.resources, self.work_dir)
        self.written: list[str] = []          # URLs of the model directories written

    def metadata(self, kind: str, epoch: int, objectives: Sequence[float], initial: Optional[float],
                 heldout: Optional[dict[str, float]], heldout_epoch: Optional[int],
                 shape_history: list[ShapeChange]) -> ModelMetadata:
        app = self.app
        return ModelMetadata(
            files=list(self.files),
            kind="final" if kind == "final" else "checkpoint", epoch=epoch, app=app_ref(app),
            num_keys=app.num_keys, key_length=app.key_length,
            data=recorded_data_spec(self.spec.app, msgspec.to_builtins(app.spec)),
            hparams=msgspec.to_builtins(app.hparams), preset=self.spec.preset,
            maximize=bool(app.maximize),
            objective=finite_or_none(objectives[epoch - 1]) if 0 < epoch <= len(objectives) else finite_or_none(initial),
            initial_objective=finite_or_none(initial),
            objective_history=[finite_or_none(o) for o in objectives[:epoch]],
            heldout_metrics={k: finite_or_none(v) for k, v in (heldout or {}).items()}, heldout_epoch=heldout_epoch,
            shape_history=list(shape_history), job=self.spec.to_json(), attempt_id=self.attempt_id,
            elastane_version=elastane_version(), written_at=time.time())

    def put_files(self, target: DurableDir, meta: ModelMetadata) -> None:
        """Copy the job's files `meta` says are copied into the model directory `target`'s files/
        (blocking)."""
        copied = [self.work_dir / f.name for f in meta.files if f.copied]
        uncommit(target)        # a model written there before is incomplete until write_model ends
        if copied:
            files = target.child(FILES_DIR)
            files.makedirs()
            files.put_files(copied)     # by link name: a link's target may be named otherwise

    async def write(self, checkpoint_dir: str, meta: ModelMetadata) -> str:
        """Write the model of the (local) checkpoint directory with `meta` to `<output>/final/` or
        `<output>/epoch-N/`; returns its URL. ModelOutputError / OSError name what failed."""
        target = self.root.child(FINAL_DIR if meta.kind == "final" else epoch_dir(meta.epoch))

        def run() -> None:
            blocks = load_blocks(Path(checkpoint_dir), self.spec.num_blocks)
            self.put_files(target, meta)    # before write_model: its metadata.json, written last, commits the dir
            write_model(target, model_from_blocks(blocks, meta.num_keys, meta.key_length), meta)

        t0 = time.perf_counter()
        try:
            await asyncio.to_thread(run)
        except (OSError, ValueError) as e:    # ValueError: CheckpointError, ModelOutputError, storage errors
            raise ModelOutputError(f"output: could not write the model to {target.url}: {e}") from e
        self.written.append(target.url)
        log.info("model of epoch %d written to %s in %.3fs", meta.epoch, target.url, time.perf_counter() - t0)
        return target.url


def read_init_from(url: str, app: AnyPSApp) -> tuple[ModelMetadata, np.ndarray]:
    """The saved model `init_from` names, checked against the job's app and model shape;
    ModelOutputError naming `init_from` and what is wrong (blocking: run it in a thread)."""
    try:
        d = locate(url)
        meta = read_metadata(d)
        why = mismatch(meta, d.url, app.name, (app.num_keys, app.key_length))
        if why is not None:
            raise ModelOutputError(why)
        return meta, read_values(d, meta)
    except (OSError, ModelOutputError) as e:
        raise ModelOutputError(f"init_from: {e}") from None


async def warm_start(training: Training, values: np.ndarray) -> float:
    """Replace the servers' initial values with `values` (every model key) and take the initial
    objective again; returns it. Call after `Training.setup`, before any epoch."""
    app = training.app
    store = StoreClient(training.placement.table, training.evaluation.client)
    await store.put_array(app.model_keys(), np.asarray(values, np.float32))
    initial = await training.evaluation.objective()
    training.metrics.initial_objective = initial
    log.info("warm start: %d keys from the saved model; initial objective %.6g", app.num_keys, initial)
    return initial
