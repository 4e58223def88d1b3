"""The `elastane` command: argparse front end, dispatch to the command groups, exit codes.

Exit codes: 0 ok, 1 the operation or the app failed (or the RM is unreachable), 2 bad usage or
bad input (argparse errors, and 400 / 404 answers from the RM).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from protocol import config, storage_settings

from . import app_commands, cluster_commands, daemon_commands, data_commands, node_commands, ps_commands, ps_scale_command, secret_command
from . import top_command
from . import sim_commands
from . import model_commands
from .context import CliContext, common_parent, default_cluster_dir, default_user, global_options, resolve_rm_url
from .errors import CliError, UsageError

PROG = "elastane"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Elastane: a YARN-style resource manager for elastic parameter-server ML.",
        epilog="Exit codes: 0 ok, 1 failed, 2 bad usage or input.")
    global_options(parser)
    sub = parser.add_subparsers(dest="group", required=True, metavar="COMMAND")
    common = common_parent()
    for module in (cluster_commands, node_commands, app_commands):
        module.add_parser(sub, common)
    ps_actions = ps_commands.add_parser(sub, common)
    for module in (daemon_commands, secret_command, data_commands):
        module.add_parser(sub, common)
    ps_scale_command.add_parser(ps_actions, common)     # `elastane ps scale` (EPS), beside ps submit / status
    top_command.add_parser(sub, common)          # `elastane top`, like `yarn top`
    sim_commands.add_parser(sub, common)         # `elastane sim` (the discrete-event simulator)
    model_commands.add_parser(sub, common)       # `elastane model` (a PS job's saved model)
    return parser


def make_context(args: argparse.Namespace) -> CliContext:
    cluster_dir = default_cluster_dir()
    return CliContext(rm_url=resolve_rm_url(getattr(args, "rm", None), cluster_dir),
                      user=getattr(args, "user", None) or default_user(), cluster_dir=cluster_dir)


def cluster_conf_file(ctx: CliContext) -> Path:
    """The cluster.toml this client reads: the local cluster's (`elastane cluster start`), else the
    installation's conf dir (ELASTANE_CONF_DIR)."""
    local = ctx.cluster_dir / "conf" / "cluster.toml"
    return local if local.exists() else config.CONF_DIR / "cluster.toml"


def apply_storage_settings(ctx: CliContext) -> None:
    """Export cluster.toml's [storage] (the object store's endpoint and credentials) for this
    command's s3:// URLs (staging, model outputs, checks), where the environment does not set them
    already; a conf this user may not read (it is private to the cluster) leaves the environment's."""
    try:
        storage_settings.apply(config.load_storage(str(cluster_conf_file(ctx))))
    except PermissionError:
        return
    except (config.ConfigError, OSError) as e:
        raise UsageError(f"[storage]: {e}") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(sys.argv[1:] if argv is None else list(argv))
    if extra and not getattr(args, "passthrough", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")  # exits 2
    args.extra = extra
    ctx = make_context(args)
    try:
        apply_storage_settings(ctx)
        return args.func(args, ctx)
    except CliError as e:
        ctx.out.flush()
        print(f"{PROG}: error: {e.message}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"\n{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `elastane app logs ... | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
