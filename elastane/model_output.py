"""Reading a PS job's model output back (docs/model_output.md): `load_model(url)`.

    import elastane
    model = elastane.load_model("/shared/models/run1")      # its final/ (or any epoch-N/ directory)
    model.metadata.heldout_metrics, model.values.shape
    model.evaluate()                  # the app's held-out metrics on the job's own held-out data
    model.predict("/data/a9a")        # predictions for other data's held-out rows

The app is rebuilt from the metadata: a built-in app by name, any other by its "module:Class"
-- installed here, or from the code the model carries -- with the job's data spec and
hyper-parameters. The job's shipped files (its `resources`, metadata `files`) are laid out by link
name in one local directory, as in the job's working dir: the model's own `files/` when it is
local and carries them all, else a temporary copy (copied files fetched, referenced ones fetched
from their URL with their size and timestamp checked). The app's code runs with that directory
as the working dir, so a relative path it opens ("digits.npz") finds the file it found on the
cluster, from whatever directory the model is used.

What the app cannot read (a file gone, changed, not readable, a --data it cannot take) is a
ModelOutputError naming it: the CLI's exit code 2, never a traceback.
"""
from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence, TypeVar, Union

import msgspec
import numpy as np

from protocol.dataset_manifest import recorded_data_spec
from protocol.durable_storage import DurableDir, local_path
from protocol.json_types import JsonObject
from protocol.model_output import CODE_DIR, FILES_DIR, ModelMetadata, ModelOutputError, locate, read_metadata
from psruntime.apps.base import AnyPSApp, KeyValues, PSApp
from psruntime.apps.blocks import DataBlock
from psruntime.store.model_files import read_values

Data = Union[None, str, "os.PathLike[str]", DataBlock, Sequence[DataBlock]]
"""What predict / evaluate take: None (the job's own held-out data), a path (a built-in app's
dataset directory, or the file a user app's `DATA_PATH_FIELD` names: its held-out rows), or input
blocks."""

# The data spec field `--data` / a path `data` sets: a built-in app's dataset directory. A user
# app names its own with the class attribute DATA_PATH_FIELD (docs/app_api.md): `path` itself is
# the dataset directory format's, which the app loader reads for every app.
BUILTIN_DATA_FIELD = "path"
# The working dir is the process's: one app call with its job's files at a time.
_CWD_LOCK = threading.RLock()
T = TypeVar("T")


@contextlib.contextmanager
def in_job_dir(path: Optional[Path]) -> Iterator[None]:
    """Run the app's code with `path` (its job's files) as the working dir; no change for None."""
    if path is None:
        yield
        return
    with _CWD_LOCK:
        before = os.getcwd()
        os.chdir(path)
        try:
            yield
        finally:
            os.chdir(before)


def import_saved_code(d: DurableDir, meta: ModelMetadata) -> None:
    """A model written before `files`: make the user app's code it carries in code/ importable
    here, on sys.path directly when local, else fetched into a temporary dir first."""
    if not meta.code:
        return
    code = d.child(CODE_DIR)
    local = local_path(code.url)
    if local is None:
        fetched = _temp_dir("elastane-model-code-")
        code.get_files(meta.code, fetched)
        local = str(fetched)
    _on_sys_path(local)


def _on_sys_path(path: str) -> None:
    if path not in sys.path:
        sys.path.append(path)    # after what is installed here: an installed app version wins


def _temp_dir(prefix: str) -> Path:
    d = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, d, True)
    return Path(d)


def job_files_dir(d: DurableDir, meta: ModelMetadata) -> Optional[Path]:
    """The local dir holding the job's shipped files by link name (see the module doc), put on
    sys.path (a user app's modules are among them); None when the job shipped none.
    ModelOutputError naming a file that cannot be had."""
    if not meta.files:
        return None
    own = d.child(FILES_DIR)
    if own.local is not None and all(f.copied for f in meta.files):
        for f in meta.files:
            if not (own.local / f.name).is_file():
                raise ModelOutputError(f"the job's file {f.name!r} is not in the model at {d.url} "
                                       f"({own.local / f.name} is missing)")
        where = own.local
    else:
        from nodemanager.localizer import fetch   # noqa: PLC0415 - the NM's fetch: size / timestamp checked

        where = _temp_dir("elastane-model-files-")
        copied = [f.name for f in meta.files if f.copied]
        try:
            own.get_files(copied, where)
        except OSError as e:
            raise ModelOutputError(f"the job's files in the model at {own.url}: cannot fetch {copied}: {e}") from None
        for f in meta.files:
            if f.copied:
                continue
            try:
                fetch(f.as_resource(), str(where / f.name))
            except (OSError, ValueError, RuntimeError) as e:   # LocalizationError is a RuntimeError
                raise ModelOutputError(f"the job's file {f.name!r}, referenced at {f.resource} "
                                       f"({f.size} bytes, timestamp {f.timestamp}): cannot fetch it: {e}") from None
    _on_sys_path(str(where))
    return where


def is_builtin(meta: ModelMetadata) -> bool:
    """Whether a built-in app trained the model."""
    from psruntime.apps.registry import APP_NAMES  # noqa: PLC0415 - the apps' modules: only here

    return meta.app.name in APP_NAMES and meta.app.cls.startswith("psruntime.apps.")


def _app_class(meta: ModelMetadata, files_dir: Optional[Path]) -> type[PSApp]:
    from psruntime.apps.registry import get_app  # noqa: PLC0415 - the apps' modules: only here

    try:
        if is_builtin(meta):
            return get_app(meta.app.name)
        module, _, name = meta.app.cls.partition(":")
        with in_job_dir(files_dir):     # a module may read its files as it is imported
            cls: type[PSApp] = getattr(importlib.import_module(module), name)
        return cls
    except Exception as e:  # noqa: BLE001 - importing a user's module runs its code
        raise ModelOutputError(f"cannot rebuild app {meta.app.name!r} ({meta.app.cls}): "
                               f"{type(e).__name__}: {e}") from None


def data_path_field(cls: type[PSApp], builtin: bool) -> str:
    """The data spec field a path given as `data` sets; ModelOutputError when the app has none."""
    if builtin:
        return BUILTIN_DATA_FIELD
    field = getattr(cls, "DATA_PATH_FIELD", None)
    if not isinstance(field, str) or not field:
        raise ModelOutputError(f"app {cls.name!r} reads no data from a path: its class names no DATA_PATH_FIELD "
                               "(the data spec field its reader opens; docs/app_api.md)")
    return field


def rebuild_app(meta: ModelMetadata, data: JsonObject | None = None,
                files_dir: Optional[Path] = None) -> AnyPSApp:
    """The app that trained the model, with the job's data spec (or `data` instead) and
    hyper-parameters, built in `files_dir` (its job's files). ModelOutputError when it cannot be
    built here or its model has another shape."""
    cls = _app_class(meta, files_dir)
    if data is None:
        # A built-in app's model written before recorded_data_spec kept the generator-only fields'
        # defaults beside `path`, which the app refuses: drop them here too.
        data = recorded_data_spec(meta.app.name, meta.data) if is_builtin(meta) else meta.data
    try:
        with in_job_dir(files_dir):
            app = cls.from_config(data, meta.hparams)
            shape = (app.num_keys, app.key_length)    # a user app may size its model from its files
    except Exception as e:  # noqa: BLE001 - the app's code may read its files: name what failed
        raise ModelOutputError(f"cannot rebuild app {meta.app.name!r} ({meta.app.cls}): {type(e).__name__}: {e}") from None
    if shape != (meta.num_keys, meta.key_length):
        raise ModelOutputError(f"the model is {meta.num_keys} x {meta.key_length} (num_keys x key_length) but "
                               f"{meta.app.name} on this data has a {shape[0]} x {shape[1]} model")
    return app


@dataclass
class SavedModel:
    """A trained model as a job wrote it: its app (rebuilt), values (num_keys, key_length) and
    metadata; `files_dir`: where its job's shipped files are (None: it shipped none)."""

    url: str
    app: AnyPSApp
    values: np.ndarray
    metadata: ModelMetadata
    files_dir: Optional[Path] = None

    @property
    def params(self) -> KeyValues:
        """Every model key with its value, as `PSApp.predict` takes them."""
        return KeyValues(self.app.model_keys(), self.values)

    def _read(self, app: AnyPSApp, what: str) -> list[DataBlock]:
        """The held-out blocks of `app`, read by its own code among the job's files; what it cannot
        read is a ModelOutputError naming `what`."""
        try:
            with in_job_dir(self.files_dir):
                return app.generate_heldout()
        except Exception as e:  # noqa: BLE001 - the app's reader: whatever it raises names the input
            raise ModelOutputError(f"{what}: cannot read its held-out rows: {type(e).__name__}: {e}") from None

    def _blocks(self, data: Data) -> tuple[AnyPSApp, list[DataBlock]]:
        """The app to read with and the blocks `data` names."""
        if data is None:
            return self.app, self._read(self.app, f"the job's own data ({self.metadata.app.name} data spec "
                                                  f"{msgspec.json.encode(self.metadata.data).decode()})")
        if isinstance(data, (str, os.PathLike)):
            path = os.path.abspath(os.fspath(data))
            builtin = is_builtin(self.metadata)
            field = data_path_field(type(self.app), builtin)
            spec: JsonObject = {field: path} if builtin else {**self.metadata.data, field: path}
            try:
                app = rebuild_app(self.metadata, spec, self.files_dir)
            except ModelOutputError as e:
                raise ModelOutputError(f"{path}: {e}") from None
            return app, self._read(app, path)
        if isinstance(data, DataBlock):
            return self.app, [data]
        return self.app, list(data)

    def _call(self, fn: Callable[[], T]) -> T:
        with in_job_dir(self.files_dir):
            return fn()

    def predict(self, data: Data = None) -> np.ndarray:
        """The app's predictions (PSApp.predict) for every row of `data`, blocks concatenated.
        NotImplementedError for an app without predict."""
        app, blocks = self._blocks(data)
        values = self.values
        parts = self._call(lambda: [app.predict(b, KeyValues(app.model_keys(), values)) for b in blocks])
        return np.concatenate(parts) if parts else np.zeros(0)

    def evaluate(self, data: Data = None) -> dict[str, float]:
        """The app's held-out metrics of the model on `data` (PSApp.evaluate): on the job's own
        held-out data they are the job's final held-out score."""
        app, blocks = self._blocks(data)
        return {k: float(v) for k, v in self._call(lambda: app.evaluate(self.values, blocks)).items()}

    def describe(self) -> JsonObject:
        """The metadata as builtins, with the URL."""
        return {"url": self.url, **msgspec.to_builtins(self.metadata)}


def load_model(url: str | os.PathLike[str]) -> SavedModel:
    """The model at `url`: a job's `output` (its final model) or one of its model directories
    (`<output>/epoch-N`). ModelOutputError naming what is missing or wrong."""
    try:
        d = locate(os.fspath(url))
        meta = read_metadata(d)
        values = read_values(d, meta)
        import_saved_code(d, meta)
    except OSError as e:
        raise ModelOutputError(f"cannot read the model at {os.fspath(url)}: {e}") from None
    files_dir = job_files_dir(d, meta)
    return SavedModel(d.url, rebuild_app(meta, files_dir=files_dir), values, meta, files_dir)


__all__ = ["Data", "ModelOutputError", "SavedModel", "in_job_dir", "job_files_dir", "load_model", "rebuild_app"]
