"""`python -m rm`: run the ResourceManager daemon (flags as in docs/internals.md)."""
from __future__ import annotations

import argparse
import fcntl
import gc
import json
import math
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit

from protocol import config as config_mod, storage_settings
from protocol.app_timeouts import MAX_LIFETIME_S
from protocol.daemon import run_daemon, setup_logging
from protocol.durable_storage import DurableStorageError, check_reachable, write_atomic
from protocol.ha_config import load_ha, resolve_rm_id

from . import policies

# The young generation is collected every GC_YOUNG_THRESHOLD net allocations instead of CPython's
# 700. Under load hundreds of requests are in flight, and a young collection finds their objects
# alive and promotes them; at 700 that was a collection every ~140 NM heartbeats, plus the full
# collections the promotions bring on, which walk every node, app and container record: ~10 us of
# CPU per heartbeat with 5000 NMs. A heartbeat's garbage holds no cycles (reference counting frees
# it), so collecting less often keeps little more memory.
GC_YOUNG_THRESHOLD = 10_000


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m rm", description="Elastane ResourceManager")
    p.add_argument("--config", help="rm.toml (default: conf/rm.toml)")
    p.add_argument("--cluster-config", help="cluster.toml (default: conf/cluster.toml)")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--state-dir")
    p.add_argument("--nm-expiry-s", type=float)
    p.add_argument("--am-expiry-s", type=float)
    p.add_argument("--nm-heartbeat-interval-ms", type=int,
                   help="the NMs' heartbeat period, which every answer to an NM carries (rm.toml's nm_heartbeat_interval_ms)")
    p.add_argument("--policy")
    p.add_argument("--ready-file")
    p.add_argument("--rm-id", help="this RM's id among cluster.toml's [ha] rm_ids (HA clusters; "
                                   "else $ELASTANE_RM_ID or rm.toml's [ha] rm_id)")
    return p.parse_args(argv)


def load_configs(args: argparse.Namespace) -> tuple[config_mod.RMConfig, config_mod.ClusterConfig]:
    """Config files plus flag overrides; ConfigError on anything invalid."""
    if args.config and not Path(args.config).exists():
        raise config_mod.ConfigError(f"--config: {args.config} does not exist")
    cfg = config_mod.merge(config_mod.load_rm(args.config), host=args.host, port=args.port,
                           state_dir=args.state_dir, nm_expiry_s=args.nm_expiry_s,
                           am_expiry_s=args.am_expiry_s, policy=args.policy,
                           nm_heartbeat_interval_ms=args.nm_heartbeat_interval_ms)
    if not (0 <= cfg.port <= 65535):
        raise config_mod.ConfigError(f"port must be within 0..65535, got {cfg.port}")
    for name in ("nm_expiry_s", "am_expiry_s", "container_token_lifetime_s"):
        if not (getattr(cfg, name) > 0 and math.isfinite(getattr(cfg, name))):      # (NaN too)
            raise config_mod.ConfigError(f"{name} must be a positive number of seconds, got {getattr(cfg, name)}")
    for name in ("max_app_attempts", "maximum_allocation_vcores", "nm_heartbeat_interval_ms"):
        if getattr(cfg, name) < 1:
            raise config_mod.ConfigError(f"{name} must be >= 1, got {getattr(cfg, name)}")
    if cfg.policy not in policies.known():
        raise config_mod.ConfigError(f"policy: unknown policy {cfg.policy!r}; known: {', '.join(policies.known())}")
    if cfg.minimum_allocation_mb <= 0 or cfg.maximum_allocation_mb < cfg.minimum_allocation_mb:
        raise config_mod.ConfigError("need 0 < minimum_allocation_mb <= maximum_allocation_mb")
    if not (0 < cfg.max_am_resource_percent <= 1):
        raise config_mod.ConfigError(f"max_am_resource_percent must be a fraction in (0, 1], "
                                     f"got {cfg.max_am_resource_percent}")
    for name in ("dorm_fairness_threshold", "dorm_adjustment_threshold"):
        if not (0 <= getattr(cfg, name) <= 1):
            raise config_mod.ConfigError(f"{name} must be a fraction in [0, 1], got {getattr(cfg, name)}")
    names = [q.name for q in cfg.queues]
    if not names or len(set(names)) != len(names):
        raise config_mod.ConfigError(f"queues: need at least one queue and unique names, got {names}")
    for q in cfg.queues:
        if not (0 < q.capacity <= q.max_capacity <= 100):
            raise config_mod.ConfigError(f"queue {q.name!r}: need 0 < capacity <= max_capacity <= 100")
        if q.max_am_resource_percent is not None and not (0 < q.max_am_resource_percent <= 1):
            raise config_mod.ConfigError(f"queue {q.name!r}: max_am_resource_percent must be a fraction in (0, 1], "
                                         f"got {q.max_am_resource_percent}")
        for name in ("default_app_lifetime_s", "max_app_lifetime_s"):
            if getattr(q, name) > MAX_LIFETIME_S:
                raise config_mod.ConfigError(f"queue {q.name!r}: {name} must be at most {MAX_LIFETIME_S} "
                                             f"(100 years; <= 0: none), got {getattr(q, name)}")
        if 0 < q.max_app_lifetime_s < q.default_app_lifetime_s:
            raise config_mod.ConfigError(f"queue {q.name!r}: default_app_lifetime_s {q.default_app_lifetime_s} "
                                         f"exceeds max_app_lifetime_s {q.max_app_lifetime_s}")
    if sum(q.capacity for q in cfg.queues) > 100.0 + 1e-9:
        raise config_mod.ConfigError(f"queues: capacities add up to {sum(q.capacity for q in cfg.queues)} > 100")
    cluster_path = args.cluster_config or str(config_mod.CONF_DIR / "cluster.toml")
    if args.cluster_config and not Path(args.cluster_config).exists():
        raise config_mod.ConfigError(f"--cluster-config: {args.cluster_config} does not exist")
    cluster = config_mod.load_cluster(cluster_path)
    # [storage]: the object store's settings, for the RM's own checks and reads (init_from, URLs
    # at submission) -- exported before checkpoint_dir is probed with them
    storage_settings.apply(config_mod.load_storage(cluster_path))
    if cfg.checkpoint_dir:
        try:    # an object store's bucket must exist and let these credentials in (one request)
            check_reachable(cfg.checkpoint_dir)
        except DurableStorageError as e:
            raise config_mod.ConfigError(f"checkpoint_dir: {e}") from None
    if not cluster.secret:
        secret = config_mod.ensure_secret(cluster_path)
        cluster = config_mod.merge(cluster, secret=secret)
    return cfg, cluster


def write_ready_file(path: str, info: dict[str, Any]) -> None:
    """Atomically write the ready file (atomic, not durable: it describes this process only)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(p, json.dumps(info).encode(), durable=False)


def ready_info(url: str) -> dict[str, Any]:
    """The ready file's JSON: the address clients, NMs and AMs use for this RM (the server's
    `client_url`: cluster.toml's rm_address or the advertised host), never the bind address."""
    return {"pid": os.getpid(), "http_address": urlsplit(url).netloc, "node_id": "", "url": url}


STATE_LOCK = "rm.lock"      # in state_dir: held for the RM process's life


def lock_state_dir(state_dir: str) -> int:
    """Take `<state_dir>/rm.lock` for this process (its fd, held open until exit); ConfigError when
    another RM holds it. A second RM on the same state_dir (a --foreground start beside a running
    daemon, a second `python -m rm`) recovered the first's apps -- failing their attempts and
    writing new ones into its store -- before it found its port taken."""
    Path(state_dir).mkdir(parents=True, exist_ok=True)
    path = Path(state_dir, STATE_LOCK)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise config_mod.ConfigError(f"state_dir {state_dir} is in use by another ResourceManager (pid {holder}): "
                                     "one RM per state_dir") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    setup_logging("rm")
    try:
        cfg, cluster = load_configs(args)
    except (config_mod.ConfigError, OSError) as e:
        print(f"rm: configuration error: {e}", file=sys.stderr)
        return 2
    from .server import ResourceManagerServer   # imported late: flag errors need no aiohttp start-up

    server: Any
    lock: Optional[int] = None       # <state_dir>/rm.lock, held until main returns
    try:
        try:
            ha = load_ha(args.cluster_config or str(config_mod.CONF_DIR / "cluster.toml"))
            if ha.enabled:      # one RM of an active/standby pair, elected on etcd (rm/ha/)
                from .ha.ha_server import HaResourceManager

                server = HaResourceManager(cfg, cluster, ha, resolve_rm_id(ha, args.rm_id, args.config))
            else:
                lock = lock_state_dir(cfg.state_dir)
                server = ResourceManagerServer(cfg, cluster)
        except config_mod.ConfigError as e:
            print(f"rm: configuration error: {e}", file=sys.stderr)
            return 2
        except (ValueError, OSError) as e:
            print(f"rm: cannot start: {e}", file=sys.stderr)
            return 2
        except sqlite3.Error as e:      # its state store (state.db) cannot be opened or written
            print(f"rm: cannot start: state_dir {cfg.state_dir}: {e}", file=sys.stderr)
            return 2
        return _serve(args, server)
    finally:
        if lock is not None:
            os.close(lock)


def _serve(args: argparse.Namespace, server: Any) -> int:
    """Run the RM until SIGTERM; 2 when it cannot start."""
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])

    async def start() -> None:
        url = await server.start()
        if args.ready_file:
            write_ready_file(args.ready_file, ready_info(url))

    try:
        run_daemon(start, server.stop)
    except config_mod.ConfigError as e:     # found at start: e.g. an etcd endpoint that does not answer
        print(f"rm: configuration error: {e}", file=sys.stderr)
        return 2
    except OSError as e:                    # e.g. its port taken
        print(f"rm: cannot start: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
