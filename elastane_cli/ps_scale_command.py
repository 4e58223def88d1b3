"""`elastane ps scale APP_ID --workers +2 --servers -1`: change a running PS job's shape with EPS.

Goes through the RM, as the user, so it needs no token of the job's: reads the job's live shape and
limits from the AM's readable /status (once no other change runs), turns the relative flags into
the absolute target, and PUTs it to the RM (PUT /ws/v1/cluster/apps/{id}/shape: the app ACL
applies, so only the owner or an admin may). The AM carries the
directive out on its next heartbeat with EPS's functions, without restarting the job; the command
waits until it has -- and until the RM's record of the job (GET .../shape, what `app status` and
the web UI show) has the new shape: the AM reports it on its next heartbeat, which it sends at
once when a change ends, so that a YARN user who reads the app back after the command returns
sees the shape the command made, never the one before it. Then it prints one line per EPS
function called, from the AM's shape history (`ps_reports.shape_change`): what it did, the shape
before -> after, how long it took, what it moved and how long training waited.
Exit codes: 0 done, 2 an impossible change or bad usage, 1 the change failed, was refused (403)
or the RM / AM cannot be reached.
"""
from __future__ import annotations

import argparse
import asyncio
import re

import aiohttp
import msgspec

from protocol import ps_job_spec
from protocol.http_client import JsonHttpClient, RemoteError
from protocol.yarn_views import ShapeView
from protocol.ps_status import DirectiveRecord, PsStatus, decode_status
from protocol.shape_history import ShapeChange

from .arg_types import application_id
from .context import CliContext, common_parent
from .errors import EXIT_OK, OperationFailed, UsageError
from .ps_reports import SHAPE_CHANGE_HEADERS, shape_change_rows
from .rm_rest_client import RmRestClient
from .tables import render_table

SCALE_TIMEOUT_S = 600.0      # a change waits for containers and an epoch boundary
POLL_S = 0.5
_SIGNED = re.compile(r"^[+-]?\d+$")



def changes_made(status: PsStatus) -> int:
    """How many shape changes the job has made: its count (the history keeps the newest only), or,
    from an AM that does not count them, its history's length."""
    return status.shape_changes or len(status.shape_history)

def signed_count(text: str) -> int:
    """A relative change: +N, -N or N (argparse type)."""
    if not _SIGNED.match(text.strip()):
        raise argparse.ArgumentTypeError(f"expected a signed count like +2 or -1, got {text!r}")
    return int(text)


def add_parser(acts: argparse._SubParsersAction, common: argparse.ArgumentParser | None = None) -> None:
    """Add `scale` to `acts`, the sub-commands of `elastane ps` (elastane_cli.ps_commands.add_parser's answer)."""
    p = acts.add_parser("scale", parents=[common or common_parent()],
                        help="add or remove workers / servers of a running PS job (EPS)",
                        description="Change a running PS job's shape without restarting it: "
                                    "--workers +2 adds two workers, --servers -1 removes a server.")
    p.add_argument("app_id", type=application_id, metavar="APP_ID")
    p.add_argument("--workers", type=signed_count, default=0, metavar="[+-]N", help="change of workers")
    p.add_argument("--servers", type=signed_count, default=0, metavar="[+-]N", help="change of servers")
    p.set_defaults(func=cmd_scale)


def change_rows(changes: list[ShapeChange]) -> list[list[object]]:
    """One row per entry of the AM's shape history: the function, its shape before -> after, how
    long it took, what it moved, how long training waited, containers added minus released."""
    return shape_change_rows(changes)


def live_shape(status: PsStatus) -> tuple[int, int]:
    """(workers, servers) serving now, from the AM's /status: what a directive starts from."""
    live = status.shape.serving() if status.shape else []
    return sum(e.role == "worker" for e in live), sum(e.role == "server" for e in live)


def check_target(status: PsStatus, workers: int, servers: int) -> None:
    """UsageError for a target the job cannot take (the limits the AM's /status shows)."""
    if workers < 1:
        raise UsageError(f"a job keeps at least 1 worker: the change would leave {workers}")
    if servers < 1:
        raise UsageError(f"a job keeps at least 1 server: the change would leave {servers}")
    limits = status.eps.limits if status.eps else None
    if limits is None:
        return
    for role, n, most in (("workers", workers, limits.workers), ("servers", servers, limits.servers)):
        if n > most:
            raise UsageError(f"{n} {role} is more than this job's maximum of {most}")


async def _am_status(am: JsonHttpClient, url: str) -> PsStatus:
    try:
        body = await am.get("/status")
    except (RemoteError, aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
        raise OperationFailed(f"cannot read the job's status at {url}: {e or type(e).__name__}") from None
    try:
        return decode_status(body if isinstance(body, dict) else {})
    except msgspec.ValidationError as e:
        raise OperationFailed(f"cannot read the job's status at {url}: {e}") from None


def _outcome(status: PsStatus, version: int) -> DirectiveRecord | None:
    """The AM's record of directive `version` (or a later one that superseded it), once it ended."""
    for d in reversed(status.directives):
        if d.version >= version:
            return d if d.ended else None
    return None


def rm_has_shape(shape: ShapeView, version: int) -> bool:
    """Whether the RM's record of the job (the report its AM last sent, GET .../shape's `current`)
    is the shape after directive `version`: the AM acted on it (or on a later one) and no change
    was running when it reported."""
    current = shape.get("current") or {}
    applied = current.get("directive_version")
    return isinstance(applied, int) and applied >= version and not current.get("changing", False)


async def scale_job(ctx: CliContext, app_id: str, workers: int, servers: int,
                    timeout_s: float = SCALE_TIMEOUT_S) -> list[ShapeChange]:
    async with RmRestClient(ctx.rm_url, ctx.user) as rm:
        app = await rm.app(app_id)
        if app.get("applicationType") not in (None, ps_job_spec.APPLICATION_TYPE):
            raise UsageError(f"{app_id} is not a PS job (application type {app['applicationType']})")
        if app.get("state") != "RUNNING" or not app.get("trackingUrl"):
            raise UsageError(f"{app_id} is {app.get('state')}: only a running PS job can be scaled")
        url = app["trackingUrl"]
        am = JsonHttpClient(url, timeout_s=30.0, user=ctx.user)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            # The shape to change is the AM's live one (the RM's copy lags a heartbeat behind), read
            # once no change runs, so the relative flags apply to the shape that change left.
            while (status := await _am_status(am, url)) and status.eps is not None and status.eps.running:
                if loop.time() > deadline:
                    raise OperationFailed(f"another change of {app_id} is still running after {timeout_s:.0f}s")
                await asyncio.sleep(POLL_S)
            current_w, current_s = live_shape(status)
            if current_w == 0 or current_s == 0:
                raise UsageError(f"{app_id} has no serving executors yet: scale it once it trains")
            target_w, target_s = current_w + workers, current_s + servers
            check_target(status, target_w, target_s)
            seen = changes_made(status)
            shape = await rm.put_shape(app_id, target_w, target_s, reason=(
                f"elastane ps scale by {ctx.user}: workers {workers:+d}, servers {servers:+d}"))
            version = int((shape.get("directive") or {}).get("version", 0))
            while (outcome := _outcome(status, version)) is None:
                if loop.time() > deadline:
                    raise OperationFailed(f"the job did not reach {target_w} workers, {target_s} servers "
                                          f"within {timeout_s:.0f}s")
                await asyncio.sleep(POLL_S)
                status = await _am_status(am, url)
            if outcome.error:
                raise OperationFailed(f"the scale failed: {outcome.error}")
            while not rm_has_shape(await rm.app_shape(app_id), version):
                if loop.time() > deadline:
                    raise OperationFailed(f"the job reached its new shape, but the RM has not heard of it "
                                          f"within {timeout_s:.0f}s")
                await asyncio.sleep(POLL_S)
        finally:
            await am.close()
    new = changes_made(status) - seen
    return status.shape_history[-new:] if new > 0 else []


def cmd_scale(args: argparse.Namespace, ctx: CliContext) -> int:
    if args.workers == 0 and args.servers == 0:
        raise UsageError("nothing to change: give --workers and/or --servers as +N or -N")
    changes = asyncio.run(scale_job(ctx, args.app_id, args.workers, args.servers))
    ctx.out.write(render_table(SHAPE_CHANGE_HEADERS, change_rows(changes)) + "\n")
    return EXIT_OK
