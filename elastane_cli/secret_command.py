"""`elastane secret`: make sure conf/cluster.toml holds a cluster secret, and say where."""
from __future__ import annotations

import argparse
from pathlib import Path

from protocol import config

from .context import CliContext
from .errors import EXIT_OK, OperationFailed, UsageError


def add_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("secret", help="generate the cluster secret into cluster.toml if it is empty")
    p.add_argument("--conf", type=Path, help=f"cluster.toml (default: {config.CONF_DIR / 'cluster.toml'})")
    p.set_defaults(func=cmd_secret)


def cmd_secret(args: argparse.Namespace, ctx: CliContext) -> int:
    path: Path = args.conf or (config.CONF_DIR / "cluster.toml")
    try:
        had = path.exists() and bool(config.load(path, config.ClusterConfig, "cluster").secret)
        config.ensure_secret(path)
    except config.ConfigError as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise OperationFailed(f"cannot write {path}: {e}") from None
    ctx.out.write(f"cluster secret {'already set' if had else 'generated'} in {path}\n")
    return EXIT_OK
