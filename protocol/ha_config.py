"""cluster.toml's `[ha]` table: the ResourceManagers of a highly available cluster and their etcd.

YARN lists its RMs in `yarn.resourcemanager.ha.rm-ids` with one address per id
(`yarn.resourcemanager.webapp.address.<id>`) and names each host's own id in
`yarn.resourcemanager.ha.id`; Elastane's are `rm_ids`, `rm_addresses` and the RM's `--rm-id`
(or rm.toml's `[ha] rm_id`, or `$ELASTANE_RM_ID`). Every process reads the same table: the RMs to
elect one active among themselves (rm/ha/), and the NMs, AMs and clients to find the active one.
It lives in protocol/ because all of them must agree on it.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional
from urllib.parse import urlsplit

import msgspec

from .config import CLUSTER_TABLES, CONF_DIR, RM_TABLES, ConfigError, load

# The documented default lease (docs/operating.md, "ResourceManager high availability"): the active
# renews it every third of it, so it survives two lost renewals in a row; a standby takes over at
# most this long (plus one poll) after the active's host dies.
DEFAULT_LEASE_S = 5.0
MIN_LEASE_S = 2       # etcd grants leases in whole seconds, at least its minimum TTL
RM_ID_ENV = "ELASTANE_RM_ID"
# Seconds a client gives one RM to open a connection before moving to the next (YARN's
# ipc.client.connect.timeout plays this part, at 20 s). An RM on a LAN accepts in milliseconds, and
# one that is up but busy still accepts in the kernel whatever its event loop is doing, so only a
# host that went silent (it drops the SYNs) takes this long.
FAILOVER_CONNECT_TIMEOUT_S = 3.0
# Seconds a client waits for an RM's answer to go on arriving before it moves to the next: a
# connection kept alive to a host that then went silent is not reopened, so the connect timeout
# never fires. Twice the NMs' and AMs' 5 s per-call timeout, which a 10-minute soak on a saturated
# machine never ran out (docs/operating.md); RM calls answer in milliseconds.
FAILOVER_READ_TIMEOUT_S = 10.0
# The active RM compacts etcd's history this often (rm/ha/compaction.py), as Kubernetes' API
# server does (--etcd-compaction-interval, 5 minutes).
COMPACTION_INTERVAL_S = 300.0


class HAConfig(msgspec.Struct, forbid_unknown_fields=True):
    """cluster.toml's [ha]. `enabled = false` (the default): one RM, SQLite state store, no etcd."""

    enabled: bool = False
    rm_ids: list[str] = []                     # YARN's yarn.resourcemanager.ha.rm-ids
    rm_addresses: dict[str, str] = {}          # id -> the URL every process reaches that RM at
    etcd_endpoints: list[str] = []             # http://host:port of each etcd member
    # Seconds of the active's etcd lease: how long an active whose host died (or that lost etcd)
    # holds on, and so about how long a failover takes. Whole seconds, >= MIN_LEASE_S.
    lease_s: float = DEFAULT_LEASE_S
    etcd_prefix: str = "/elastane"             # every key the RMs write lies under it
    # Clients' failover (YARN's yarn.client.failover-max-attempts / -sleep-base-ms): how many times
    # a call goes round the listed RMs before it fails, and the pause between two rounds.
    failover_max_attempts: int = 15
    failover_sleep_s: float = 0.5
    failover_connect_timeout_s: float = FAILOVER_CONNECT_TIMEOUT_S
    failover_read_timeout_s: float = FAILOVER_READ_TIMEOUT_S
    # The active RM compacts etcd's history every this many seconds, keeping the last interval's
    # (rm/ha/compaction.py); 0: never (etcd compacts itself, --auto-compaction-retention).
    compaction_interval_s: float = COMPACTION_INTERVAL_S

    def __post_init__(self) -> None:
        if not self.enabled:
            return
        if not self.rm_ids:
            raise ValueError("rm_ids: list the ResourceManagers' ids (e.g. [\"rm1\", \"rm2\"])")
        seen: set[str] = set()
        for rm_id in self.rm_ids:
            if not rm_id or not rm_id.replace("-", "").replace("_", "").isalnum():
                raise ValueError(f"rm_ids: {rm_id!r} is not a valid RM id (letters, digits, - and _)")
            if rm_id in seen:
                raise ValueError(f"rm_ids: {rm_id!r} is listed twice (two RMs with the same id)")
            seen.add(rm_id)
        for rm_id in self.rm_ids:
            if rm_id not in self.rm_addresses:
                raise ValueError(f"rm_addresses.{rm_id}: no address for RM {rm_id!r}, which rm_ids lists")
            _check_http_url(f"rm_addresses.{rm_id}", self.rm_addresses[rm_id])
        for rm_id in self.rm_addresses:
            if rm_id not in seen:
                raise ValueError(f"rm_addresses.{rm_id}: RM {rm_id!r} is not listed in rm_ids {self.rm_ids}")
        addresses = [normalized_url(a) for a in self.rm_addresses.values()]
        if len(set(addresses)) != len(addresses):
            raise ValueError(f"rm_addresses: two RMs share an address ({self.rm_addresses})")
        if not self.etcd_endpoints:
            raise ValueError("etcd_endpoints: list the etcd members' client URLs (http://host:2379)")
        for url in self.etcd_endpoints:
            _check_http_url("etcd_endpoints", url, https=False)
        if not (self.lease_s >= MIN_LEASE_S and float(self.lease_s).is_integer()):
            raise ValueError(f"lease_s must be a whole number of seconds >= {MIN_LEASE_S}, got {self.lease_s}")
        if not self.etcd_prefix.startswith("/") or self.etcd_prefix.endswith("/") or len(self.etcd_prefix) < 2:
            raise ValueError(f"etcd_prefix must start with / and not end with one, got {self.etcd_prefix!r}")
        if self.failover_max_attempts < 1:
            raise ValueError(f"failover_max_attempts must be >= 1, got {self.failover_max_attempts}")
        if not self.failover_sleep_s >= 0:
            raise ValueError(f"failover_sleep_s must be >= 0 (seconds), got {self.failover_sleep_s}")
        if not self.failover_connect_timeout_s > 0:
            raise ValueError(f"failover_connect_timeout_s must be > 0 (seconds), got {self.failover_connect_timeout_s}")
        if not self.failover_read_timeout_s > 0:
            raise ValueError(f"failover_read_timeout_s must be > 0 (seconds), got {self.failover_read_timeout_s}")
        if not self.compaction_interval_s >= 0:
            raise ValueError(f"compaction_interval_s must be >= 0 (seconds; 0: never), got {self.compaction_interval_s}")

    def address_of(self, rm_id: str) -> str:
        return normalized_url(self.rm_addresses[rm_id])

    def addresses(self) -> list[str]:
        """Every RM's URL, in rm_ids order (the order clients try them in)."""
        return [self.address_of(i) for i in self.rm_ids]

    def etcd_targets(self) -> list[tuple[str, int]]:
        """(host, port) of each etcd member."""
        out = []
        for url in self.etcd_endpoints:
            u = urlsplit(url)
            out.append((u.hostname or "", u.port or 2379))
        return out


NO_HA = HAConfig()      # HA off: one RM (a default argument; never modified)


def _check_http_url(setting: str, url: str, https: bool = True) -> None:
    schemes = ("http", "https") if https else ("http",)
    u = urlsplit(url if "://" in url else "http://" + url)
    try:
        port = u.port
    except ValueError:
        raise ValueError(f"{setting}: {url!r} has an invalid port") from None
    if u.scheme not in schemes or not u.hostname or (u.path not in ("", "/")):
        want = " or ".join(f"{s}://host:port" for s in schemes)
        raise ValueError(f"{setting}: {url!r} is not a {want} URL")
    if setting == "etcd_endpoints" and port is None:
        raise ValueError(f"{setting}: {url!r} names no port (etcd's client port is usually 2379)")


def normalized_url(url: str) -> str:
    """`http://host:port` without a trailing slash (a bare `host:port` gets http://)."""
    url = url.strip().rstrip("/")
    return url if "://" in url else "http://" + url


def load_ha(cluster_path: Optional[str | Path] = None) -> HAConfig:
    """cluster.toml's [ha] (HA off without one); ConfigError naming the setting when it is bad."""
    return load(cluster_path or CONF_DIR / "cluster.toml", HAConfig, "ha", CLUSTER_TABLES)


class RmHaSettings(msgspec.Struct, forbid_unknown_fields=True):
    """rm.toml's [ha]: this RM's own id (YARN's yarn.resourcemanager.ha.id)."""

    rm_id: str = ""


def resolve_rm_id(ha: HAConfig, flag: Optional[str], rm_toml: Optional[str | Path]) -> str:
    """This RM's id: `--rm-id`, else $ELASTANE_RM_ID, else rm.toml's [ha] rm_id. It must be one of
    cluster.toml's [ha] rm_ids; ConfigError naming the setting otherwise."""
    source, rm_id = "--rm-id", flag or ""
    if not rm_id and os.environ.get(RM_ID_ENV):
        source, rm_id = RM_ID_ENV, os.environ[RM_ID_ENV]
    if not rm_id:
        path = Path(rm_toml) if rm_toml else CONF_DIR / "rm.toml"
        source, rm_id = f"{path}: [ha] rm_id", load(path, RmHaSettings, "ha", RM_TABLES).rm_id
    if not rm_id:
        raise ConfigError(f"rm_id: [ha] is enabled in cluster.toml but this RM has no id; give --rm-id, "
                          f"${RM_ID_ENV} or rm.toml's [ha] rm_id (one of {ha.rm_ids})")
    if rm_id not in ha.rm_ids:
        raise ConfigError(f"rm_id: {rm_id!r} (from {source}) is not one of cluster.toml's [ha] rm_ids {ha.rm_ids}")
    return rm_id

