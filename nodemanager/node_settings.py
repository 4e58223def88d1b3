"""Resolve an NM's effective settings: capacity (declared or detected), advertised host, RM address."""
from __future__ import annotations

import os
import socket
from pathlib import Path

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
    vcores = cfg.vcores if cfg.vcores > 0 else (os.cpu_count() or 1)
    return Resource(memory, vcores)


def cores_per_vcore(cfg: NMConfig, capability: Resource) -> float:
    """What one vcore's CPU quota is worth in cores: 1, or the node's `cpu_limit_cores` shared out
    over its vcores (so 12 vcores declared on 2 cores give every vcore 1/6 of a core, and a job
    with more vcores really gets more CPU, as on hosts with a core per vcore)."""
    if cfg.cpu_limit_cores <= 0:
        return 1.0
    return cfg.cpu_limit_cores / max(1, capability.vcores)


def advertise_host(cfg: NMConfig) -> str:
    """The host part of the node id: configured, 127.0.0.1 for local binds, else the hostname."""
    if cfg.advertise_host:
        return cfg.advertise_host
    if cfg.host in ("0.0.0.0", "127.0.0.1", "localhost", "", "::", "::1"):
        return "127.0.0.1"
    if cfg.host:
        return cfg.host
    return socket.gethostname()


def rm_address(cfg: NMConfig, cluster: ClusterConfig) -> str:
    addr = cfg.rm_address or cluster.rm_address
    if not addr.startswith(("http://", "https://")):
        addr = "http://" + addr
    return addr.rstrip("/")


def validate(cfg: NMConfig, cluster: ClusterConfig) -> None:
    """Reject settings the NM cannot run with; the message names the setting."""
    if cfg.cgroups not in CGROUP_MODES:
        raise ConfigError(f"cgroups must be one of {', '.join(CGROUP_MODES)}, got {cfg.cgroups!r}")
    if cfg.cpu_enforcement not in CPU_MODES:
        raise ConfigError(f"cpu_enforcement must be one of {', '.join(CPU_MODES)}, got {cfg.cpu_enforcement!r}")
    if not 0 <= cfg.port <= 65535:
        raise ConfigError(f"port must be 0..65535, got {cfg.port}")
    for name in ("memory_mb", "vcores", "reserved_memory_mb", "container_shells"):
        if getattr(cfg, name) < 0:
            raise ConfigError(f"{name} must be >= 0, got {getattr(cfg, name)}")
    for name in ("heartbeat_interval_ms", "monitor_interval_ms", "cpu_period_us"):
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"{name} must be > 0, got {getattr(cfg, name)}")
    if cfg.cpu_limit_cores < 0:
        raise ConfigError(f"cpu_limit_cores must be >= 0 (0 = a vcore is one core), got {cfg.cpu_limit_cores}")
    if cfg.cpu_limit_cores > (os.cpu_count() or 1):
        raise ConfigError(f"cpu_limit_cores {cfg.cpu_limit_cores} is more than this host's {os.cpu_count()} cores")
    if not 1000 <= cfg.cpu_period_us <= 1000000:
        raise ConfigError(f"cpu_period_us must be 1000..1000000, got {cfg.cpu_period_us}")
    if cfg.network_bandwidth_bps < 0:
        raise ConfigError(f"network_bandwidth_bps must be >= 0 (0 = no cap), got {cfg.network_bandwidth_bps}")
    if cfg.keep_finished_logs_s < 0:
        raise ConfigError(f"keep_finished_logs_s must be >= 0, got {cfg.keep_finished_logs_s}")
    if not cluster.secret:
        raise ConfigError("cluster secret is empty: run `elastane secret` or set [cluster] secret")
