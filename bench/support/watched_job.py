"""A PS job on a local cluster as the cluster benchmarks watch it: submitted over the RM's REST
API, observed through the RM and its AM's tracking URL, killed and waited out (its processes gone
and every node empty again, so the next job finds the NMs' resources free)."""
from __future__ import annotations

import time
import urllib.error
from pathlib import Path
from typing import Any, Callable

from appmaster.ps.submission import build_ps_submission
from elastane_cli.local_cluster import LocalCluster
import msgspec

from protocol import tokens
from protocol.ps_status import PsStatus, ScaleRequest, decode_status
from support.http_json import http_json

FINAL = ("FINISHED", "FAILED", "KILLED")


def http(url: str, method: str = "GET", body: Any = None, timeout_s: float = 600.0) -> Any:
    return http_json(url, method, body, timeout_s)


def wait_for(cond: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(poll_s)


class Job:
    """One submitted PS job, watched through the RM and its AM's tracking URL."""

    def __init__(self, cluster: LocalCluster, spec: dict[str, Any], name: str, max_app_attempts: int = 1,
                 keep_containers: bool | None = None) -> None:
        self.rm = cluster.rm_url
        self.cluster_secret = cluster.secret     # the bench owns the cluster: it signs the AM's control token
        new = http(f"{self.rm}/ws/v1/cluster/apps/new-application?user.name=bench", "POST")
        self.app_id = new["application-id"]
        sub = build_ps_submission(spec, name=name, am_memory=512, app_id=self.app_id,
                                  max_app_attempts=max_app_attempts, keep_containers=keep_containers)
        http(f"{self.rm}/ws/v1/cluster/apps?user.name=bench", "POST", sub)
        self.url = ""

    def app(self) -> dict[str, Any]:
        return http(f"{self.rm}/ws/v1/cluster/apps/{self.app_id}")["app"]

    def status(self) -> PsStatus | None:
        """The AM's /status, decoded (None while there is no AM to ask or it does not answer)."""
        app = self.app()
        if app["state"] in FINAL:
            raise RuntimeError(f"{self.app_id} ended: {app['finalStatus']}: {app['diagnostics']}")
        if app["state"] != "RUNNING" or not app.get("trackingUrl"):
            return None
        self.url = app["trackingUrl"].rstrip("/")
        try:
            return decode_status(http(self.url + "/status", timeout_s=30))
        except (urllib.error.URLError, OSError, RuntimeError, msgspec.ValidationError):
            return None

    def epochs(self) -> int:
        s = self.status()
        return len(s.objective_history) if s else 0

    def wait_epochs(self, n: int, timeout_s: float = 900.0) -> None:
        wait_for(lambda: self.epochs() >= n, timeout_s, f"{self.app_id} to finish {n} epochs")

    def scale(self, workers: int, servers: int) -> tuple[list[dict[str, Any]], float]:
        """POST /scale to the AM (EPS, synchronous: returns once the change is done) with the
        app's control token, signed from the cluster secret the benchmark holds."""
        st = self.status()
        attempt = st.attempt_id if st is not None else None
        if attempt is None:
            raise RuntimeError(f"{self.app_id}: no AM status to scale through")
        token = tokens.am_control_token(tokens.job_secret(self.cluster_secret, attempt), attempt)
        t0 = time.perf_counter()
        out = http_json(self.url + "/scale", "POST", ScaleRequest(workers=workers, servers=servers), 600.0,
                        headers=tokens.bearer(token))
        return out["changes"], time.perf_counter() - t0

    def kill(self) -> None:
        """Kill the app and wait until its processes are gone and every node is empty again
        (so the next job finds the NMs' resources free, not only the RM's books)."""
        http(f"{self.rm}/ws/v1/cluster/apps/{self.app_id}/state?user.name=bench", "PUT", {"state": "KILLED"})
        wait_for(lambda: self.app()["state"] in FINAL, 120, f"{self.app_id} to end")
        wait_for(lambda: not pids_of_app(self.app_id), 120, f"the processes of {self.app_id} to exit")
        wait_for(lambda: all(n["numContainers"] == 0 for n in
                             http(f"{self.rm}/ws/v1/cluster/nodes")["nodes"]["node"]), 120, "empty nodes")


def am_log_tail(cluster: LocalCluster, app_id: str, lines: int = 30) -> str:
    """The end of the AM container's stderr (container ..._000001 of the app's first attempt)."""
    for f in Path(cluster.base_dir).glob(f"nm*/logs/{app_id}/container_*_01_000001/stderr"):
        return "\n".join(f.read_text(errors="replace").splitlines()[-lines:])
    return "(no AM log found)"


def pids_of_app(app_id: str) -> list[int]:
    """Live processes whose environment names the app (APPLICATION_ID=<app_id>)."""
    needle = f"APPLICATION_ID={app_id}".encode()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if needle in (d / "environ").read_bytes().split(b"\0") and \
                    (d / "stat").read_text().split(") ")[1][0] != "Z":
                out.append(int(d.name))
        except OSError:
            continue
    return out


def mlr_job_spec(features: int, classes: int, samples: int, executor_mb: int, **extra: Any) -> dict[str, Any]:
    """The MLR job the reshaping and recovery benchmarks share: 3 workers, 3 servers, 12 model
    blocks, a model of features x classes float32 (210,000 x 128 = 102.5 MiB by default);
    `extra` adds or overrides spec fields."""
    return {"app": "mlr", "workers": 3, "servers": 3, "blocks": 12, "max_epochs": 50,
            "executor_memory_mb": executor_mb,
            "data": {"num_samples": samples, "num_features": features, "num_classes": classes,
                     "nnz_per_sample": 20, "num_heldout": 500, "rows_per_block": 500},
            "hparams": {"learning_rate": 0.5, "features_per_key": 4}, **extra}
