"""An NM's local container logs as the log aggregation tests lay them out: the ids they use and a
container's stdout under <log_dir>/<app_id>/<container_id>/ (the container manager's layout,
nodemanager/log_aggregation_service.py)."""
from __future__ import annotations

from pathlib import Path

APP = "application_1700000000000_0007"
OTHER = "application_1700000000000_0008"
C1 = "container_1700000000000_0007_01_000002"
C2 = "container_1700000000000_0008_01_000002"
C3 = "container_1700000000000_0008_01_000003"
NODE = "127.0.0.1:45454"


def write_stdout(logs: Path, app: str, cid: str, text: str) -> None:
    """Container `cid` of `app` wrote `text` to its stdout."""
    (logs / app / cid).mkdir(parents=True, exist_ok=True)
    (logs / app / cid / "stdout").write_text(text)
