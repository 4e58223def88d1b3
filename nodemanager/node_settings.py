"""Resolve an NM's effective settings: capacity (declared or detected), advertised host, RM address."""
from __future__ import annotations

import ipaddress
import math
import os
import socket
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

from protocol.cgroup_cpu import cgroup_root_cores
from nodemanager.cgroup_base import MAX_CPU_PERIOD_US, MIN_CPU_PERIOD_US, MIN_CPU_QUOTA_US
from protocol import durable_storage
from protocol.config import ClusterConfig, ConfigError, NMConfig
from protocol.records import Resource

CGROUP_MODES = ("auto", "v1", "v2", "off")
CPU_MODES = ("hard", "soft")


def mem_total_mb(meminfo_text: str) -> int:
    """MemTotal from /proc/meminfo content, in MB."""
    for line in meminfo_text.splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            kb = int(parts[1])
            return kb // 1024
    raise ValueError("no MemTotal line in meminfo")


def capability(cfg: NMConfig, meminfo_path: str = "/proc/meminfo") -> Resource:
    """Declared memory / vcores, or detected: MemTotal minus reserved, and the CPU count."""
    memory = cfg.memory_mb
    if memory <= 0:
        memory = max(0, mem_total_mb(Path(meminfo_path).read_text()) - cfg.reserved_memory_mb)
    return Resource(memory, declared_vcores(cfg))


def declared_vcores(cfg: NMConfig) -> int:
    """The node's vcores: as configured, or one per CPU."""
    return cfg.vcores if cfg.vcores > 0 else (os.cpu_count() or 1)


def arbiter_cpu_pool(cfg: NMConfig, root: str = "/sys/fs/cgroup") -> int:
    """The cores of the arbiter's CPU pool: `arbiter_cpu_pool`, else the cgroup root's quota rounded
    up (0.45 of a core is one COMP's thread) capped at the CPU count, else the CPU count."""
    cpus = os.cpu_count() or 1
    if cfg.arbiter_cpu_pool > 0:
        return cfg.arbiter_cpu_pool
    cores = cgroup_root_cores(root)
    return cpus if cores is None else max(1, min(cpus, math.ceil(cores - 1e-9)))


def cores_per_vcore(cfg: NMConfig, capability: Resource) -> float:
    """What one vcore's CPU quota is worth in cores: 1, or the node's `cpu_limit_cores` shared out
    over its vcores (so 12 vcores declared on 2 cores give every vcore 1/6 of a core, and a job
    with more vcores really gets more CPU, as on hosts with a core per vcore)."""
    if cfg.cpu_limit_cores <= 0:
        return 1.0
    return cfg.cpu_limit_cores / max(1, capability.vcores)


# Binding one of these serves on every interface: the node id needs an address that routes to the RM.
WILDCARD_HOSTS = ("0.0.0.0", "", "::")
LOOPBACK_BINDS = ("127.0.0.1", "localhost", "::1")
# host -> its addresses (IPv4 first); (ip, port) -> the local address a packet to it leaves from.
Resolve = Callable[[str], list[str]]
RouteSource = Callable[[str, int], str]


def resolve_addresses(host: str) -> list[str]:
    """Every address `host` resolves to here, IPv4 first (an NM bound to 0.0.0.0 serves only those)."""
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM)
    addrs = list(dict.fromkeys(str(info[4][0]) for info in infos))
    return sorted(addrs, key=lambda a: ":" in a)


def route_source(ip: str, port: int) -> str:
    """The local address this host sends from to reach `ip`: the kernel's route choice, read from a
    connected UDP socket (connect on UDP only picks the route; no packet is sent)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((ip, port))
        return str(s.getsockname()[0])


def _addresses(host: str, resolve: Resolve) -> list[str]:
    """An address literal as itself (no lookup), a name through `resolve`."""
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        return resolve(host)


def is_loopback(host: str, resolve: Resolve = resolve_addresses) -> bool:
    """127.0.0.0/8, ::1, localhost, or a name whose every address here is one of those (a hostname
    that /etc/hosts maps to 127.0.1.1). A name that does not resolve here is not called loopback."""
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        addrs = _addresses(host, resolve)
    except OSError:
        return False
    return bool(addrs) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs)


def _rm_endpoint(rm_url: str) -> tuple[str, int]:
    parts = urlsplit(rm_url)
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(f"rm_address {rm_url!r} has a bad port") from None
    if not parts.hostname:
        raise ConfigError(f"rm_address {rm_url!r} names no host")
    return parts.hostname, port or (443 if parts.scheme == "https" else 80)


def advertise_host(cfg: NMConfig, rm_url: str, resolve: Resolve = resolve_addresses,
                   route: RouteSource = route_source) -> str:
    """The host part of the node id (and NM_HOST, and the URL the RM and AMs use): `advertise_host`
    if set; 127.0.0.1 for a loopback bind; the bound address for a specific one; for a wildcard
    bind, the address of the interface that routes to the RM, or 127.0.0.1 when the RM is on
    loopback (single-host clusters)."""
    if cfg.advertise_host:
        return cfg.advertise_host
    if cfg.host in LOOPBACK_BINDS:
        return "127.0.0.1"
    if cfg.host not in WILDCARD_HOSTS:
        return cfg.host
    rm_host, rm_port = _rm_endpoint(rm_url)
    hint = "set advertise_host (nm.toml, nm-<host>.toml or --advertise-host) to this host's address"
    try:
        addrs = _addresses(rm_host, resolve)
    except OSError as e:
        raise ConfigError(f"cannot choose an address to advertise: the RM host {rm_host!r} (rm_address "
                          f"{rm_url}) does not resolve ({e}); {hint}") from None
    if cfg.host != "::":
        addrs = [a for a in addrs if ":" not in a]   # 0.0.0.0 serves IPv4 only
    if not addrs:
        raise ConfigError(f"cannot choose an address to advertise: the RM host {rm_host!r} (rm_address "
                          f"{rm_url}) has no address this NM's bind ({cfg.host!r}) can serve; {hint}")
    if ipaddress.ip_address(addrs[0].split("%")[0]).is_loopback:
        return "127.0.0.1"
    try:
        return route(addrs[0], rm_port)
    except OSError as e:
        raise ConfigError(f"cannot choose an address to advertise: no route to the RM at {rm_url} "
                          f"({addrs[0]}: {e}); {hint}") from None


def rm_address(cfg: NMConfig, cluster: ClusterConfig) -> str:
    addr = cfg.rm_address or cluster.rm_address
    if not addr.startswith(("http://", "https://")):
        addr = "http://" + addr
    return addr.rstrip("/")


def validate(cfg: NMConfig, cluster: ClusterConfig, resolve: Resolve = resolve_addresses,
             route: RouteSource = route_source) -> None:
    """Reject settings the NM cannot run with; the message names the setting."""
    if cfg.cgroups not in CGROUP_MODES:
        raise ConfigError(f"cgroups must be one of {', '.join(CGROUP_MODES)}, got {cfg.cgroups!r}")
    if cfg.cpu_enforcement not in CPU_MODES:
        raise ConfigError(f"cpu_enforcement must be one of {', '.join(CPU_MODES)}, got {cfg.cpu_enforcement!r}")
    if not 0 <= cfg.port <= 65535:
        raise ConfigError(f"port must be 0..65535, got {cfg.port}")
    # Checks are written `not (in range)`: a NaN compares False to everything, so `x < 0` lets it through.
    for name in ("memory_mb", "vcores", "reserved_memory_mb", "container_shells", "warm_spares",
                 "localizer_cache_mb"):
        if not getattr(cfg, name) >= 0:
            raise ConfigError(f"{name} must be >= 0, got {getattr(cfg, name)}")
    for name in ("heartbeat_interval_ms", "monitor_interval_ms", "cpu_period_us", "localizer_threads"):
        if not getattr(cfg, name) > 0:
            raise ConfigError(f"{name} must be > 0, got {getattr(cfg, name)}")
    if not 0 < cfg.localizer_fetch_timeout_s < math.inf:      # NaN fails too (every fetch timed out at once)
        raise ConfigError(f"localizer_fetch_timeout_s must be a number of seconds > 0, got {cfg.localizer_fetch_timeout_s}")
    if cfg.arbiter_cpu_pool < 0:
        raise ConfigError(f"arbiter_cpu_pool must be >= 0 (0 = the cgroup root's cores), got {cfg.arbiter_cpu_pool}")
    if not 0 <= cfg.cpu_limit_cores < math.inf:     # NaN fails too (every hard-mode launch raised)
        raise ConfigError(f"cpu_limit_cores must be a number >= 0 (0 = a vcore is one core), got {cfg.cpu_limit_cores}")
    if cfg.cpu_limit_cores > (os.cpu_count() or 1):
        raise ConfigError(f"cpu_limit_cores {cfg.cpu_limit_cores} is more than this host's {os.cpu_count()} cores")
    if not MIN_CPU_PERIOD_US <= cfg.cpu_period_us <= MAX_CPU_PERIOD_US:
        raise ConfigError(f"cpu_period_us must be {MIN_CPU_PERIOD_US}..{MAX_CPU_PERIOD_US}, got {cfg.cpu_period_us}")
    if cfg.cpu_limit_cores > 0:
        # A one-vcore container's quota below the kernel's 1 ms would be raised to it
        # (cgroup_base.cpu_quota_us): its cap silently looser than cpu_limit_cores shares out.
        vcores = declared_vcores(cfg)
        vcore_quota = cores_per_vcore(cfg, Resource(0, vcores)) * cfg.cpu_period_us
        if vcore_quota < MIN_CPU_QUOTA_US:
            raise ConfigError(f"cpu_limit_cores {cfg.cpu_limit_cores:g} over {vcores} vcores gives a vcore "
                              f"{vcore_quota:.0f} us per cpu_period_us {cfg.cpu_period_us}, below the kernel's "
                              f"{MIN_CPU_QUOTA_US} us minimum quota: raise cpu_period_us")
    if cfg.network_bandwidth_bps < 0:
        raise ConfigError(f"network_bandwidth_bps must be >= 0 (0 = no cap), got {cfg.network_bandwidth_bps}")
    check_log_aggregation(cfg, cluster)
    check_health(cfg)
    if not cluster.secret:
        raise ConfigError("cluster secret is empty: run `elastane secret` or set [cluster] secret")
    check_advertised(cfg, rm_address(cfg, cluster), resolve, route)


# A roll more often than this re-lists every running app's logs more than once a second.
MIN_LOG_ROLL_INTERVAL_S = 1.0


def check_log_aggregation(cfg: NMConfig, cluster: ClusterConfig) -> None:
    """keep_finished_logs_s, log_roll_interval_s and cluster.toml's remote_app_log_dir."""
    keep = cfg.keep_finished_logs_s
    if not (0 <= keep < math.inf):          # NaN fails too
        raise ConfigError(f"keep_finished_logs_s must be a number of seconds >= 0, got {keep}")
    roll = cfg.log_roll_interval_s
    if not (roll == 0 or MIN_LOG_ROLL_INTERVAL_S <= roll < math.inf):
        raise ConfigError(f"log_roll_interval_s must be 0 (no rolling uploads) or >= {MIN_LOG_ROLL_INTERVAL_S:g} "
                          f"seconds, got {roll}")
    if roll and not cluster.remote_app_log_dir:
        raise ConfigError(f"log_roll_interval_s = {roll:g} uploads running apps' logs, but cluster.toml's "
                          "remote_app_log_dir is empty (log aggregation is off): set both, or neither")
    if cluster.remote_app_log_dir:
        try:
            durable_storage.validate(cluster.remote_app_log_dir)
        except durable_storage.DurableStorageError as e:
            raise ConfigError(f"remote_app_log_dir: {e}") from None


def check_health(cfg: NMConfig) -> None:
    """The node health checks' settings (nodemanager/node_health.py)."""
    if not 0 < cfg.max_disk_utilization_percent <= 100:          # NaN fails too
        raise ConfigError(f"max_disk_utilization_percent must be within (0, 100], got {cfg.max_disk_utilization_percent}")
    if cfg.min_free_disk_mb < 0:
        raise ConfigError(f"min_free_disk_mb must be >= 0, got {cfg.min_free_disk_mb}")
    for key in ("health_check_interval_s", "health_script_timeout_s"):
        v = getattr(cfg, key)
        if not 0 < v < math.inf:
            raise ConfigError(f"{key} must be a number of seconds > 0, got {v}")
    script = cfg.health_script
    if script and not (os.path.isabs(script) and os.path.isfile(script) and os.access(script, os.X_OK)):
        raise ConfigError(f"health_script: {script!r} is not an executable file given by its absolute path")


def check_advertised(cfg: NMConfig, rm_url: str, resolve: Resolve = resolve_addresses,
                     route: RouteSource = route_source) -> None:
    """A loopback node address only works when the RM is on loopback too: on another host the RM
    (and every AM) would connect to itself."""
    host = advertise_host(cfg, rm_url, resolve, route)
    if not is_loopback(host, resolve) or is_loopback(_rm_endpoint(rm_url)[0], resolve):
        return
    source = "advertise_host" if cfg.advertise_host else f"advertise_host (from host = {cfg.host!r})"
    raise ConfigError(f"{source} = {host!r} is a loopback address but the RM at {rm_url} is on another "
                      "host: set advertise_host (nm.toml, nm-<host>.toml or --advertise-host) to this "
                      "host's address")
