"""The RM state store: an abstract interface and its SQLite implementation.

Apps and attempts are stored as JSON documents keyed by id (the msgspec JSON encoding of
`AppRecord` / `AttemptRecord`), so a ZooKeeper or etcd store only has to implement the same four
methods of `StateStore` and keep the documents as they are given.

A PS job's spec is part of its app's document in its typed form: `AppRecord.ps_job` is the
`PSJobSpec` the RM decoded at submission, encoded by msgspec and decoded once on recovery
(`app_from_record` then builds the app's `PSJobView`). Documents written before the spec was kept
typed hold it raw inside the extension, `elastane["ps-job"]`, and a `submission` copy of the whole
request: they still load -- the raw spec is decoded there, once, and `submission` is ignored.
"""
from __future__ import annotations

import abc
import sqlite3
from pathlib import Path
from typing import Optional, Sequence

import msgspec

from protocol import ps_job_spec
from protocol.internal_api import ShapeDirective
from protocol.local_resources import LocalResource
from protocol.ps_job_spec import PSJobSpec
from protocol.records import AppState, AttemptState, FinalStatus, Resource

from .model import AmSpec, App, Attempt
from .policies.snapshot import ps_job_view


class AppRecord(msgspec.Struct, forbid_unknown_fields=False):
    """What survives an RM restart of an app."""

    app_id: str
    user: str
    name: str
    queue: str
    app_type: str
    am_commands: list[str]
    am_environment: dict[str, str]
    am_local_resources: dict[str, LocalResource]
    am_resource: Resource
    max_attempts: int
    submit_time: float
    seq: int
    state: str
    final_status: str
    diagnostics: str = ""
    start_time: float = 0.0
    finish_time: float = 0.0
    tracking_url: str = ""
    progress: float = 0.0
    # The submission's Elastane extension without the PS job spec (App.extension); in a document
    # written before `ps_job` existed, the whole extension, the raw spec under "ps-job" included.
    elastane: Optional[dict[str, object]] = None
    memory_seconds: float = 0.0
    vcore_seconds: float = 0.0
    ps_job: Optional[PSJobSpec] = None      # an ELASTANE_PS app's spec (App.ps.spec)
    # The policy's latest directive for the app, its version counter and the version its AM was
    # last sent: a new active RM knows what each job was told (a policy deciding the same again
    # changes nothing) and numbers the next directive above it (an AM ignores a version it has seen).
    directive: Optional[ShapeDirective] = None
    directive_version: int = 0
    delivered_directive_version: int = 0
    keep_containers: bool = False           # App.keep_containers (a record without it: off)
    lifetime_expiry: Optional[float] = None     # App.lifetime_expiry (a record without it: none)


class PolicyStateRecord(msgspec.Struct, forbid_unknown_fields=False):
    """What survives an RM restart or failover of the policy (rm/policies/base.py `export_state`):
    its name, the RUNNING nodes it last decided over (the new RM's policy rounds wait for them to
    register again, rm/policy_resync.py) and its own state document, decoded by the policy itself
    (`restore_state`) -- a policy with none stores `state` null (`policy_state` None)."""

    policy: str
    saved_at: float
    nodes: list[str] = []
    state: msgspec.Raw = msgspec.Raw(b"null")

    @property
    def policy_state(self) -> Optional[bytes]:
        doc = bytes(self.state)
        return None if doc.strip() in (b"", b"null") else doc


class DecommissionEntry(msgspec.Struct, forbid_unknown_fields=False):
    """One decommissioned or decommissioning node: its state, when its containers are killed
    (None: never) and what the node list shows of it until its NM registers again."""

    state: str                      # DECOMMISSIONING | DECOMMISSIONED
    deadline: Optional[float] = None
    http_address: str = ""
    rack: str = ""
    capability: Resource = Resource(0, 0)


class DecommissionRecord(msgspec.Struct, forbid_unknown_fields=False):
    """The nodes an admin took out (graceful decommission), kept across an RM restart or failover
    as YARN keeps its exclude list in a file."""

    nodes: dict[str, DecommissionEntry] = {}


class AttemptRecord(msgspec.Struct, forbid_unknown_fields=False):
    """What survives an RM restart of an attempt."""

    attempt_id: str
    app_id: str
    number: int
    state: str
    start_time: float
    finish_time: float = 0.0
    diagnostics: str = ""
    counts_as_failure: bool = True
    am_container_id: str = ""
    am_node_id: str = ""
    am_node_http_address: str = ""
    tracking_url: str = ""
    previous_containers: list[str] = []     # Attempt.previous_containers (kept across attempts)


def app_to_record(app: App) -> AppRecord:
    return AppRecord(app_id=app.app_id, user=app.user, name=app.name, queue=app.queue, app_type=app.app_type,
                     am_commands=app.am.commands, am_environment=app.am.environment,
                     am_local_resources=app.am.local_resources, am_resource=app.am.resource,
                     max_attempts=app.max_attempts, submit_time=app.submit_time, seq=app.seq,
                     state=app.state.value, final_status=app.final_status.value, diagnostics=app.diagnostics,
                     start_time=app.start_time, finish_time=app.finish_time, tracking_url=app.tracking_url,
                     progress=app.progress, elastane=app.extension, memory_seconds=app.memory_seconds,
                     vcore_seconds=app.vcore_seconds, ps_job=app.ps.spec if app.ps is not None else None,
                     directive=app.directive, directive_version=app.directive_version,
                     delivered_directive_version=app.delivered_directive_version,
                     keep_containers=app.keep_containers, lifetime_expiry=app.lifetime_expiry)


def _stored_spec(r: AppRecord) -> tuple[Optional[PSJobSpec], Optional[dict[str, object]]]:
    """The record's PS job spec and the rest of its extension. A document from before the typed
    spec holds it raw in the extension: decoded here as the RM's policies decoded it then (types
    coerced); one that no longer decodes stays raw in the extension, and the app is no PS job to
    the policies or gang admission (as it was to them before)."""
    if r.ps_job is not None or r.elastane is None or r.app_type.upper() != ps_job_spec.APPLICATION_TYPE:
        return r.ps_job, r.elastane
    raw = r.elastane.get(ps_job_spec.ELASTANE_FIELD)
    if not isinstance(raw, dict):
        return None, r.elastane
    try:
        spec = msgspec.convert(raw, PSJobSpec, strict=False)
    except msgspec.ValidationError:
        return None, r.elastane
    rest = {k: v for k, v in r.elastane.items() if k != ps_job_spec.ELASTANE_FIELD}
    return spec, rest or None


def app_from_record(r: AppRecord, minimum_allocation_mb: int) -> App:
    """The app an RM restores from its record; `minimum_allocation_mb` is the scheduler's (the
    PS job's view rounds its executor to it, as at submission)."""
    spec, extension = _stored_spec(r)
    return App(app_id=r.app_id, user=r.user, name=r.name, queue=r.queue, app_type=r.app_type,
               am=AmSpec(r.am_commands, r.am_environment, r.am_local_resources, r.am_resource),
               max_attempts=r.max_attempts, submit_time=r.submit_time, seq=r.seq, keep_containers=r.keep_containers,
               ps=ps_job_view(spec, minimum_allocation_mb) if spec is not None else None, extension=extension,
               state=AppState(r.state), final_status=FinalStatus(r.final_status),
               diagnostics=r.diagnostics, start_time=r.start_time, finish_time=r.finish_time,
               tracking_url=r.tracking_url, progress=r.progress, memory_seconds=r.memory_seconds,
               vcore_seconds=r.vcore_seconds, directive=r.directive,
               # Never below the stored directive's own number (a document that predates the counter).
               directive_version=max(r.directive_version, r.directive.version if r.directive is not None else 0),
               delivered_directive_version=r.delivered_directive_version, lifetime_expiry=r.lifetime_expiry)


def attempt_to_record(at: Attempt) -> AttemptRecord:
    return AttemptRecord(at.attempt_id, at.app_id, at.number, at.state.value, at.start_time, at.finish_time,
                         at.diagnostics, at.counts_as_failure, at.am_container_id, at.am_node_id,
                         at.am_node_http_address, at.tracking_url, list(at.previous_containers))


def attempt_from_record(r: AttemptRecord) -> Attempt:
    return Attempt(attempt_id=r.attempt_id, app_id=r.app_id, number=r.number, state=AttemptState(r.state),
                   start_time=r.start_time, finish_time=r.finish_time, diagnostics=r.diagnostics,
                   counts_as_failure=r.counts_as_failure, am_container_id=r.am_container_id,
                   am_node_id=r.am_node_id, am_node_http_address=r.am_node_http_address,
                   tracking_url=r.tracking_url, previous_containers=list(r.previous_containers))


class StateStore(abc.ABC):
    """Durable storage of apps and attempts for RM restart (and, later, HA)."""

    @abc.abstractmethod
    def save_app(self, app: AppRecord, attempts: list[AttemptRecord]) -> None:
        """Write an app and its attempts, atomically (the etcd store: when they fit one etcd
        transaction, else the app's record after its attempts, rm/ha/etcd_store.py `_app_txns`)."""

    def save_apps(self, apps: Sequence[tuple[AppRecord, list[AttemptRecord]]]) -> dict[str, Exception]:
        """Write each app with its attempts (each atomically); the apps that could not be written,
        with why. One app's failure does not keep the others from being written. A store whose
        writes are round trips (etcd) packs several apps into one write."""
        failed: dict[str, Exception] = {}
        for app, attempts in apps:
            try:
                self.save_app(app, attempts)
            except Exception as e:      # noqa: BLE001 - reported per app to the caller
                failed[app.app_id] = e
        return failed

    @abc.abstractmethod
    def load(self) -> list[tuple[AppRecord, list[AttemptRecord]]]:
        """Every stored app with its attempts, in submission order."""

    @abc.abstractmethod
    def remove_app(self, app_id: str) -> None:
        """Forget an app (and its attempts)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the store."""

    @abc.abstractmethod
    def save_policy_state(self, record: PolicyStateRecord) -> None:
        """Replace the stored policy state (one document per cluster)."""

    @abc.abstractmethod
    def load_policy_state(self) -> Optional[PolicyStateRecord]:
        """The stored policy state; None when none was stored."""

    @abc.abstractmethod
    def save_decommissions(self, record: DecommissionRecord) -> None:
        """Replace the stored decommissioned and decommissioning nodes."""

    @abc.abstractmethod
    def load_decommissions(self) -> DecommissionRecord:
        """The stored decommissions (none when none was stored)."""

    @property
    def fenced(self) -> bool:
        """The store refused a write because another RM is or may be active (the HA store's
        fencing, rm/ha/etcd_store.py): it refuses every later one too. Never for SQLite."""
        return False

    def next_epoch(self) -> Optional[int]:
        """Take this RM start's epoch, the part of new container ids that keeps them from colliding
        with the ids an earlier RM issued (the attempts a restarted RM keeps go on getting
        containers: YARN's RMStateStore.getAndIncrementEpoch). None when the store keeps no epoch
        (the HA store: the elected term's epoch is used, rm/ha/)."""
        return None


_SCHEMA = """
CREATE TABLE IF NOT EXISTS apps (app_id TEXT PRIMARY KEY, seq INTEGER NOT NULL, doc BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS attempts (attempt_id TEXT PRIMARY KEY, app_id TEXT NOT NULL, doc BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS attempts_by_app ON attempts (app_id);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS policy (key TEXT PRIMARY KEY, doc BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS nodes (key TEXT PRIMARY KEY, doc BLOB NOT NULL);
"""


class SqliteStateStore(StateStore):
    """SQLite (WAL) store at `<state_dir>/state.db`."""

    def __init__(self, state_dir: str | Path):
        path = Path(state_dir)
        path.mkdir(parents=True, exist_ok=True)
        self.path = path / "state.db"
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._enc = msgspec.json.Encoder()

    def save_app(self, app: AppRecord, attempts: list[AttemptRecord]) -> None:
        with self._db:
            self._db.execute("BEGIN")
            self._db.execute("INSERT OR REPLACE INTO apps VALUES (?, ?, ?)", (app.app_id, app.seq, self._enc.encode(app)))
            self._db.executemany("INSERT OR REPLACE INTO attempts VALUES (?, ?, ?)",
                                 [(a.attempt_id, a.app_id, self._enc.encode(a)) for a in attempts])

    def load(self) -> list[tuple[AppRecord, list[AttemptRecord]]]:
        out = []
        for (doc,) in self._db.execute("SELECT doc FROM apps ORDER BY seq, app_id").fetchall():
            app = msgspec.json.decode(doc, type=AppRecord)
            rows = self._db.execute("SELECT doc FROM attempts WHERE app_id = ?", (app.app_id,)).fetchall()
            attempts = sorted((msgspec.json.decode(d, type=AttemptRecord) for (d,) in rows), key=lambda a: a.number)
            out.append((app, attempts))
        return out

    def next_epoch(self) -> Optional[int]:
        """0 at the first start on this store, then one more at each (so a fresh cluster's ids keep
        YARN's plain form)."""
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            row = self._db.execute("SELECT value FROM meta WHERE key = 'epoch'").fetchone()
            epoch = int(row[0]) if row else 0
            self._db.execute("INSERT OR REPLACE INTO meta VALUES ('epoch', ?)", (epoch + 1,))
        return epoch

    def remove_app(self, app_id: str) -> None:
        with self._db:
            self._db.execute("BEGIN")
            self._db.execute("DELETE FROM attempts WHERE app_id = ?", (app_id,))
            self._db.execute("DELETE FROM apps WHERE app_id = ?", (app_id,))

    def save_policy_state(self, record: PolicyStateRecord) -> None:
        with self._db:
            self._db.execute("BEGIN")
            self._db.execute("INSERT OR REPLACE INTO policy VALUES ('state', ?)", (self._enc.encode(record),))

    def load_policy_state(self) -> Optional[PolicyStateRecord]:
        row = self._db.execute("SELECT doc FROM policy WHERE key = 'state'").fetchone()
        return None if row is None else msgspec.json.decode(row[0], type=PolicyStateRecord)

    def save_decommissions(self, record: DecommissionRecord) -> None:
        with self._db:
            self._db.execute("BEGIN")
            self._db.execute("INSERT OR REPLACE INTO nodes VALUES ('decommissions', ?)", (self._enc.encode(record),))

    def load_decommissions(self) -> DecommissionRecord:
        row = self._db.execute("SELECT doc FROM nodes WHERE key = 'decommissions'").fetchone()
        return DecommissionRecord() if row is None else msgspec.json.decode(row[0], type=DecommissionRecord)

    def close(self) -> None:
        self._db.close()
