"""`elastane ps scale APP_ID --workers +2 --servers -1`: change a running PS job's shape with EPS.

Finds the job's ApplicationMaster through the RM (its tracking URL) and POSTs the relative change
to the AM's /scale endpoint (appmaster.ps.status_server), which adds or removes workers and
servers without restarting the job and answers once the change is done. Prints one line per EPS
function called: what it did, how long it took, what it moved and how long training waited.
Exit codes: 0 done, 2 an impossible change or bad usage (the AM's 400 / 409 message is shown),
1 the change failed or the AM cannot be reached.
"""
from __future__ import annotations

import argparse
import asyncio
import re
from typing import Any

import aiohttp

from protocol import ps_job_spec
from protocol.http_client import JsonHttpClient, RemoteError

from .app_commands import _app_id
from .context import CliContext, common_parent
from .errors import EXIT_OK, OperationFailed, UsageError
from .rm_rest_client import RmRestClient
from .tables import render_table

SCALE_TIMEOUT_S = 600.0      # a change waits for containers and an epoch boundary
_SIGNED = re.compile(r"^[+-]?\d+$")


def signed_count(text: str) -> int:
    """A relative change: +N, -N or N (argparse type)."""
    if not _SIGNED.match(text.strip()):
        raise argparse.ArgumentTypeError(f"expected a signed count like +2 or -1, got {text!r}")
    return int(text)


def find_ps_group(sub: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """The sub-commands of `elastane ps` (added by elastane_cli.ps_commands)."""
    ps = sub.choices.get("ps")
    if ps is None:
        raise RuntimeError("the `ps` command group must be added before `ps scale`")
    for action in ps._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    raise RuntimeError("`elastane ps` has no sub-commands")


def add_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser | None = None) -> None:
    acts = find_ps_group(sub)
    p = acts.add_parser("scale", parents=[common or common_parent()],
                        help="add or remove workers / servers of a running PS job (EPS)",
                        description="Change a running PS job's shape without restarting it: "
                                    "--workers +2 adds two workers, --servers -1 removes a server.")
    p.add_argument("app_id", type=_app_id, metavar="APP_ID")
    p.add_argument("--workers", type=signed_count, default=0, metavar="[+-]N", help="change of workers")
    p.add_argument("--servers", type=signed_count, default=0, metavar="[+-]N", help="change of servers")
    p.set_defaults(func=cmd_scale)


def change_rows(changes: list[dict[str, Any]]) -> list[list[Any]]:
    rows = []
    for c in changes:
        after = c.get("after") or {}
        moved = []
        if c.get("blocks_moved"):
            moved.append(f"{c['blocks_moved']} model blocks")
        if c.get("splits_moved"):
            moved.append(f"{c['splits_moved']} splits")
        if c.get("splits_reactivated"):
            moved.append(f"{c['splits_reactivated']} re-activated")
        rows.append([c.get("op"), c.get("requested"), f"{after.get('workers')}/{after.get('servers')}",
                     f"{float(c.get('duration_s', 0)):.2f}s", ", ".join(moved) or "-",
                     f"{float(c.get('training_time_lost_s', 0)):.3f}s",
                     len(c.get("containers_added", [])) - len(c.get("containers_released", []))])
    return rows


async def scale_job(ctx: CliContext, app_id: str, workers: int, servers: int) -> list[dict[str, Any]]:
    async with RmRestClient(ctx.rm_url, ctx.user) as rm:
        app = await rm.app(app_id)
    if app.get("applicationType") not in (None, ps_job_spec.APPLICATION_TYPE):
        raise UsageError(f"{app_id} is not a PS job (application type {app['applicationType']})")
    if app.get("state") != "RUNNING" or not app.get("trackingUrl"):
        raise UsageError(f"{app_id} is {app.get('state')}: only a running PS job can be scaled")
    client = JsonHttpClient(app["trackingUrl"], timeout_s=SCALE_TIMEOUT_S, user=ctx.user)
    try:
        body = await client.post("/scale", {"workers": workers, "servers": servers})
    except RemoteError as e:
        if e.status in (400, 409):
            raise UsageError(e.message) from None
        raise OperationFailed(f"the scale failed: {e.message}") from None
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
        raise OperationFailed(f"cannot reach the job's ApplicationMaster at {app['trackingUrl']}: "
                              f"{e or type(e).__name__}") from None
    finally:
        await client.close()
    return list(body.get("changes", [])) if isinstance(body, dict) else []


def cmd_scale(args: argparse.Namespace, ctx: CliContext) -> int:
    if args.workers == 0 and args.servers == 0:
        raise UsageError("nothing to change: give --workers and/or --servers as +N or -N")
    changes = asyncio.run(scale_job(ctx, args.app_id, args.workers, args.servers))
    ctx.out.write(render_table(["FUNCTION", "N", "NOW W/S", "TOOK", "MOVED", "TRAINING-WAITED", "CONTAINERS"],
                               change_rows(changes)) + "\n")
    return EXIT_OK
