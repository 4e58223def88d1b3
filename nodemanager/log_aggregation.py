"""Log aggregation's decisions (sans I/O): when this node uploads an app's logs, which bytes, and
when it frees its local copies. `log_aggregation_service` does the listing, uploading and deleting.

Per app on this node:
- while it runs, every `roll_interval_s` (0 = never) a rolled upload takes the bytes each of its
  log files gained since the last roll (YARN's rolling aggregation, roll-monitoring-interval);
- once the RM says it finished (and its containers stopped), the final upload takes every log
  file whole; after it, the rolls are redundant and deleted;
- `retention_s` (nm.toml's keep_finished_logs_s) after the final upload the local copies are
  freed; until then, and for ever while the final upload fails, they stay (nothing is lost when
  the remote store is down);
- when the NM stops, an app none of whose containers here still runs gets its final upload then
  (`stopping`), even if it runs on elsewhere: what this node holds of it is all it will hold;
- after an NM restart the node's final file of an app already on the store (`recover`) is kept
  as it is when it holds every local log whole: nothing is sent again.
A failed upload, or a failed listing of the store before one, is tried again after a backoff that
doubles up to `MAX_BACKOFF_S`.

Each app's state is also reported to the RM (YARN's LogAggregationReport, for the app view's
logAggregationStatus): RUNNING once a roll is up, RUNNING_WITH_FAILURE while a roll fails, FAILED
while the final upload fails (YARN gives up there; this node keeps the local copies and tries
again, so a later success reports SUCCEEDED), SUCCEEDED once the final file is up. A report waits in
`outbox` until the RM has taken it (`delivered`), so none is lost with a heartbeat.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional, Sequence

from protocol.aggregated_logs import AggregatedLogIndex, ChunkSource
from protocol.internal_api import LogAggregationReport
from protocol.internal_api import LogAggregationStatus as S

MIN_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0


@dataclass(frozen=True)
class LocalLogFile:
    """A container's log file on this node's disk and its size when listed."""

    container_id: str
    file_name: str
    path: str
    size: int


@dataclass(frozen=True)
class Upload:
    """One upload to make: a final or rolled file of `app_id` with these chunks."""

    app_id: str
    kind: Literal["final", "roll"]
    seq: int
    sources: tuple[ChunkSource, ...]


@dataclass
class AppLogState:
    """What this node has done with one app's logs."""

    app_id: str
    user: str = ""
    seen_at: float = 0.0
    last_roll_at: float = 0.0
    next_seq: int = 1
    uploaded: dict[tuple[str, str], int] = field(default_factory=dict)   # (container, file) -> bytes rolled
    finished_at: Optional[float] = None       # the RM said the app is over
    final_at: Optional[float] = None          # the final upload succeeded
    freed: bool = False                       # the local copies are gone
    failures: int = 0
    retry_at: float = 0.0
    recovered: bool = False                   # the remote's rolls of this node were read back
    # (container, file) -> bytes of the node's final file already on the store (read back by
    # `recover`); None: there is none.
    stored_final: Optional[dict[tuple[str, str], int]] = None
    error: str = ""                           # why the last upload failed
    told: tuple[S, str] = (S.NOT_START, "")   # the report the RM last took


class LogAggregationPlanner:
    """The pure core: every method takes the time as an argument and does no I/O."""

    def __init__(self, roll_interval_s: float, retention_s: float):
        self.roll_interval_s = roll_interval_s
        self.retention_s = retention_s
        self.apps: dict[str, AppLogState] = {}
        self.outbox: dict[str, LogAggregationReport] = {}     # app id -> report the RM has not taken

    def seen(self, app_id: str, user: str, now: float) -> AppLogState:
        """An app with containers (or logs) on this node; its first roll is one interval away."""
        st = self.apps.get(app_id)
        if st is None:
            st = self.apps[app_id] = AppLogState(app_id, user, seen_at=now, last_roll_at=now)
        if user and not st.user:
            st.user = user
        return st

    def finished(self, app_id: str, user: str, now: float) -> None:
        st = self.seen(app_id, user, now)
        if st.finished_at is None:
            st.finished_at = now
            st.retry_at = now

    def stopping(self, app_id: str, user: str, now: float) -> None:
        """The NM stops and none of the app's containers here runs any more: what this node holds
        of the app is all it will hold, so its final upload is due now, backoff or not (the app
        may run on elsewhere: this node's part of it is over)."""
        self.finished(app_id, user, now)
        self.apps[app_id].retry_at = now

    def recover(self, app_id: str, rolls: Sequence[AggregatedLogIndex],
                final: Optional[AggregatedLogIndex] = None) -> None:
        """Continue after the uploads this node made before a restart: the rolls' bytes are not
        sent again and the next roll takes the next number; a final file (the app ended, or the
        NM stopped, before) is not written again if it still holds every local log whole
        (`next_upload`). The owner their indexes name is kept when this run does not know it (a
        rewritten file must name it: under token auth only the owner may read it)."""
        st = self.apps[app_id]
        for ix in rolls:
            st.next_seq = max(st.next_seq, ix.seq + 1)
            for c in ix.chunks:
                key = (c.container_id, c.file_name)
                st.uploaded[key] = max(st.uploaded.get(key, 0), c.start + c.length)
        if final is not None:
            st.stored_final = {}
            for c in final.chunks:
                key = (c.container_id, c.file_name)
                st.stored_final[key] = c.start + c.length
                st.uploaded[key] = max(st.uploaded.get(key, 0), c.start + c.length)
        if not st.user:
            st.user = next((ix.user for ix in [*rolls, *([final] if final else [])] if ix.user), "")
        st.recovered = True
        self._changed(st)

    # ----- what to do now ---------------------------------------------------------------------

    def due(self, st: AppLogState, now: float) -> bool:
        """Whether an upload of the app may be due now (so its log dir is worth listing)."""
        if st.final_at is not None or now < st.retry_at:
            return False
        return st.finished_at is not None or (self.roll_interval_s > 0 and now - st.last_roll_at >= self.roll_interval_s)

    def next_upload(self, st: AppLogState, files: Sequence[LocalLogFile], now: float) -> Optional[Upload]:
        """The upload due for the app now, given its local log files; None if nothing is due."""
        if not self.due(st, now):
            return None
        if st.finished_at is not None:
            kept = st.stored_final
            if kept is not None and all(kept.get((f.container_id, f.file_name), -1) >= f.size for f in files):
                # The store's final file of this node holds it all already: rewriting it would
                # only risk it (a failed object upload is removed, the good file with it).
                return Upload(st.app_id, "final", 0, ())
            sources = tuple(ChunkSource(f.container_id, f.file_name, f.path, 0, f.size) for f in files)
            return Upload(st.app_id, "final", 0, sources)
        new = tuple(ChunkSource(f.container_id, f.file_name, f.path, done, f.size - done)
                    for f in files for done in [st.uploaded.get((f.container_id, f.file_name), 0)]
                    if f.size > done)
        if not new:
            st.last_roll_at = now       # nothing new: the next look is one interval away
            return None
        return Upload(st.app_id, "roll", st.next_seq, new)

    def uploaded(self, up: Upload, now: float) -> None:
        st = self.apps[up.app_id]
        st.failures, st.retry_at, st.error = 0, now, ""
        if up.kind == "final":
            st.final_at = now
        else:
            for s in up.sources:
                st.uploaded[(s.container_id, s.file_name)] = s.start + s.length
            st.next_seq = up.seq + 1
            st.last_roll_at = now
        self._changed(st)

    def failed(self, up: Upload, now: float, error: str = "") -> float:
        """Back off before the app's next try; returns the delay."""
        return self._backoff(self.apps[up.app_id], up.kind, now, error)

    def listing_failed(self, app_id: str, now: float, error: str = "") -> float:
        """The store could not list the node's earlier uploads of the app (read before its first
        upload of this run): a failed try of the upload that was due, with the same backoff and
        report (FAILED for a final one); returns the delay."""
        st = self.apps[app_id]
        kind = "final" if st.finished_at is not None else "roll"
        return self._backoff(st, kind, now, f"cannot list the earlier uploads: {error}")

    def _backoff(self, st: AppLogState, kind: str, now: float, error: str) -> float:
        st.failures += 1
        delay = min(MAX_BACKOFF_S, MIN_BACKOFF_S * 2 ** (st.failures - 1))
        st.retry_at = now + delay
        st.error = f"{kind} upload failed {st.failures} time(s), next try in {delay:g} s: {error}"
        self._changed(st)
        return delay

    # ----- reports to the RM ------------------------------------------------------------------

    @staticmethod
    def status(st: AppLogState) -> tuple[S, str]:
        """The app's log aggregation status on this node, and why (for the failures)."""
        if st.final_at is not None:
            return S.SUCCEEDED, ""
        if st.failures:
            return (S.FAILED if st.finished_at is not None else S.RUNNING_WITH_FAILURE), st.error
        if st.next_seq > 1:
            return S.RUNNING, ""
        return S.NOT_START, ""

    def _changed(self, st: AppLogState) -> None:
        status, why = self.status(st)
        if (status, why) == st.told:
            self.outbox.pop(st.app_id, None)
        else:
            self.outbox[st.app_id] = LogAggregationReport(st.app_id, status, why)

    def pending_reports(self) -> list[LogAggregationReport]:
        """The reports the RM has not taken yet (for the next heartbeat)."""
        return list(self.outbox.values())

    def all_reports(self) -> list[LogAggregationReport]:
        """Every app's report but NOT_START's (the RM's default), for a (re)registration."""
        out = dict(self.outbox)
        for st in self.apps.values():
            status, why = self.status(st)
            if status != S.NOT_START:
                out[st.app_id] = LogAggregationReport(st.app_id, status, why)
        return list(out.values())

    def delivered(self, reports: Sequence[LogAggregationReport]) -> None:
        """The RM took these reports: they leave the outbox unless a newer one replaced them. The
        state may have moved on while they were on their way -- back to what the RM was told
        before, when no report was queued -- so the current one is queued again if it differs."""
        for r in reports:
            if self.outbox.get(r.app_id) == r:
                del self.outbox[r.app_id]
            st = self.apps.get(r.app_id)
            if st is not None:
                st.told = (r.status, r.diagnostics)
                self._changed(st)

    def to_free(self, now: float) -> list[str]:
        """Apps whose final upload is `retention_s` old and whose local copies are still here."""
        return [a for a, st in self.apps.items()
                if st.final_at is not None and not st.freed and now - st.final_at >= self.retention_s]

    def freed(self, app_id: str) -> None:
        self.apps[app_id].freed = True

    def holds(self, app_id: str, now: float) -> bool:
        """Whether the app's local logs must stay: not yet aggregated in full, or within retention."""
        st = self.apps.get(app_id)
        if st is None:
            return True         # not seen yet: the next pass will aggregate it
        return st.final_at is None or now - st.final_at < self.retention_s

    def forget(self, known: set[str]) -> list[str]:
        """Drop the state of freed apps the container manager no longer knows (while it still
        has their containers, the state says their logs are aggregated and may go)."""
        gone = [a for a, st in self.apps.items() if st.freed and a not in known]
        for a in gone:
            del self.apps[a]
        return gone
