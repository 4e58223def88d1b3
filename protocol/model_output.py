"""A trained model as a PS job leaves it: the metadata of the output format (docs/model_output.md).

A job with `output: URL` gets `URL/final/` at its successful end, and with `checkpoint_every_epochs`
`URL/epoch-<N>/` for each checkpoint. Each directory holds `model.npz` (the array "values",
float32 (num_keys, key_length): row k is model key k), `files/` (the job's shipped files that
were copied, see ModelFile) and `metadata.json`, written last, so a directory without it is
incomplete.

This module is the metadata half, import-light (msgspec and durable_storage, no numpy, no runtime):
the RM validates `init_from` at submission with it (`check_init_from`). The arrays are read and
written by `psruntime.store.model_files`.
"""
from __future__ import annotations

import math
from typing import Literal, Mapping, Optional

import msgspec

from .durable_storage import DurableDir, DurableStorageError
from .json_types import JsonObject, JsonValue, json_int
from .local_resources import LocalResource, ResourceType
from .shape_history import ShapeChange, decode_history
from protocol.errors import AppError

FORMAT = "elastane-model"
VERSION = 1
MODEL_FILE = "model.npz"
METADATA_FILE = "metadata.json"
FINAL_DIR = "final"
VALUES_ARRAY = "values"
# Apps whose server values must agree with state only the workers hold: LDA's word-topic counts
# are the sums of its workers' token assignments, which a warm start cannot bring back.
NO_WARM_START = {"lda": "its word-topic counts must match the token assignments its workers draw anew"}


class ModelOutputError(AppError, ValueError):
    """A model output that cannot be read, is not one, or does not fit where it is used."""


def epoch_dir(epoch: int) -> str:
    """The name of the output directory of the checkpoint at the start of `epoch`."""
    return f"epoch-{epoch}"


class AppRef(msgspec.Struct, kw_only=True, frozen=True):
    """Which app trained the model: its name, its class as "module:Class", and its version if it has one."""

    name: str
    cls: str = msgspec.field(name="class")
    version: Optional[str] = None


class ModelFile(msgspec.Struct, kw_only=True, frozen=True):
    """One of the job's shipped files (a `resources` entry, by its link name in the working dir):
    `copied` into the model's `files/` dir, or else referenced by its `resource` URL with the
    `size` and `timestamp` (ms) it had when the job ran, checked again where it is fetched."""

    name: str
    type: ResourceType = "FILE"
    size: int = -1
    copied: bool = False
    resource: str = ""                  # a referenced file's URL ("" when copied)
    timestamp: int = -1                 # a referenced file's mtime in ms; -1 = not checked
    pattern: str = ""                   # a referenced PATTERN archive's entries to keep

    def as_resource(self) -> LocalResource:
        """A referenced file as the LocalResource that fetches it (size and timestamp checked)."""
        return LocalResource(resource=self.resource, type=self.type, size=self.size, timestamp=self.timestamp,
                             pattern=self.pattern)


class ModelMetadata(msgspec.Struct, kw_only=True):
    """`metadata.json` of a model output (see docs/model_output.md for every field)."""

    format: Literal["elastane-model"] = "elastane-model"
    version: int = VERSION
    kind: Literal["final", "checkpoint"]
    epoch: int                                    # epochs trained into these values
    app: AppRef
    num_keys: int
    key_length: int
    data: JsonObject                              # the app's resolved data spec
    hparams: JsonObject                           # the app's hyper-parameters
    preset: str = ""
    maximize: bool = False                        # whether a larger objective is better
    objective: Optional[float] = None             # the training objective of these values
    initial_objective: Optional[float] = None
    objective_history: list[Optional[float]] = []
    heldout_metrics: dict[str, Optional[float]] = {}
    heldout_epoch: Optional[int] = None           # the epoch (1-based) heldout_metrics were scored after
    shape_history: list[ShapeChange] = []         # protocol.shape_history's records
    job: JsonObject = {}                          # the job spec as submitted (validated)
    attempt_id: str = ""                          # the AM attempt that wrote it
    elastane_version: str = "unknown"
    written_at: float = 0.0
    # Models written before `files`: a user app's Python files, copied into the model's `code/`
    # directory (still read; new models keep them in `files`).
    code: list[str] = []
    # The job's shipped files (its `resources`: code, data files, archives) as the app saw them in
    # its working dir, so the model is used anywhere: each copied into `files/` or referenced.
    files: list[ModelFile] = []


CODE_DIR = "code"
FILES_DIR = "files"


def finite_or_none(x: float | str | None) -> Optional[float]:
    """`x` as a float, None when it is missing or not finite (JSON has no NaN)."""
    if x is None:
        return None
    f = float(x)
    return f if math.isfinite(f) else None


def encode_metadata(meta: ModelMetadata) -> bytes:
    return msgspec.json.format(msgspec.json.encode(meta), indent=2) + b"\n"


def locate(url: str) -> DurableDir:
    """The model directory `url` names: itself when it holds a metadata.json, else its `final/`
    (so a job's `output` URL and one of its `epoch-N` directories both work). OSError when neither
    can be read; ModelOutputError for a malformed URL."""
    try:
        root = DurableDir(url)
        for d in (root, root.child(FINAL_DIR)):
            if METADATA_FILE in d.entries()[1]:
                return d
    except DurableStorageError as e:
        raise ModelOutputError(str(e)) from None
    raise FileNotFoundError(f"no model at {url}: neither {METADATA_FILE} nor {FINAL_DIR}/{METADATA_FILE} there")


def read_metadata(d: DurableDir) -> ModelMetadata:
    """The metadata of the model directory `d`; OSError if unreadable, ModelOutputError if it is not
    a model output's."""
    raw = d.read_bytes(METADATA_FILE)
    try:
        try:
            return msgspec.json.decode(raw, type=ModelMetadata)
        except msgspec.ValidationError as e:
            if "$.shape_history" not in str(e):
                raise
            # A record an older (or newer) AM wrote that is no kind this one knows: the model is
            # still good; its history keeps the records that decode.
            obj = msgspec.json.decode(raw)
            if not isinstance(obj, dict):
                raise
            history = decode_history(obj.pop("shape_history", None) or [])
            meta = msgspec.convert(obj, ModelMetadata)
            meta.shape_history = history
            return meta
    except msgspec.DecodeError as e:
        raise ModelOutputError(f"{d.url}/{METADATA_FILE} is not an Elastane model's metadata: {e}") from None


def builtin_model_shape(app: str, data: Mapping[str, JsonValue],
                        hparams: Mapping[str, JsonValue]) -> Optional[tuple[int, int]]:
    """(num_keys, key_length) of a built-in app's model from its resolved data spec and
    hyper-parameters, None for an app not built in. The same arithmetic as the apps' own
    `num_keys` / `key_length` (tests/unit/test_model_output.py checks they agree), so the RM can
    check a warm start without importing the runtime."""
    if app in ("mlr", "lasso"):
        per_key = json_int(hparams["features_per_key"])
        num_keys = -(-json_int(data["num_features"]) // per_key)
        return num_keys, per_key * (json_int(data["num_classes"]) if app == "mlr" else 1)
    if app == "nmf":
        return json_int(data["num_items"]), json_int(hparams["rank"])
    if app == "lda":
        return json_int(data["vocab_size"]) + 1, json_int(hparams["num_topics"])
    return None


def mismatch(meta: ModelMetadata, url: str, app: str, shape: Optional[tuple[int, int]]) -> Optional[str]:
    """Why the model at `url` (of `meta`) cannot start a job of `app` whose model is `shape` (None: unknown
    yet), or None when it can."""
    if app not in (meta.app.name, meta.app.cls):    # a built-in's name, or a user app's "module:Class"
        return f"the model at {url} is of app {meta.app.name!r}, this job's app is {app!r}"
    if app in NO_WARM_START:
        return f"{app} cannot start from a saved model: {NO_WARM_START[app]}"
    if shape is not None and (meta.num_keys, meta.key_length) != shape:
        return (f"the model at {url} has num_keys {meta.num_keys} x key_length {meta.key_length}, "
                f"this job's model is {shape[0]} x {shape[1]} (its data spec or hyper-parameters differ)")
    return None


def check_init_from(url: str, app: str, shape: Optional[tuple[int, int]]) -> Optional[ModelMetadata]:
    """The metadata of the model `url` names if a job of `app` with a model of `shape` may start
    from it; ModelOutputError naming the mismatch if not. None when the location cannot be read
    from here (the AM checks again where it runs)."""
    if app in NO_WARM_START:
        raise ModelOutputError(f"{app} cannot start from a saved model: {NO_WARM_START[app]}")
    try:
        d = locate(url)
        meta = read_metadata(d)
    except OSError:
        return None
    why = mismatch(meta, d.url, app, shape)
    if why is not None:
        raise ModelOutputError(why)
    return meta


__all__ = ["AppRef", "CODE_DIR", "FILES_DIR", "FINAL_DIR", "FORMAT", "METADATA_FILE", "MODEL_FILE", "ModelFile",
           "ModelMetadata", "ModelOutputError", "NO_WARM_START", "VALUES_ARRAY", "VERSION", "builtin_model_shape", "check_init_from", "encode_metadata",
           "epoch_dir", "finite_or_none", "locate", "mismatch", "read_metadata"]
