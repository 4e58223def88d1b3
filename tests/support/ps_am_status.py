"""The PS AM's job status as the cluster tests read it: the record itself (protocol.ps_status.PsStatus),
decoded once, from the AM's `/status` while it runs or from the `status.json` it leaves on exit."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import msgspec

from protocol.ps_status import FINAL_STATUS_FILE, PsStatus, decode_status, read_status


def final_status(cluster: Any, app_id: str) -> PsStatus:
    """The job's status.json in a local cluster's RM state dir (`<base>/rm/apps/<app>/`), as the
    record the AM wrote (FileNotFoundError when the AM left none)."""
    return read_status((Path(cluster.base_dir) / "rm" / "apps" / app_id / FINAL_STATUS_FILE).read_bytes())


def running_status(app: dict[str, Any]) -> PsStatus | None:
    """The status of a job from the RM's report of it (`app`): its AM's /status while it RUNS
    with a tracking URL, decoded; None before or after, or while the AM does not answer."""
    url = app.get("trackingUrl")
    return live_status(url) if app.get("state") == "RUNNING" and isinstance(url, str) and url else None


def live_status(tracking_url: str, timeout_s: float = 5.0) -> PsStatus | None:
    """The AM's GET /status at its tracking URL, decoded; None while it does not answer (starting,
    restarting, gone). An answer that does not decode fails the test."""
    try:
        with urllib.request.urlopen(tracking_url.rstrip("/") + "/status", timeout=timeout_s) as r:
            body = json.loads(r.read())
    except (urllib.error.URLError, OSError):
        return None
    try:
        return decode_status(body)
    except msgspec.ValidationError as e:
        raise AssertionError(f"the AM's /status at {tracking_url} is not a PsStatus: {e}") from None
