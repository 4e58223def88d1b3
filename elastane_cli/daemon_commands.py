"""`elastane rm start` / `elastane nm start`: run a daemon in the foreground, flags passed through."""
from __future__ import annotations

import argparse
import os
import sys

from . import rm_ha_commands
from .context import CliContext

DAEMON_MODULES = {"rm": "rm", "nm": "nodemanager"}


def add_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    for group, module in DAEMON_MODULES.items():
        what = "ResourceManager" if group == "rm" else "NodeManager"
        g = sub.add_parser(group, help=f"run the {what}")
        acts = g.add_subparsers(dest="action", required=True, metavar="ACTION")
        p = acts.add_parser("start", help=f"run the {what} in the foreground (`python -m {module} --help` "
                                          "for its flags; they are passed through)",
                            usage=f"elastane {group} start [{module} flags ...]")
        p.set_defaults(func=cmd_start, module=module, passthrough=True)
        if group == "rm":
            rm_ha_commands.add_actions(acts, common)    # ha-state, transition-to-standby


def daemon_argv(module: str, flags: list[str]) -> list[str]:
    return [sys.executable, "-m", module, *flags]


def cmd_start(args: argparse.Namespace, ctx: CliContext) -> int:
    argv = daemon_argv(args.module, list(args.extra))
    ctx.out.flush()
    ctx.err.flush()
    # exec: the daemon takes this process's place, so signals and the exit code are its own.
    os.execv(argv[0], argv)
    return 0  # not reached
