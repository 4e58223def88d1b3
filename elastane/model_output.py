"""Reading a PS job's model output back (docs/model_output.md): `load_model(url)`.

    import elastane
    model = elastane.load_model("/shared/models/run1")      # its final/ (or any epoch-N/ directory)
    model.metadata.heldout_metrics, model.values.shape
    model.evaluate()                  # the app's held-out metrics on the job's own held-out data
    model.predict("/data/a9a")        # predictions for a dataset directory's held-out rows

The app is rebuilt from the metadata: a built-in app by name, any other by its "module:Class"
-- installed here, or from the code the model carries (a user app's `.py` files, in its code/
dir) -- with the job's data spec and hyper-parameters.
"""
from __future__ import annotations

import importlib
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence, Union

import msgspec
import numpy as np

from protocol.durable_storage import DurableDir, local_path
from protocol.model_output import CODE_DIR, ModelMetadata, ModelOutputError, locate, read_metadata
from psruntime.apps.base import AnyPSApp, AppConfigError, KeyValues, PSApp
from psruntime.apps.blocks import DataBlock
from psruntime.store.model_files import read_values

Data = Union[None, str, "os.PathLike[str]", DataBlock, Sequence[DataBlock]]
"""What predict / evaluate take: None (the job's own held-out data), a dataset directory (its
held-out rows), or input blocks."""


def import_saved_code(d: DurableDir, meta: ModelMetadata) -> None:
    """Make a user app's code that the model carries (its code/ dir) importable here: on sys.path
    directly when local, else fetched into a temporary dir first."""
    if not meta.code:
        return
    code = d.child(CODE_DIR)
    local = local_path(code.url)
    if local is None:
        fetched = Path(tempfile.mkdtemp(prefix="elastane-model-code-"))
        code.get_files(meta.code, fetched)
        local = str(fetched)
    if local not in sys.path:
        sys.path.append(local)    # after what is installed here: an installed app version wins


def rebuild_app(meta: ModelMetadata, data: dict[str, Any] | None = None) -> AnyPSApp:
    """The app that trained the model, with the job's data spec (or `data` instead) and
    hyper-parameters. ModelOutputError when it cannot be built here or its model has another shape."""
    from psruntime.apps.registry import APP_NAMES, get_app

    try:
        if meta.app.name in APP_NAMES and f"{meta.app.cls}".startswith("psruntime.apps."):
            cls: type[PSApp] = get_app(meta.app.name)
        else:
            module, _, name = meta.app.cls.partition(":")
            cls = getattr(importlib.import_module(module), name)
        app = cls.from_config(meta.data if data is None else data, meta.hparams)
    except (ImportError, AttributeError, AppConfigError) as e:
        raise ModelOutputError(f"cannot rebuild app {meta.app.name!r} ({meta.app.cls}): {e}") from None
    if (app.num_keys, app.key_length) != (meta.num_keys, meta.key_length):
        raise ModelOutputError(f"the model is {meta.num_keys} x {meta.key_length} (num_keys x key_length) but "
                               f"{meta.app.name} on this data has a {app.num_keys} x {app.key_length} model")
    return app


@dataclass
class SavedModel:
    """A trained model as a job wrote it: its app (rebuilt), values (num_keys, key_length) and metadata."""

    url: str
    app: AnyPSApp
    values: np.ndarray
    metadata: ModelMetadata

    @property
    def params(self) -> KeyValues:
        """Every model key with its value, as `PSApp.predict` takes them."""
        return KeyValues(self.app.model_keys(), self.values)

    def _blocks(self, data: Data) -> tuple[AnyPSApp, list[DataBlock]]:
        """The app to read with and the blocks `data` names."""
        if data is None:
            return self.app, self.app.generate_heldout()
        if isinstance(data, (str, os.PathLike)):
            path = os.path.abspath(os.fspath(data))
            app = rebuild_app(self.metadata, {"path": path})
            try:
                return app, app.generate_heldout()
            except (OSError, ValueError) as e:
                raise ModelOutputError(f"{path}: cannot read its held-out blocks: {e}") from None
        if isinstance(data, DataBlock):
            return self.app, [data]
        return self.app, list(data)

    def predict(self, data: Data = None) -> np.ndarray:
        """The app's predictions (PSApp.predict) for every row of `data`, blocks concatenated.
        NotImplementedError for an app without predict."""
        app, blocks = self._blocks(data)
        params = self.params
        parts = [app.predict(b, params) for b in blocks]
        return np.concatenate(parts) if parts else np.zeros(0)

    def evaluate(self, data: Data = None) -> dict[str, float]:
        """The app's held-out metrics of the model on `data` (PSApp.evaluate): on the job's own
        held-out data they are the job's final held-out score."""
        app, blocks = self._blocks(data)
        return {k: float(v) for k, v in app.evaluate(self.values, blocks).items()}

    def describe(self) -> dict[str, Any]:
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
    return SavedModel(d.url, rebuild_app(meta), values, meta)


__all__ = ["Data", "ModelOutputError", "SavedModel", "load_model", "rebuild_app"]
