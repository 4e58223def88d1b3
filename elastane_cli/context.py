"""What every command gets: the RM URL, the user, the cluster dir and the output streams."""
from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

DEFAULT_RM_URL = "http://127.0.0.1:8088"


@dataclass
class CliContext:
    """Resolved global options of one `elastane` invocation."""

    rm_url: str
    user: str
    cluster_dir: Path
    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)


def default_cluster_dir() -> Path:
    """$ELASTANE_CLUSTER_DIR, else ~/.elastane/cluster."""
    env = os.environ.get("ELASTANE_CLUSTER_DIR")
    return Path(env).expanduser() if env else Path.home() / ".elastane" / "cluster"


def default_user() -> str:
    return os.environ.get("USER") or getpass.getuser()


def resolve_rm_url(flag: str | None, cluster_dir: Path) -> str:
    """--rm, else $ELASTANE_RM, else the rm_url of the local cluster's cluster.json, else :8088."""
    if flag:
        return flag.rstrip("/")
    if os.environ.get("ELASTANE_RM"):
        return os.environ["ELASTANE_RM"].rstrip("/")
    try:
        url = json.loads((cluster_dir / "cluster.json").read_text()).get("rm_url")
        if url:
            return str(url).rstrip("/")
    except (OSError, ValueError, AttributeError):
        pass
    return DEFAULT_RM_URL


def _url(v: str) -> str:
    """One RM URL, or an HA cluster's RMs separated by commas (tried in turn)."""
    for u in v.split(","):
        if not u.startswith(("http://", "https://")) or len(u.split("://", 1)[1]) == 0:
            raise argparse.ArgumentTypeError(f"--rm expects a URL like http://host:8088 (or several, "
                                             f"comma-separated), got {v!r}")
    return v


def global_options(parser: argparse.ArgumentParser, with_user: bool = True,
                   suppress: bool = False) -> None:
    """Add --rm / --user; leaf parsers use suppress=True so a value given before the command stays."""
    kw = {"default": argparse.SUPPRESS} if suppress else {"default": None}
    parser.add_argument("--rm", type=_url, metavar="URL",
                        help="RM URL, or an HA cluster's RM URLs comma-separated (default: $ELASTANE_RM, the local "
                             "cluster's, or http://127.0.0.1:8088)",
                        **kw)
    if with_user:
        parser.add_argument("--user", metavar="NAME", help="act as this user (default: $USER)", **kw)


def common_parent(with_user: bool = True) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    global_options(p, with_user=with_user, suppress=True)
    return p
