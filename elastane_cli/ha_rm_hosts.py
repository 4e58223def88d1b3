"""The ResourceManagers bin/start-cluster starts and bin/stop-cluster stops: one `ID HOST PORT` line
per RM that cluster.toml's [ha] lists (HOST and PORT: those of its listed address, where it must
run and serve), nothing when HA is off (the cluster's one RM runs where start-cluster runs).

    python -m elastane_cli.ha_rm_hosts [--conf CLUSTER_TOML] [--stop-order]

`--stop-order` lists the active RM last (asking each RM's /ws/v1/cluster/info), so that stopping
them in that order never hands the leader key to an RM that is about to be stopped itself: a
standby stopped first does not campaign, and the active stopped last finds nobody to take over.
Bad [ha] settings (no etcd endpoint, an id listed twice, ...) exit 2 with the message of
protocol/ha_config.py, which names the setting, and start nothing.
"""
from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional, Sequence
from urllib.parse import urlsplit

from protocol import config
from protocol.ha_config import HAConfig, load_ha

PROBE_TIMEOUT_S = 3.0    # per RM; a dead or unreachable one is treated as not active


def rm_hosts(ha: HAConfig) -> list[tuple[str, str, int]]:
    """(id, host, port) of every listed RM, in rm_ids order; [] when HA is off."""
    if not ha.enabled:
        return []
    out = []
    for rm_id in ha.rm_ids:
        u = urlsplit(ha.address_of(rm_id))
        out.append((rm_id, u.hostname or "", u.port or (443 if u.scheme == "https" else 80)))
    return out


def ha_state(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """The RM's haState (ACTIVE / STANDBY), "" when it does not answer."""
    try:
        with urllib.request.urlopen(f"{url}/ws/v1/cluster/info?user.name=elastane", timeout=timeout_s) as r:
            body = json.loads(r.read() or b"{}")
    except (urllib.error.URLError, OSError, ValueError):
        return ""
    info = body.get("clusterInfo") if isinstance(body, dict) else None
    return str(info.get("haState", "")) if isinstance(info, dict) else ""


def stop_order(ha: HAConfig) -> list[tuple[tuple[str, str, int], str]]:
    """`rm_hosts` with the active RM(s) moved to the end (the others keep their order), each with
    the haState it answered ("" for none)."""
    pairs = rm_hosts(ha)
    with ThreadPoolExecutor(max(1, len(pairs))) as pool:
        states = list(pool.map(lambda p: ha_state(ha.address_of(p[0])), pairs))
    both = list(zip(pairs, states))
    return [x for x in both if x[1] != "ACTIVE"] + [x for x in both if x[1] == "ACTIVE"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="ha_rm_hosts", description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--conf", type=Path, default=config.CONF_DIR / "cluster.toml", help="cluster.toml")
    p.add_argument("--stop-order", action="store_true", help="the active RM last")
    args = p.parse_args(argv)
    try:
        ha = load_ha(args.conf)
    except config.ConfigError as e:
        print(f"configuration error: {e}", file=sys.stderr)
        return 2
    # HAConfig has checked that every address is an http(s)://host:port URL, so each has a host.
    if not args.stop_order:
        for rm_id, host, port in rm_hosts(ha):
            print(rm_id, host, port)
        return 0
    order = stop_order(ha)
    if order:   # what the order rests on, for the operator (stdout is the list the script reads)
        print("stop order: " + ", ".join(f"{rm_id} ({state or 'not answering'})" for (rm_id, _, _), state in order),
              file=sys.stderr)
    for (rm_id, host, port), _ in order:
        print(rm_id, host, port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
