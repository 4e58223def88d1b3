"""`python -m nodemanager`: parse flags, load config, run the NodeManager until SIGTERM."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from protocol.ha_config import load_ha
from protocol import config as pconfig, storage_settings
from protocol.daemon import run_daemon, setup_logging

from . import node_settings
from .node_manager import NodeManager


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m nodemanager", description="Elastane NodeManager")
    p.add_argument("--config", help="nm.toml (default conf/nm.toml); nm-<hostname>.toml beside it, if there, "
                                    "overrides its [nm] keys on this host ($ELASTANE_HOSTNAME, else the hostname)")
    p.add_argument("--cluster-config", help="cluster.toml (default conf/cluster.toml)")
    p.add_argument("--rm-address", help="RM URL, e.g. http://127.0.0.1:8088")
    p.add_argument("--host", help="address to bind")
    p.add_argument("--advertise-host",
                   help="this node's address for the RM, AMs and containers (default: the bound address, or "
                        "for 0.0.0.0 the address of the interface that routes to the RM)")
    p.add_argument("--port", type=int, help="HTTP port (0 = ephemeral)")
    p.add_argument("--memory-mb", type=int, help="memory offered to containers (0 = detect)")
    p.add_argument("--vcores", type=int, help="vcores offered to containers (0 = detect)")
    p.add_argument("--local-dir", help="container working dirs")
    p.add_argument("--log-dir", help="container logs")
    p.add_argument("--recovery-dir", help="records of running containers, for NM restart")
    p.add_argument("--cgroups", choices=node_settings.CGROUP_MODES, help="cgroup enforcement")
    p.add_argument("--cpu-limit-cores", type=float,
                   help="cores the node's containers get in all, shared by vcore (0 = a vcore is a core)")
    p.add_argument("--heartbeat-interval-ms", type=int, help="heartbeat period")
    p.add_argument("--container-shells", type=int,
                   help="shells kept started inside cgroups of their own for fast launches (0 = none)")
    p.add_argument("--ready-file", help="JSON written once serving and registered")
    return p.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    setup_logging("nodemanager")
    try:
        # As the RM: a file named on the command line must be there -- a misspelt path ran the NM
        # on defaults (detected memory, /tmp dirs), or failed later naming the wrong cause.
        for flag, path in (("--config", args.config), ("--cluster-config", args.cluster_config)):
            if path and not Path(path).exists():
                raise pconfig.ConfigError(f"{flag}: {path} does not exist")
        cfg = pconfig.merge(pconfig.load_nm(args.config), rm_address=args.rm_address, host=args.host,
                            advertise_host=args.advertise_host,
                            port=args.port, memory_mb=args.memory_mb, vcores=args.vcores,
                            local_dir=args.local_dir, log_dir=args.log_dir, recovery_dir=args.recovery_dir,
                            cgroups=args.cgroups, heartbeat_interval_ms=args.heartbeat_interval_ms,
                            cpu_limit_cores=args.cpu_limit_cores, container_shells=args.container_shells)
        cluster = pconfig.load_cluster(args.cluster_config)
        # [storage]: the object store's settings, for this NM's localizer and every container's env
        storage_settings.apply(pconfig.load_storage(args.cluster_config))
        node_settings.validate(cfg, cluster)
        nm = NodeManager(cfg, cluster, ready_file=args.ready_file, ha=load_ha(args.cluster_config))
        nm.bind()
    except (pconfig.ConfigError, OSError, ValueError) as e:
        print(f"nodemanager: {e}", file=sys.stderr)
        return 2
    run_daemon(nm.start, nm.stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
