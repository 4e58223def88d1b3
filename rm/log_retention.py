"""Aggregated log retention: the RM deletes an app's aggregated logs once they are old enough.

YARN's AggregatedLogDeletionService (`yarn.log-aggregation.retain-seconds`, checked every
`retain-check-interval-seconds`): an app's dir under the remote log dir is deleted once the app is
over and every file in it is older than the retention. Here cluster.toml's
`remote_app_log_retain_s` (-1, the default: keep them) and `remote_app_log_retain_check_s`
(ClusterConfig.log_retain_check_s). The RM runs it -- only the active one under HA, which is the
only one that runs an RM -- since it is what serves the aggregated logs (YARN runs it in its
JobHistory server, which Elastane does not have).

An app the RM still counts as running is never touched, however old its files (an app whose
nodes rolled nothing for longer than the retention); one the RM has forgotten (before its
restart) goes by its files' age alone, as in YARN. `expired` is the pure rule; `retention_pass`
applies it to a remote dir (blocking I/O: the RM runs it in a worker thread).
"""
from __future__ import annotations

import logging
from typing import AbstractSet, Sequence

from protocol.aggregated_logs import RemoteLogDir

log = logging.getLogger(__name__)


def expired(ages: Sequence[tuple[str, float]], running: AbstractSet[str], now: float, retain_s: float) -> list[str]:
    """The app ids of `ages` ((app id, newest file's time)) whose newest file is more than
    `retain_s` old at `now` and that are not `running`; none when `retain_s` <= 0 (keep)."""
    if retain_s <= 0:
        return []
    return [app for app, newest in ages if app not in running and now - newest > retain_s]


def retention_pass(store: RemoteLogDir, running: AbstractSet[str], now: float, retain_s: float) -> list[str]:
    """Delete the expired apps' aggregated logs from `store`; the app ids deleted. An app whose
    deletion fails is logged and tried again at the next pass."""
    removed = []
    for app in expired(store.app_ages(), running, now, retain_s):
        try:
            store.remove_app(app)
        except OSError as e:
            log.warning("could not delete the aggregated logs of %s (tried again at the next check): %s", app, e)
            continue
        removed.append(app)
        log.info("deleted the aggregated logs of %s: every file of them older than %.0f s", app, retain_s)
    return removed


__all__ = ["expired", "retention_pass"]
