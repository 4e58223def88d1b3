"""Find an app's containers across the cluster and fetch their logs: from the NMs, and from the
aggregated logs in cluster.toml's `remote_app_log_dir` (as `yarn logs` reads the remote dir).

Which containers exist comes from three places: the RM's app attempts (the AM container and its
node), every running NM's /ws/v1/node/containers list, filtered by the app's id, and the
aggregated files of the app (protocol/aggregated_logs.py). A container's logs are read from its
node's final aggregated file when there is one (the app is over), else from its NM, else -- the
node is gone -- from the node's rolled uploads.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from protocol import aggregated_logs, config, ids
from protocol.aggregated_logs import AggregatedLogError, NodeLogs, RemoteLogDir

from .context import CliContext
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
            cid = str(c.get("id") or c.get("containerId") or "")
            if belongs_to(cid, app_id):
                found[cid] = ContainerRef(cid, _strip_scheme(addr))
    return sorted(found.values())


async def fetch_log(client: RmRestClient, ref: ContainerRef, file: str) -> str:
    return await client.container_log(ref.node_http_address, ref.container_id, file)


# ----- aggregated logs ---------------------------------------------------------------------------

def remote_log_dir(ctx: CliContext) -> RemoteLogDir | None:
    """cluster.toml's remote_app_log_dir (the local cluster's conf, else the installation's); None
    when log aggregation is off, or -- with a warning on ctx.err saying why -- when this client
    cannot use it: a conf it may not read (cluster.toml holds the cluster secret, mode 0600:
    docs/operating.md) or a store whose filesystem is not installed here. The live NMs' logs are
    still shown then. A malformed cluster.toml is an error, as main's [storage] check makes it."""
    from .main import cluster_conf_file  # noqa: PLC0415  (main imports this module's command)

    try:
        url = config.load_cluster(str(cluster_conf_file(ctx))).remote_app_log_dir
        return RemoteLogDir(url) if url else None
    except config.ConfigError as e:
        raise UsageError(f"remote_app_log_dir: {e}") from None
    except (OSError, AggregatedLogError) as e:
        ctx.err.write(f"elastane: warning: not reading the aggregated logs ({_one_line(e)}); "
                      "showing the logs on the running nodes only\n")
        return None


def _one_line(e: BaseException) -> str:
    """An error as one line of a warning: its first line, else its type."""
    lines = str(e).splitlines()
    return lines[0] if lines and lines[0] else type(e).__name__


@dataclass(frozen=True)
class Aggregated:
    """A container's logs in the aggregated files of one node."""

    node: NodeLogs
    files: dict[str, int]      # file name -> bytes aggregated


async def aggregated_containers(store: RemoteLogDir, app_id: str) -> tuple[dict[str, Aggregated], list[str]]:
    """(container id -> its aggregated logs, warnings: the files refused as cut short or corrupt).
    A store that cannot be read at all (down, no credentials) gives no logs and a warning saying
    why, so the caller still shows the running nodes' logs."""
    try:
        nodes = await asyncio.to_thread(aggregated_logs.app_node_logs, store, app_id)
    except Exception as e:  # noqa: BLE001  # any: an fsspec store raises its own types, s3fs botocore's
        # (EndpointConnectionError, NoCredentialsError), which are not OSError.
        return {}, [f"cannot read the aggregated logs at {store.url} ({type(e).__name__}: {_one_line(e)}); "
                    "showing the logs on the running nodes only"]
    found: dict[str, Aggregated] = {}
    errors: list[str] = []
    for node in nodes:
        errors += node.errors
        for cid, files in node.containers().items():
            # A container is on one node; a final file beats rolls should both claim it.
            if cid not in found or node.final:
                found[cid] = Aggregated(node, files)
    return found, errors


async def read_aggregated(store: RemoteLogDir, app_id: str, agg: Aggregated, container_id: str, file: str) -> str:
    try:
        data = await asyncio.to_thread(aggregated_logs.read_log, store, app_id, agg.node, container_id, file)
    except (AggregatedLogError, OSError) as e:
        raise CliError(str(e)) from None
    except Exception as e:  # noqa: BLE001  # a store's own types (s3fs lets botocore's through), as above
        raise CliError(f"cannot read {container_id}'s {file} from {store.url} "
                       f"({type(e).__name__}: {_one_line(e)})") from None
    return data.decode("utf-8", errors="replace")
