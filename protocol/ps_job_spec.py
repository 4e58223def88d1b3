"""The PS job spec: what a user submits to train one model on the parameter server.

JSON field names are snake_case (the Struct's field names), like the apps' data specs and
hyper-parameters in `protocol.ps_app_schemas`, so one spelling holds all the way down. Example::

    {"app": "mlr", "preset": "tiny", "data": {"num_samples": 4000}, "hparams": {"learning_rate": 0.3},
     "workers": 2, "servers": 2, "blocks": 8, "sync": "bsp", "max_epochs": 10}

`"placement": [{"node": "10.0.0.5:45454", "workers": 1, "servers": 1}, ...]` says where the job's
first executors go: the AM asks for exactly that many of each role on each node, locality not
relaxed (YARN's ResourceRequest with resourceName = host, relaxLocality = false). A node is named
as an AM's ask names one (`AllocateRequest.asks[].nodes`, matched by the RM's `NodeTracker.lookup`):
the RM's node id "host:port" (the NM's address, `GET /ws/v1/cluster/nodes` "id") or a host name,
which stands for every NM on that host. The workers and servers over the entries must sum to the
spec's `workers` and `servers`; an empty list (the default) places them wherever they fit.

`"data": {"path": "/abs/dir"}` trains on a dataset directory (docs/dataset_format.md) instead of
the generator: its dataset.json gives the data's dimensions, checked here at submission.

`validate(obj)` checks everything a submission can be checked for without the runtime: the generic
fields here and the app's `data` / `hparams` against its schema (with the preset applied). Errors
are `JobSpecError` (a `codec.DecodeError`, so a ValueError) whose message starts with the dotted
path of the bad field, e.g. "hparams.learning_rate: Expected `float` > 0.0, got `0`".

Parse once. `data` and `hparams` travel and are stored as the user gave them (the JSON form above,
what the RM stores, sends to the AM in `PS_SPEC_ENV` and shows at its REST API); their decoded form
is kept beside them on the spec, made once where the app is known:

- A built-in app: `typed_data` / `typed_hparams` are the app's `Spec` / `HParams` Structs
  (protocol.ps_app_schemas: the preset, then the job's fields and overrides, then the Struct's
  defaults), decoded by `validate` -- in every process the spec enters (the CLI, the RM at
  submission, the AM from its env) -- or, for a spec decoded without `validate` (the RM's store on
  recovery), on the first read, and kept: readers (the RM's policy view, the AM's app via
  `psruntime.apps.registry.create_job_app`, the CLI) take these Structs, never the dicts again.
- A user's app ("module:Class"): its `Spec` / `HParams` are in its code, which the RM cannot import,
  so `typed_data` / `typed_hparams` are None here. Its data and hparams are decoded once by its class
  where that code is loaded (`create_job_app`: in the AM, and in the CLI when the code is at hand);
  the app instance's `spec` / `hparams` are the typed pair there. Whoever has no code reads only the
  job-level `max_epochs` / `convergence_threshold`, or what the user's hparams give outright
  (`effective_max_epochs` / `effective_convergence_threshold`).

Used by the RM at submission (type ELASTANE_PS, Elastane extension `{"elastane": {"ps-job": ...}}`)
and by the PS AM, which reads the spec from the env variable `PS_SPEC_ENV`.
"""
from __future__ import annotations

import re
from functools import cached_property
from typing import Annotated, Literal, Optional, Union, cast

import msgspec

from . import durable_storage, model_output
from .codec import DecodeError
from .arbiter_wire import MAX_THREADS
from .dataset_manifest import DatasetError, resolve_data_spec
from .internal_api import NodePlacement
from .local_resources import LocalResource, LocalResourceError, check_link_name
from .json_types import JsonObject, JsonValue
from .ps_app_schemas import APP_SCHEMAS, PRESET_NAMES, AppData, AppHParams, AppSchema

APPLICATION_TYPE = "ELASTANE_PS"
PS_SPEC_ENV = "ELASTANE_PS_SPEC"          # env of the PS AM container: the validated spec as JSON
ELASTANE_FIELD = "ps-job"                 # key of the spec inside the submission's "elastane" object
AM_COMMAND = "python -m appmaster.ps"     # what the RM runs when the submission names no command
BLOCKS_PER_SERVER = 4                     # default number of model blocks per (max) server
# The most model blocks a job may have: far beyond any job's need (4 per server by default), while
# what is linear in them -- the ownership table every executor is sent in one frame, the
# servers' per-block state, the AM's placement plans -- stays small.
MAX_BLOCKS = 1 << 16
MIN_EXECUTOR_MEMORY_MB = 64

Pos = Annotated[int, msgspec.Meta(ge=1)]

AppName = Literal["mlr", "nmf", "lda", "lasso"]
# A user's app (docs/app_api.md): "dotted.module:ClassName", its code shipped as `resources`.
USER_APP = re.compile(r"^(?P<module>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*):(?P<cls>[A-Za-z_][A-Za-z0-9_]*)$")
Preset = Literal["tiny", "small", "medium", "large"]
SyncMode = Literal["bsp", "ssp"]


class JobSpecError(DecodeError):
    """A PS job spec that is invalid; the message starts with the dotted path of the bad field
    (`field`, "" when the spec as a whole is wrong) and goes on with `detail`."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}" if field else detail)
        self.field = field
        self.detail = detail

    def under(self, prefix: str) -> "JobSpecError":
        """The same error with its field path under `prefix` (e.g. "elastane.ps-job")."""
        return JobSpecError(f"{prefix}.{self.field}" if self.field else prefix, self.detail)


class CruiseOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """Knobs of the Cruise optimizer (used when `optimizer` is "cruise")."""

    min_batches: Pos = 10                  # mini-batches per worker since the last change before a decision
    min_interval_s: Annotated[float, msgspec.Meta(ge=0)] = 0.0    # between two decisions
    gain_threshold: Annotated[float, msgspec.Meta(ge=0, lt=1)] = 0.05   # skip plans predicted to gain less


# dict=True: the decoded data and hparams are cached beside the fields (functools.cached_property);
# msgspec encodes fields only, so the wire and stored JSON stay the fields'. frozen: a cache of
# decoded fields must not outlive a change of them (`msgspec.structs.replace` makes a new spec,
# decoded anew).
class PSJobSpec(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, dict=True, frozen=True):
    """One PS training job (see the module doc for the JSON form and for `typed_data` /
    `typed_hparams`, the app's decoded data spec and hyper-parameters)."""

    # A built-in app's name, or a user's app as "module:Class" (a PSApp subclass, docs/app_api.md):
    # the RM cannot import user code, so such a job's data and hparams are checked by the app's own
    # Structs where the code is (the CLI, the AM), not here.
    app: str
    preset: Preset = "tiny"
    data: JsonObject = {}                  # overrides of the preset's data-spec fields
    hparams: JsonObject = {}               # the app's hyper-parameters
    workers: Pos = 2
    servers: Pos = 1
    max_workers: Optional[Pos] = None      # upper bounds for elastic scaling (later issues)
    max_servers: Optional[Pos] = None
    blocks: Optional[Pos] = None           # model blocks of the key space; default 4 x max servers
    sync: SyncMode = "bsp"
    staleness: Optional[Annotated[int, msgspec.Meta(ge=0)]] = None   # SSP bound; default 0 bsp, 2 ssp
    max_epochs: Optional[Pos] = None       # overrides hparams.max_epochs
    convergence_threshold: Optional[Annotated[float, msgspec.Meta(gt=0)]] = None
    # Held-out quality while training: the AM scores the model every `heldout_every_epochs` epochs
    # (0: only at the end) off the critical path; with `early_stopping` (patience, in epochs) the
    # job also ends once its held-out metric has not improved for that many epochs.
    heldout_every_epochs: Annotated[int, msgspec.Meta(ge=0)] = 2
    early_stopping: Optional[Pos] = None
    executor_memory_mb: Annotated[int, msgspec.Meta(ge=MIN_EXECUTOR_MEMORY_MB)] = 512
    executor_vcores: Pos = 1
    checkpoint_every_epochs: Annotated[int, msgspec.Meta(ge=0)] = 0   # 0: only at the end
    optimizer: Literal["off", "cruise"] = "off"   # "cruise": the AM reshapes the job while it trains
    cruise: CruiseOptions = CruiseOptions()
    elastic_mode: Literal["eps", "kill"] = "eps"
    # EPS §2.1: the early-feedback phase is the first N iterations (one pull-compute-push round of
    # every worker); the AM reports when it is over (protocol.job_report) and the policies act on it.
    early_feedback_iterations: Pos = 100
    # Workers also push +1 per mini-batch to the model key "eps:minibatches", so the servers count
    # the mini-batches they applied: an exactly-once audit of the updates across elastic changes.
    audit_updates: bool = False
    # Mini-batches per worker per clock (one BSP iteration: the barrier, and the points where an
    # elastic change, a Cruise plan or a kill-restart checkpoint can take effect). 0 = auto: the
    # AM sizes clocks to take about CLOCK_TARGET_S on the slowest worker (appmaster.ps.clock_pacing).
    clock_batches: Annotated[int, msgspec.Meta(ge=0)] = 0
    # Mini-batches a worker trains between its syncs with the servers (Bösen's client cache and
    # oplog; docs/internals.md, "Sync windows"): within such a window it reads the model through
    # a write-back cache holding its own updates, and pushes their sums at the window's end, so
    # others' updates reach it at window ends instead of after every mini-batch. 1: every
    # mini-batch pulls and pushes. One worker trains exactly the sequential loop either way.
    sync_batches: Pos = 1
    # Executor losses the job survives (YARN's max-failures style): a lost worker or server is
    # replaced and training goes back to the latest checkpoint; one loss more fails the job. 0: the
    # first loss fails it. Apps that keep training state on their workers (NMF, LDA) cannot be
    # recovered this way and fail at the first loss.
    max_executor_failures: Annotated[int, msgspec.Meta(ge=0)] = 3
    # Each worker keeps the sums of its pushes since the latest checkpoint (psruntime.push_log), so
    # a lost server of a BSP job is rebuilt on a new one without going back to that checkpoint. Off
    # by default: it costs up to the model's size of memory per worker, and time -- measured here,
    # 6-9 % longer epochs on bench/recovery.py's 102 MB MLR on a saturated 2-core host (none to see
    # beside the repeats' spread on bench/ps1_overhead.py's small MLR). Off, a lost server goes back
    # to the latest checkpoint (checkpoint_every_epochs bounds what is redone).
    push_log: bool = False
    # Dorm's submission 6-tuple (executor, d, w, n_max, n_min, cmd; Dorm §III-B) maps onto this spec:
    # the executor and cmd are the app and the PS AM, the demand vector d is one executor's resource
    # (executor_memory_mb, executor_vcores), n_max = max_workers + max_servers and n_min =
    # min_workers + min_servers (Elastane keeps the two PS roles apart, so the bounds are per role);
    # w is `weight`, the job's weight in (weighted) dominant resource fairness (dorm, drf).
    weight: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    min_workers: Pos = 1                   # lower bounds for elastic scaling (a job keeps one of each)
    min_servers: Pos = 1
    # Optimus §5.2: replace a worker confirmed at under half its peers' median speed (BSP jobs;
    # appmaster.ps.stragglers). Off by default: on an oversubscribed host healthy workers' times
    # spread that wide too, and each replacement costs a container start.
    replace_stragglers: bool = False
    # Harmony's spill (dissertation §4.3.3, psruntime.spill.worker_spill): each worker keeps this fraction
    # of its input blocks on local disk as lz4 frames, reloaded ahead of use; "auto" starts from the
    # data and model sizes against executor_memory_mb and tunes it per clock by hill climbing
    # between load stalls and memory pressure. None (the default): no spill.
    spill_alpha: Optional[Union[Annotated[float, msgspec.Meta(ge=0, le=1)], Literal["auto"]]] = None
    # The job's executors take the node arbiter's slots around every COMP / COMM subtask whether or
    # not a Harmony group holds it (without one they get no weighted CPU): the "subtasks only" step
    # of the dissertation's Fig. 4.12 breakdown -- interleaving without the grouping. Under
    # `--policy harmony` a grouped job uses the arbiter anyway; other jobs leave it alone.
    use_arbiter: bool = False
    # Threads one COMP of a worker uses (the app's row / column-sharded compute pool): what it asks
    # of its node arbiter's CPU pool (docs/harmony_arbiter.md). None: the executor's vcores, so a
    # COMP holds the cores its container was given (the paper's "a COMP holds the machine" when an
    # executor's vcores are the host's cores).
    comp_threads: Optional[Annotated[int, msgspec.Meta(ge=1, le=MAX_THREADS)]] = None   # the arbiter's u16
    # Model output (docs/model_output.md): a path, file:// or fsspec URL every node and the client
    # can read; the AM writes the final model to `<output>/final/` and, with checkpoint_every_epochs,
    # each checkpoint's to `<output>/epoch-N/`. `init_from` names such an output (or one of its
    # directories) whose values the servers start from instead of the app's initial values.
    output: str = ""
    init_from: str = ""
    # Files the job's containers need in their working dirs (YARN's LocalResources, keyed by link
    # name): a user app's modules, its data files, archives. The AM passes them on to every
    # executor container; the working dir is on sys.path, so "module:Class" imports from there.
    resources: dict[str, LocalResource] = {}
    # Where the first executors run (see the module doc): one strict ask per node for its counts.
    # Only the AM's first launch obeys it; later reshapes follow the policy's directives.
    placement: list[NodePlacement] = []

    # ----- derived values (valid after `validate`) ----------------------------------------------
    @property
    def num_blocks(self) -> int:
        if self.blocks is not None:
            return self.blocks
        return BLOCKS_PER_SERVER * max(self.servers, self.max_servers or 0)

    @property
    def ssp_staleness(self) -> int:
        if self.staleness is not None:
            return self.staleness
        return 2 if self.sync == "ssp" else 0

    @property
    def is_user_app(self) -> bool:
        """True for a "module:Class" app (no schema here: its class applies its own presets)."""
        return self.app not in APP_SCHEMAS

    def app_hparams(self) -> JsonObject:
        """The app's hyper-parameters as JSON: the preset's, the job's `hparams` over them, and the
        job-level overrides (max_epochs, threshold) over both. A user app's preset hyper-parameters
        are its class's: its loader applies them under these. The JSON a process without the app's
        types passes on (an executor's AppSetup); a reader of values takes `typed_hparams`."""
        preset_hp = {} if self.is_user_app else APP_SCHEMAS[self.app].preset_hparams[self.preset]
        hp: JsonObject = {**preset_hp, **self.hparams}
        if self.max_epochs is not None:
            hp["max_epochs"] = self.max_epochs
        if self.convergence_threshold is not None:
            hp["convergence_threshold"] = self.convergence_threshold
        return hp

    def app_data(self) -> JsonObject:
        """The app's data spec as JSON: the preset's sizes with `data` overriding them; with
        `data.path`, the dimensions of the dataset's files (DatasetError when they cannot be read).
        A user app's `data` as given: its class applies its own presets and reads its own data.
        The JSON a process without the app's types passes on; a reader of values takes
        `typed_data`. A new dict each call (the caller's to change); the files are read once."""
        return dict(self._resolved_data)

    @cached_property
    def _resolved_data(self) -> JsonObject:
        # Kept: with data.path the dimensions come from the dataset's dataset.json (a file or an
        # object-store read), which the AM would otherwise read again for every executor it sets up.
        if self.is_user_app:
            return dict(self.data)
        return resolve_data_spec(self.app, self.data, APP_SCHEMAS[self.app].presets[self.preset])

    @property
    def schema(self) -> Optional[AppSchema]:
        """The built-in app's schema; None for a user app."""
        return APP_SCHEMAS.get(self.app)

    @cached_property
    def typed_data(self) -> Optional[AppData]:
        """A built-in app's data spec decoded into its `Spec` (`app_data()` with the Struct's
        defaults): decoded once, by `validate` or on the first read, and kept. None for a user app
        (see the module doc). JobSpecError naming the field if it does not decode (a spec made
        without `validate`)."""
        schema = self.schema
        if schema is None:
            return None
        path = self.data.get("path")
        if path is not None and not isinstance(path, str):
            raise JobSpecError("data.path", f"Expected `str`, got `{type(path).__name__}`")
        try:
            resolved = self.app_data()
        except DatasetError as e:
            raise JobSpecError(f"data.{e.field}", e.detail) from None
        try:
            return msgspec.convert(resolved, schema.spec, strict=True)
        except msgspec.ValidationError as e:
            raise _field_error(e, "data") from None

    @cached_property
    def typed_hparams(self) -> Optional[AppHParams]:
        """A built-in app's hyper-parameters decoded into its `HParams` (`app_hparams()` with the
        Struct's defaults): decoded once and kept, as `typed_data`. None for a user app."""
        schema = self.schema
        if schema is None:
            return None
        try:
            return msgspec.convert(self.app_hparams(), schema.hparams, strict=True)
        except msgspec.ValidationError as e:
            # An override of max_epochs / convergence_threshold was already checked at the top level,
            # so a failure here is in the user's own hparams object.
            raise _field_error(e, "hparams") from None

    @property
    def effective_max_epochs(self) -> Optional[int]:
        """The epochs the job trains at most: `max_epochs`, else the app's (a built-in app's
        `typed_hparams`, preset applied; a user app's `hparams.max_epochs` as given, None if it
        gives none: its class's default is known only where its code is)."""
        if self.max_epochs is not None:
            return self.max_epochs
        if self.schema is not None:
            hp = self.typed_hparams
            return None if hp is None else hp.max_epochs
        value = _number(self.hparams.get("max_epochs"))
        return None if value is None else int(value)

    @property
    def effective_convergence_threshold(self) -> Optional[float]:
        """The objective change under which the job has converged, found as `effective_max_epochs`."""
        if self.convergence_threshold is not None:
            return self.convergence_threshold
        if self.schema is not None:
            hp = self.typed_hparams
            return None if hp is None else hp.convergence_threshold
        return _number(self.hparams.get("convergence_threshold"))

    def with_resources(self, resources: dict[str, LocalResource]) -> "PSJobSpec":
        """This spec with `resources` in place of its own, keeping what was decoded of its data and
        hparams (which resources do not change): the RM merges the AM's local resources in this way
        after `validate` without decoding the app's configuration again."""
        new = msgspec.structs.replace(self, resources=resources)
        for name in _DECODED:
            if name in self.__dict__:
                new.__dict__[name] = self.__dict__[name]
        return new

    def to_json(self) -> JsonObject:
        """The spec's JSON object (its fields only: what is stored, sent and shown)."""
        return cast(JsonObject, msgspec.to_builtins(self))  # a Struct encodes as an object


# The cached_property names of what a spec decodes of its data and hparams.
_DECODED = ("_resolved_data", "typed_data", "typed_hparams")


def _number(value: JsonValue) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


_NAMED = re.compile(r"^Object (?P<kind>contains unknown|missing required) field `(?P<field>[^`]*)`$")
_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)


def _field_error(e: Exception, prefix: str = "") -> JobSpecError:
    """Turn msgspec's "Expected ... - at `$.a.b`" into "prefix.a.b: Expected ..."."""
    m = _AT.match(str(e))
    msg, path = (m.group("msg"), m.group("path") or "") if m else (str(e), "")
    named = _NAMED.match(msg)
    if named:   # unknown / missing fields: msgspec names them in the text, not in the path
        path += "." + named.group("field")
        msg = "unknown field" if named.group("kind") == "contains unknown" else "required field is missing"
    dotted = (prefix + path).lstrip(".")
    # msgspec reports a __post_init__ ValueError at the Struct's path; name the object then.
    return JobSpecError(dotted, msg)


def _check_app_name(spec: PSJobSpec) -> None:
    if spec.app in APP_SCHEMAS:
        return
    if ":" not in spec.app:
        raise JobSpecError("app", f"unknown app {spec.app!r}: use a built-in app ({', '.join(APP_SCHEMAS)}) "
                           "or a user app as \"module:Class\"")
    if USER_APP.match(spec.app) is None:
        raise JobSpecError("app", f"{spec.app!r} is not \"module:Class\" (a dotted module name, a colon, "
                           "a class name; Python identifiers)")


def _check_raw_resources(raw: object) -> None:
    """Each `resources` entry on its own, so an error names it ("resources.<name>.type"; msgspec
    would say "resources[...]")."""
    if not isinstance(raw, dict):
        return
    for name, value in raw.items():
        try:
            msgspec.convert(value, LocalResource, strict=True)
        except msgspec.ValidationError as e:
            raise _field_error(e, f"resources.{name}") from None


def _check_resources(spec: PSJobSpec) -> None:
    for name, res in spec.resources.items():
        try:
            check_link_name(name)
        except LocalResourceError as e:
            raise JobSpecError(f"resources.{name}", str(e)) from None
        if not res.resource:
            raise JobSpecError(f"resources.{name}.resource", "must not be empty")
        if res.type == "PATTERN" and not res.pattern:
            raise JobSpecError(f"resources.{name}.pattern", "type PATTERN needs a pattern")


def _check_app(spec: PSJobSpec) -> None:
    """Decode a built-in app's data and hparams (kept on the spec: `typed_data`, `typed_hparams`)
    and check the workers against the data's input blocks. A user app is checked by its own
    Structs where its code is (CLI, AM)."""
    schema, data, _ = spec.schema, spec.typed_data, spec.typed_hparams
    if schema is None or data is None:
        return
    blocks = schema.num_input_blocks(data)
    if spec.workers > blocks:
        raise JobSpecError("workers", f"{spec.workers} workers but the {spec.app} data has only {blocks} "
                           f"input blocks (data.{schema.rows_field} / data.rows_per_block); "
                           f"lower workers or data.rows_per_block")


def _check_generic(spec: PSJobSpec) -> None:
    if spec.max_workers is not None and spec.max_workers < spec.workers:
        raise JobSpecError("max_workers", f"{spec.max_workers} is below workers ({spec.workers})")
    if spec.max_servers is not None and spec.max_servers < spec.servers:
        raise JobSpecError("max_servers", f"{spec.max_servers} is below servers ({spec.servers})")
    if spec.min_workers > spec.workers:
        raise JobSpecError("min_workers", f"{spec.min_workers} is above workers ({spec.workers})")
    if spec.min_servers > spec.servers:
        raise JobSpecError("min_servers", f"{spec.min_servers} is above servers ({spec.servers})")
    most_servers = max(spec.servers, spec.max_servers or 0)
    if spec.num_blocks > MAX_BLOCKS:
        field = "blocks" if spec.blocks is not None else ("max_servers" if spec.max_servers else "servers")
        raise JobSpecError(field, f"{spec.num_blocks} model blocks is more than the {MAX_BLOCKS} a job may have")
    if spec.blocks is not None and spec.blocks < most_servers:
        raise JobSpecError("blocks", f"{spec.blocks} model blocks cannot give every one of "
                           f"{most_servers} servers a block; use blocks >= {most_servers}")
    if spec.clock_batches and spec.sync_batches > spec.clock_batches:
        # A clock's batch limit is honoured at window ends: every clock would run a whole window.
        raise JobSpecError("sync_batches", f"{spec.sync_batches} mini-batches per sync window is more than the "
                           f"{spec.clock_batches} of a clock (clock_batches): a window must fit in a clock")
    if spec.sync == "bsp" and spec.staleness not in (None, 0):
        raise JobSpecError("staleness", f"{spec.staleness} needs sync \"ssp\" (bsp has staleness 0)")
    if spec.optimizer == "cruise" and spec.sync != "bsp":
        raise JobSpecError("optimizer", "\"cruise\" reshapes the job at BSP epoch boundaries: it needs sync \"bsp\"")
    if spec.optimizer == "cruise" and spec.elastic_mode != "eps":
        raise JobSpecError("optimizer", "\"cruise\" needs elastic_mode \"eps\" (it moves blocks, it does not restart)")
    if spec.sync == "ssp" and spec.staleness == 0:
        raise JobSpecError("staleness", "sync \"ssp\" needs staleness >= 1 (0 is bsp)")
    if spec.early_stopping is not None and spec.heldout_every_epochs == 0:
        raise JobSpecError("early_stopping", "needs the held-out metric while training: heldout_every_epochs >= 1")
    if spec.early_stopping is not None and spec.early_stopping < spec.heldout_every_epochs:
        raise JobSpecError("early_stopping", f"a patience of {spec.early_stopping} epochs is shorter than the "
                           f"held-out evaluation interval (heldout_every_epochs {spec.heldout_every_epochs})")


def _check_placement(spec: PSJobSpec) -> None:
    """Node names present and unique, counts not negative, and the counts summing to the shape:
    the placement is the whole first shape, so a node left out of it gets nothing."""
    seen: dict[str, int] = {}
    for i, p in enumerate(spec.placement):
        if not p.node.strip():
            raise JobSpecError(f"placement[{i}].node", "must not be empty: a node id \"host:port\" or a host name")
        if p.node in seen:
            raise JobSpecError(f"placement[{i}].node", f"{p.node!r} is named twice (placement[{seen[p.node]}] "
                               "too): one entry per node")
        seen[p.node] = i
        for role in ("workers", "servers"):
            if getattr(p, role) < 0:
                raise JobSpecError(f"placement[{i}].{role}", f"{getattr(p, role)} is negative")
    if not spec.placement:
        return
    for role in ("workers", "servers"):
        placed, wanted = sum(getattr(p, role) for p in spec.placement), getattr(spec, role)
        if placed != wanted:
            off = f"{placed - wanted} more" if placed > wanted else f"{wanted - placed} fewer"
            raise JobSpecError("placement", f"its {role} sum to {placed}, {off} than the spec's {role} ({wanted})")


def _check_model_locations(spec: PSJobSpec) -> None:
    """`output` and `init_from` are durable-storage locations; a readable `init_from` must hold a
    model of this job's app and shape (one the RM cannot read is checked again by the AM)."""
    for name in ("output", "init_from"):
        url = getattr(spec, name)
        if url:
            try:
                durable_storage.validate(url)
            except durable_storage.DurableStorageError as e:
                raise JobSpecError(name, str(e)) from None
    if spec.init_from:
        try:
            shape = None
            if spec.typed_data is not None:   # the schemas' defaults fill what the preset leaves out
                shape = model_output.builtin_model_shape(spec.app, msgspec.to_builtins(spec.typed_data),
                                                         msgspec.to_builtins(spec.typed_hparams))
            model_output.check_init_from(spec.init_from, spec.app, shape)
        except model_output.ModelOutputError as e:
            raise JobSpecError("init_from", str(e)) from None
        except Exception:  # noqa: BLE001
            # An object store's client raises its own errors (no credentials on this client, the
            # endpoint down): unreadable from here, as an OSError is. The RM's check_storage then
            # names a missing bucket or refused key; the AM reads it where it runs.
            if durable_storage.bucket_of(spec.init_from) is None:
                raise


def shape_problem(spec: PSJobSpec, workers: int, servers: int, pause: bool = False) -> Optional[str]:
    """Why a shape directed to this job is beyond the bounds its spec sets (min_workers,
    min_servers, max_workers, max_servers, its model blocks), naming the field; None if within
    them. The AM also bounds workers by the input splits, which only it knows (a directive beyond
    them is refused there). With `pause` the minimums do not apply: a paused job gives all its
    executors back, and the shape it resumes with comes in the resume directive."""
    # Below the minimums the AM would clamp the shape up silently: the directive the RM stored
    # and showed would not be the one carried out.
    if not pause and workers < spec.min_workers:
        return f"workers: {workers} is less than this job's min_workers of {spec.min_workers}"
    if not pause and servers < spec.min_servers:
        return f"servers: {servers} is less than this job's min_servers of {spec.min_servers}"
    if spec.max_workers is not None and workers > spec.max_workers:
        return f"workers: {workers} is more than this job's max_workers of {spec.max_workers}"
    if spec.max_servers is not None and servers > spec.max_servers:
        return f"servers: {servers} is more than this job's max_servers of {spec.max_servers}"
    if servers > spec.num_blocks:
        return f"servers: {servers} is more than this job's {spec.num_blocks} model blocks (a server holds at least one)"
    return None


# The schemes of the locations a process reading for someone else (the RM at submission) reads a
# job's `init_from` model and `data.path` manifest from: a plain path, file://, or an object store.
# Any other scheme fsspec implements (http://, ftp://, ...) would have the RM fetch a URL a client
# chose from inside the cluster's network and answer with what it read (server-side request forgery).
def _refused_read(url: str) -> Optional[str]:
    """Why `check_read_locations` refuses `url` (its scheme), or None when it may be read."""
    if durable_storage.local_path(url) is not None:
        return None        # read with open(), whatever the path holds
    if "::" in url:        # fsspec's URL chaining ("s3://b/x::http://...") reaches any scheme
        return "a chained URL (::)"
    if durable_storage.bucket_of(url) is not None:
        return None
    return f"the scheme {url.split('://', 1)[0]}://"


def check_read_locations(spec: PSJobSpec) -> None:
    """JobSpecError naming the field and the scheme unless the locations `validate` reads
    (`init_from`, `data.path`) are plain paths, file:// URLs or object-store URLs
    (durable_storage.BUCKET_SCHEMES). Reads nothing: run before anything is read."""
    path = spec.data.get("path")
    for field, url in (("init_from", spec.init_from), ("data.path", path if isinstance(path, str) else "")):
        why = _refused_read(url) if url else None
        if why is not None:
            raise JobSpecError(field, f"{url!r}: the RM does not read {why}; use a path, file:// or an "
                               f"object store ({', '.join(sorted(durable_storage.BUCKET_SCHEMES))})")


def validate(obj: object, untrusted: bool = False) -> PSJobSpec:
    """Decode and check a PS job spec (JSON bytes/str or decoded builtins); JobSpecError names the field.
    `untrusted`: the spec comes from a client this process does not act for (the RM at submission),
    so `check_read_locations` runs before anything it names is read."""
    if isinstance(obj, PSJobSpec):
        obj = obj.to_json()
    if isinstance(obj, (bytes, str)):
        try:
            obj = msgspec.json.decode(obj)
        except msgspec.DecodeError as e:
            raise JobSpecError("", f"malformed PS job spec JSON: {e}") from None
    if not isinstance(obj, dict):
        raise JobSpecError("", f"a PS job spec must be a JSON object, got {type(obj).__name__}")
    _check_raw_resources(obj.get("resources"))
    try:
        spec = msgspec.convert(obj, PSJobSpec, strict=True)
    except msgspec.ValidationError as e:
        raise _field_error(e) from None
    _check_app_name(spec)
    _check_resources(spec)
    _check_generic(spec)
    _check_placement(spec)
    if untrusted:
        check_read_locations(spec)
    _check_app(spec)
    _check_model_locations(spec)
    return spec


def storage_locations(spec: PSJobSpec) -> list[tuple[str, str]]:
    """(field, URL) of every location the job reads or writes: output, init_from, data.path and
    each shipped resource."""
    path = spec.data.get("path")
    found = [("output", spec.output), ("init_from", spec.init_from),
             ("data.path", path if isinstance(path, str) else ""),
             *((f"resources.{name}.resource", r.resource) for name, r in spec.resources.items())]
    return [(field, url) for field, url in found if url]


def check_storage(spec: PSJobSpec) -> None:
    """Every object-store location of the job (s3://...) has a bucket that exists and that this
    process's credentials reach (durable_storage.check_reachable: one request per bucket);
    JobSpecError naming the field and the URL if not. What the RM checks at submission, with the
    cluster's own storage settings, so that a wrong key or a missing bucket is a 400 then rather
    than a failed job later; not part of `validate`, which readers of a stored spec run too."""
    probed: set[str] = set()
    for field, url in storage_locations(spec):
        bucket = durable_storage.bucket_of(url)
        if bucket is None or bucket in probed:
            continue
        try:
            durable_storage.check_reachable(url)
        except durable_storage.DurableStorageError as e:
            raise JobSpecError(field, str(e)) from None
        probed.add(bucket)


__all__ = ["APPLICATION_TYPE", "AM_COMMAND", "ELASTANE_FIELD", "JobSpecError", "PRESET_NAMES", "PSJobSpec",
           "PS_SPEC_ENV", "USER_APP", "CruiseOptions", "check_read_locations", "check_storage", "storage_locations",
           "validate"]
