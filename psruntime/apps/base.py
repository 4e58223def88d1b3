"""The interface between an ML app and the PS worker loop.

The model is a dense range of integer keys ``0 .. num_keys-1``; every key's value is a float32
vector of ``key_length``. Servers hold keys (in blocks of the elastic store) and apply pushed
deltas with "add". Workers hold input partitions, each a list of `DataBlock`s. Per mini-batch the
worker loop does::

    keys   = app.keys_for_batch(batch)                  # sorted, unique int64
    params = KeyValues(keys, pull(keys))                # blocking PULL
    deltas = app.compute(batch, params, ctx)            # COMP; updates the block's local state
    push(deltas)                                        # PUSH, servers do value += delta

Before the first epoch a worker calls ``app.init_block(block)`` on every block it generated and
pushes any deltas it returns (LDA's initial topic counts). Servers initialise their keys with
``app.init_value(keys)``. After each epoch every worker sums ``app.objective(block, params)`` over
its blocks (pulling ``app.objective_keys(block)``), every server computes
``app.server_objective(KeyValues)`` over the keys it owns, and the AM calls
``app.combine(worker_parts, server_parts)`` and ``app.is_converged(history)``.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar, Generic, Iterator, Mapping, Sequence, TypeVar

import msgspec
import numpy as np

from protocol.dataset_manifest import INDEX_BOUNDS, DatasetError, DatasetManifest, load_manifest, resolve_data_spec
from psruntime.apps.blocks import DataBlock
from psruntime.apps.sorted_unique import keys_outside
from psruntime.apps.random_streams import (HELDOUT, TRAIN, block_row_range, num_blocks, partition_block_range,
                                           rng_for)
from protocol.errors import AppError
from protocol.json_types import JsonObject, JsonValue

SpecT = TypeVar("SpecT", bound=msgspec.Struct)
HParamsT = TypeVar("HParamsT", bound=msgspec.Struct)


class AppConfigError(AppError, ValueError):
    """A data spec or hyper-parameter set that is invalid; the message names the field."""


@dataclass
class KeyValues:
    """Values of a set of model keys: ``values[i]`` belongs to ``keys[i]``.

    Used for pulled parameters and for pushed deltas. ``keys`` is sorted, unique int64;
    ``values`` is float32 of shape (len(keys), key_length).
    """

    keys: np.ndarray
    values: np.ndarray

    def __post_init__(self) -> None:
        if self.keys.ndim != 1 or self.values.ndim != 2 or len(self.keys) != len(self.values):
            raise ValueError(f"KeyValues needs 1-D keys and 2-D values of the same length, got "
                             f"keys {self.keys.shape} values {self.values.shape}")

    def __len__(self) -> int:
        return len(self.keys)

    def rows_of(self, keys: np.ndarray) -> np.ndarray:
        """Positions of `keys` (all present) in this set."""
        pos = np.searchsorted(self.keys, keys)
        if len(keys) and (pos.max(initial=0) >= len(self.keys) or not np.array_equal(self.keys[pos], keys)):
            raise KeyError("some keys are not in this KeyValues")
        return pos


class AppOutputError(AppError, ValueError):
    """An app method returned what the runtime cannot use (`OutputCheck`); the message names the
    app and what is wrong. For a user's app the executor answers it as UserCodeError
    (psruntime.app_role), so the job fails with it: the same code would return the same."""


class OutputCheck:
    """Checks of what an app hands the worker loop, before the runtime indexes anything with it
    (psruntime.training_pipeline, psruntime.apps.single_process): `keys_for_batch`'s keys and
    `compute`'s (or `init_block`'s) deltas. Keys out of range would otherwise wrap (a key -1 is
    the last key's row in a sync window's cache and in the dense baseline) or reach the store as a
    phantom key, and values narrower than key_length would be broadcast over the row.

    A few numpy passes over the keys, none per key in Python: a step makes one and checks every
    mini-batch with it (~2 us a check for 125 keys). Deltas for the pulled keys themselves
    (`deltas.keys is params.keys`, what every built-in app returns) need only the values' shape:
    the pulled keys were checked as `keys_for_batch` returned them. Any other in-range keys are
    accepted, repeats included (the runtime adds every delta); whether they were pulled is not
    checked (a push to rows not pulled is allowed: psruntime.write_back_cache)."""

    __slots__ = ("app_name", "num_keys", "key_length")

    def __init__(self, app: "PSApp[Any, Any]") -> None:
        self.app_name = str(getattr(app, "name", type(app).__name__))
        self.num_keys = int(app.num_keys)
        self.key_length = int(app.key_length)

    def _fail(self, problem: str) -> AppOutputError:
        return AppOutputError(f"app {self.app_name!r}: {problem} (num_keys {self.num_keys}, "
                              f"key_length {self.key_length}; docs/app_api.md)")

    def _check_keys(self, keys: object, returned: str) -> None:
        if not isinstance(keys, np.ndarray) or keys.ndim != 1 or keys.dtype.kind not in "iu":
            desc = (f"a {keys.ndim}-D {keys.dtype} array" if isinstance(keys, np.ndarray)
                    else type(keys).__name__)
            raise self._fail(f"{returned} keys that are not a 1-D integer array ({desc})")
        if len(keys) and keys_outside(keys, self.num_keys):
            bad = keys[(keys < 0) | (keys >= self.num_keys)]
            raise self._fail(f"{returned} {len(bad)} of {len(keys)} keys outside 0 .. num_keys-1 "
                             f"(min {int(keys.min())}, max {int(keys.max())}; e.g. {bad[:5].tolist()})")

    def batch_keys(self, keys: np.ndarray) -> np.ndarray:
        """`keys` (keys_for_batch's), checked: a 1-D integer array of keys in [0, num_keys)."""
        self._check_keys(keys, "keys_for_batch returned")
        return keys

    def deltas(self, deltas: "KeyValues | None", pulled: np.ndarray | None = None,
               what: str = "compute") -> "KeyValues | None":
        """`deltas` (what `what` returned for the pulled keys `pulled`), checked: None, or a
        KeyValues whose values are (len(keys), key_length) and whose keys are integers in
        [0, num_keys) -- the latter taken as known when they are `pulled` itself."""
        if deltas is None:
            return None
        if not isinstance(deltas, KeyValues):
            raise self._fail(f"{what} must return a KeyValues or None, got {type(deltas).__name__}")
        keys, values = deltas.keys, deltas.values
        if keys is not pulled:
            self._check_keys(keys, f"{what} returned deltas with")
        if values.shape != (len(keys), self.key_length):
            raise self._fail(f"{what} returned values of shape {values.shape} for {len(keys)} keys, not "
                             f"({len(keys)}, {self.key_length}): one row of key_length per key")
        return deltas


@dataclass(frozen=True)
class Batch:
    """One mini-batch: rows [start, stop) of a block (positions within the block)."""

    block: DataBlock
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class StepContext:
    """What the worker loop tells `compute` about the step.

    `num_workers` is the job's current number of workers (apps whose additive pushes must be
    averaged to stay stable, like Lasso's proximal step, divide by it); `epoch` and the batch's
    position seed any randomness of the step, so a rerun is reproducible. `threads` is how many
    threads a COMP may use (the job's `comp_threads`, the cores it holds of its node's arbiter
    pool): an app may shard its numpy work over `psruntime.apps.comp_pool` with that many. With
    one thread it computes what it always did; with more, a deterministic app's update is the same
    up to float summation order (MLR's is bit-identical), and a sampler's (LDA) a different draw
    of the same sampler -- each app's module docstring says what it shards.
    """

    epoch: int = 0
    num_workers: int = 1
    threads: int = 1


@dataclass(frozen=True)
class ObjectivePart:
    """A worker's additive contribution to the epoch objective: a sum and how many terms it has."""

    value: float = 0.0
    count: int = 0

    def __add__(self, other: "ObjectivePart") -> "ObjectivePart":
        return ObjectivePart(self.value + other.value, self.count + other.count)


@dataclass
class Partition:
    """The input blocks of worker partition `index` of `num_partitions`."""

    index: int
    num_partitions: int
    blocks: list[DataBlock]

    @property
    def num_rows(self) -> int:
        return sum(b.num_rows for b in self.blocks)

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.blocks)


def parse_config(obj: object, typ: type[HParamsT], what: str) -> HParamsT:
    """Validate a builtins mapping (e.g. decoded JSON; any value, checked here) into a Struct;
    errors name the field."""
    if isinstance(obj, typ):
        return obj
    try:
        return msgspec.convert(obj if obj is not None else {}, typ, strict=True)
    except (msgspec.ValidationError, TypeError) as e:
        raise AppConfigError(f"invalid {what}: {e}") from None


class PSApp(ABC, Generic[SpecT, HParamsT]):
    """An ML app as the PS runtime drives it: data generation, model layout and update math.

    An instance is bound to one data spec and one hyper-parameter set and holds no training
    state: the model lives on servers and the worker-local state in the input blocks.
    """

    name: ClassVar[str]
    Spec: ClassVar[type[msgspec.Struct]]
    HParams: ClassVar[type[msgspec.Struct]]
    # Whether a larger objective is better (log-likelihood) or smaller (loss).
    maximize: ClassVar[bool] = False
    # Named data sizes: "tiny" for tests (< 1 s per epoch on one core) up to gigabytes.
    PRESETS: ClassVar[dict[str, JsonObject]] = {}
    # The hyper-parameters each preset trains with (under the caller's own).
    PRESET_HPARAMS: ClassVar[dict[str, JsonObject]] = {}
    # Names of the per-entry and per-row arrays in a block's data (besides "indptr").
    ENTRY_FIELDS: ClassVar[tuple[str, ...]] = ()
    ROW_FIELDS: ClassVar[tuple[str, ...]] = ()
    # Cached properties only data generation needs (ground truths): a worker drops them once its
    # partition is generated, so they do not stay beside the data for the whole job.
    GENERATION_CACHES: ClassVar[tuple[str, ...]] = ()
    # The most COMP threads that speed this app up when its job does not ask for a number
    # (None: as many as its container has vcores). An app whose COMP is mostly GIL-bound Python
    # (LDA's sampler) sets 1: threads would only hold cores of the node's CPU pool it cannot use.
    # A job's explicit `comp_threads` still wins.
    DEFAULT_COMP_THREADS: ClassVar[int | None] = None

    def __init__(self, spec: SpecT, hparams: HParamsT) -> None:
        self.spec = spec
        self.hparams = hparams

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_config(cls: type[AnyPSApp], spec: Mapping[str, JsonValue] | msgspec.Struct | None = None,
                    hparams: Mapping[str, JsonValue] | msgspec.Struct | None = None,
                    preset: str | None = None) -> "PSApp":
        """Build from builtins (a job spec's JSON): `preset` gives the base sizes and
        hyper-parameters, `spec` and `hparams` override their fields. Already validated Structs are
        taken as they are. Raises AppConfigError naming the bad field."""
        # `cls` is typed PSApp[Any, Any]: that Spec and HParams are SpecT's and HParamsT's classes
        # is more than a ClassVar can say, so the Structs they parse are taken as they are.
        if isinstance(spec, cls.Spec):
            return cls(spec, parse_config(hparams, cls.HParams, f"{cls.name} hyper-parameters"))
        base: JsonObject = {}
        if preset is not None:
            if preset not in cls.PRESETS:
                raise AppConfigError(f"unknown preset {preset!r} for app {cls.name}; "
                                     f"choose one of {sorted(cls.PRESETS)}")
            base = dict(cls.PRESETS[preset])
            if isinstance(hparams, Mapping) or hparams is None:
                hparams = {**cls.PRESET_HPARAMS.get(preset, {}), **(hparams or {})}
        if spec is not None and not isinstance(spec, Mapping):
            raise AppConfigError(f"invalid {cls.name} data spec: expected an object")
        try:
            # With a `path`, the dataset's dimensions replace the preset's (and are re-checked here,
            # on the AM and every executor, against what the submission saw).
            merged = resolve_data_spec(cls.name, spec or {}, base)
        except DatasetError as e:
            raise AppConfigError(f"invalid {cls.name} data spec: {e.field}: {e.detail}") from None
        return cls(parse_config(merged, cls.Spec, f"{cls.name} data spec"),
                   parse_config(hparams, cls.HParams, f"{cls.name} hyper-parameters"))

    # ----------------------------------------------------------------- data
    @property
    @abstractmethod
    def num_rows(self) -> int:
        """Training rows (samples, users or documents)."""

    @property
    def num_heldout_rows(self) -> int:
        """Held-out rows (every app's data spec has `num_heldout`)."""
        return int(self.spec.num_heldout)  # type: ignore[attr-defined]

    @property
    def rows_per_block(self) -> int:
        return int(self.spec.rows_per_block)  # type: ignore[attr-defined]

    @property
    def seed(self) -> int:
        return int(self.spec.seed)  # type: ignore[attr-defined]

    @property
    def num_blocks(self) -> int:
        return num_blocks(self.num_rows, self.rows_per_block)

    @abstractmethod
    def generate_block(self, block_index: int, heldout: bool = False) -> DataBlock:
        """Generate one input block (without worker-local state) from (seed, block_index)."""

    # ----------------------------------------------------------------- file data
    @property
    def data_path(self) -> str | None:
        """The dataset directory the data comes from, or None for generated data."""
        return getattr(self.spec, "path", None)

    @property
    def has_ground_truth(self) -> bool:
        """Generated data has a known true model; file data has none (evaluate omits those metrics)."""
        return self.data_path is None

    @cached_property
    def dataset(self) -> DatasetManifest:
        """The manifest of the dataset directory (file data only), checked against the spec."""
        path = self.data_path
        if path is None:
            raise AppConfigError(f"{self.name}: the data spec has no path; the data is generated")
        try:
            m = load_manifest(path)
        except DatasetError as e:
            raise AppConfigError(f"invalid {self.name} data spec: {e.field}: {e.detail}") from None
        spec = msgspec.to_builtins(self.spec)
        wrong = {k: v for k, v in m.spec.items() if spec.get(k) != v}
        if m.app != self.name or wrong:
            raise AppConfigError(f"{path}: dataset ({m.app}, {m.spec}) changed since the job was set up "
                                 f"(differs in {sorted(wrong) or 'app'})")
        return m

    def input_block(self, block_index: int, heldout: bool = False) -> DataBlock:
        """Input block `block_index`: read from the dataset's files when the spec has a path,
        generated otherwise. Raises DatasetFileError naming a missing or damaged file."""
        if self.data_path is None:
            return self.generate_block(block_index, heldout)
        from psruntime.apps.dataset_files import read_block   # numpy I/O only file-data jobs need

        bounds = {f: int(getattr(self.spec, f)) for f in INDEX_BOUNDS[self.name].values()}
        return read_block(self.data_path, self.dataset, "heldout" if heldout else "train", block_index, bounds)

    def generate_partition(self, partition_index: int, num_partitions: int) -> Partition:
        """Blocks of partition i of n, generated (or read) without materialising any other partition."""
        rng = partition_block_range(self.num_blocks, partition_index, num_partitions)
        part = Partition(partition_index, num_partitions, [self.input_block(b) for b in rng])
        self.release_generation_caches()
        return part

    def release_generation_caches(self) -> None:
        """Forget the ground truths cached for generation (recomputed, identically, if used again)."""
        for name in self.GENERATION_CACHES:
            self.__dict__.pop(name, None)

    def generate_heldout(self) -> list[DataBlock]:
        """The held-out set (rows drawn like training rows from their own random stream, or the
        dataset's held-out block files)."""
        return [self.input_block(b, heldout=True)
                for b in range(num_blocks(self.num_heldout_rows, self.rows_per_block))]

    def _stream(self, heldout: bool) -> int:
        return HELDOUT if heldout else TRAIN

    def _block_rows(self, block_index: int, heldout: bool) -> tuple[int, int, np.random.Generator]:
        """(first row, rows, random stream) of a training or held-out block: what every app's
        `generate_block` starts from, so a block depends only on (seed, stream, block_index)."""
        total = self.num_heldout_rows if heldout else self.num_rows
        start, stop = block_row_range(total, self.rows_per_block, block_index)
        return start, stop - start, rng_for(self.seed, self._stream(heldout), block_index)

    @abstractmethod
    def data_nbytes(self) -> int:
        """Expected bytes of all training blocks (input plus worker-local state)."""

    # ----------------------------------------------------------------- model
    @property
    @abstractmethod
    def num_keys(self) -> int:
        """Model keys are 0 .. num_keys-1."""

    @property
    @abstractmethod
    def key_length(self) -> int:
        """Length of every key's float32 value vector."""

    def model_keys(self) -> np.ndarray:
        return np.arange(self.num_keys, dtype=np.int64)

    def model_nbytes(self) -> int:
        return self.num_keys * self.key_length * 4

    @abstractmethod
    def init_value(self, keys: np.ndarray) -> np.ndarray:
        """Initial float32 values (len(keys), key_length); deterministic per key."""

    # ----------------------------------------------------------------- worker
    def init_block(self, block: DataBlock) -> KeyValues | None:
        """Initialise the block's worker-local state (once, where the block is generated) and
        return deltas the worker must push before training, or None."""
        return None

    def batches(self, block: DataBlock) -> Iterator[Batch]:
        """The block's mini-batches, in order, of `hparams.batch_size` rows."""
        size = int(self.hparams.batch_size)  # type: ignore[attr-defined]
        for start in range(0, block.num_rows, size):
            yield Batch(block, start, min(block.num_rows, start + size))

    @abstractmethod
    def keys_for_batch(self, batch: Batch) -> np.ndarray:
        """Sorted unique int64 keys that `compute` needs pulled for this batch."""

    @abstractmethod
    def compute(self, batch: Batch, params: KeyValues, ctx: StepContext) -> KeyValues:
        """Deltas to add on the servers (for a subset of params.keys, or exactly them); also
        updates the batch's block state in place. Must not modify `params`."""

    @abstractmethod
    def objective_keys(self, block: DataBlock) -> np.ndarray:
        """Sorted unique keys `objective` needs for this block (may be empty)."""

    @abstractmethod
    def objective(self, block: DataBlock, params: KeyValues) -> ObjectivePart:
        """This block's additive contribution to the objective under the current model."""

    def server_objective(self, params: KeyValues) -> float:
        """Additive contribution of these model keys (regularisers, LDA's word part); a server
        computes it over the keys it owns so the model never travels for the objective."""
        return 0.0

    def combine(self, worker_parts: Sequence[ObjectivePart], server_parts: Sequence[float]) -> float:
        """The epoch objective from all parts: by default mean worker loss plus server terms."""
        total = sum(worker_parts, ObjectivePart())
        return (total.value / max(total.count, 1)) + float(sum(server_parts))

    # ----------------------------------------------------------------- epoch control
    @abstractmethod
    def evaluate(self, model: np.ndarray, heldout: Sequence[DataBlock]) -> dict[str, float]:
        """Quality metrics of the full model (num_keys, key_length) on the held-out set."""

    def predict(self, block: DataBlock, params: KeyValues) -> np.ndarray:
        """The model's predictions for every row of `block` (an array with one entry or row per
        row, or per entry for apps whose rows hold several), `params` holding every model key.
        Optional: apps that make no predictions leave it raising NotImplementedError."""
        raise NotImplementedError(f"app {self.name!r} ({type(self).__module__}:{type(self).__qualname__}) "
                                  f"does not implement predict")

    def is_converged(self, history: Sequence[float]) -> bool:
        """True when the relative change of the last two epoch objectives is below the
        threshold, or the epoch limit is reached."""
        hp = self.hparams
        if len(history) >= int(hp.max_epochs):  # type: ignore[attr-defined]
            return True
        if len(history) < 2:
            return False
        prev, cur = history[-2], history[-1]
        if not (math.isfinite(prev) and math.isfinite(cur)):
            return False
        return abs(cur - prev) / max(abs(prev), 1e-12) < float(hp.convergence_threshold)  # type: ignore[attr-defined]

    def describe(self) -> JsonObject:
        """Sizes for memory accounting and logs."""
        return {"app": self.name, "spec": msgspec.to_builtins(self.spec),
                "hparams": msgspec.to_builtins(self.hparams), "num_rows": self.num_rows,
                "num_blocks": self.num_blocks, "num_keys": self.num_keys, "key_length": self.key_length,
                "data_bytes": self.data_nbytes(), "model_bytes": self.model_nbytes()}


AnyPSApp = PSApp[Any, Any]
"""An app of whatever data spec and hyper-parameter types (what the AM holds)."""
