"""Find an app's containers across the cluster and fetch their logs from the NMs.

Which containers exist comes from two places: the RM's app attempts (the AM container and its
node) and every running NM's /ws/v1/node/containers list, filtered by the app's id.
"""
from __future__ import annotations

from dataclasses import dataclass
from protocol import ids

from .errors import CliError, UsageError
from .rm_rest_client import RmRestClient

LOG_FILES = ("stdout", "stderr")


@dataclass(frozen=True, order=True)
class ContainerRef:
    """A container of the app and the NM (host:port) that holds its logs."""

    container_id: str
    node_http_address: str


def app_key(app_id: str) -> str:
    """`<clusterTs>_<seq>` of an app id; container ids of that app contain it."""
    try:
        a = ids.ApplicationId.parse(app_id)
    except ValueError as e:
        raise UsageError(str(e)) from None
    return f"{a.cluster_ts}_{a.seq:04d}"


def belongs_to(container_id: str, app_id: str) -> bool:
    try:
        return str(ids.ContainerId.parse(container_id).app) == app_id
    except ValueError:
        return False


def _strip_scheme(addr: str) -> str:
    for prefix in ("http://", "https://"):
        if addr.startswith(prefix):
            return addr[len(prefix):].rstrip("/")
    return addr.rstrip("/")


async def find_containers(client: RmRestClient, app_id: str) -> list[ContainerRef]:
    """Every container of `app_id` the RM's attempts or the running NMs know of, sorted by id."""
    app_key(app_id)  # validates the id before any call
    found: dict[str, ContainerRef] = {}
    for att in await client.app_attempts(app_id):
        cid, addr = att.get("containerId"), att.get("nodeHttpAddress")
        if cid and addr:
            found[cid] = ContainerRef(cid, _strip_scheme(addr))
    for node in await client.nodes():
        addr = node.get("nodeHTTPAddress") or node.get("nodeHttpAddress")
        if not addr or node.get("state") not in ("RUNNING", "UNHEALTHY", None):
            continue
        try:
            containers = await client.nm_containers(addr)
        except CliError:
            continue  # one unreachable NM must not hide the others' logs
        for c in containers:
            cid = c.get("id") or c.get("containerId") or ""
            if belongs_to(cid, app_id):
                found[cid] = ContainerRef(cid, _strip_scheme(addr))
    return sorted(found.values())


async def fetch_log(client: RmRestClient, ref: ContainerRef, file: str) -> str:
    return await client.container_log(ref.node_http_address, ref.container_id, file)


def select(refs: list[ContainerRef], container: str | None) -> list[ContainerRef]:
    if container is None:
        return refs
    chosen = [r for r in refs if r.container_id == container]
    if not chosen:
        raise UsageError(f"container {container} of this app was not found on any node")
    return chosen

