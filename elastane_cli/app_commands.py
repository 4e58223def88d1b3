"""`elastane app list | status | kill | logs | run`: applications through the RM's REST API."""
from __future__ import annotations

import argparse
import asyncio
import sys
import time

from protocol import ids
from protocol.aggregated_logs import RemoteLogDir
from protocol.app_timeouts import LIFETIME, UNLIMITED, format_expiry, lifetime_timeouts
from protocol.json_types import JsonInObject, JsonObject
from protocol.records import AppState
from protocol.yarn_views import AppView

from .arg_types import application_id, lifetime_s, positive_int
from . import container_logs
from .context import CliContext, common_parent
from .errors import EXIT_FAILED, EXIT_OK, CliError, OperationFailed, UsageError
from .rm_rest_client import RmRestClient
from .status_line import StatusLine, format_status
from .tables import format_duration, format_timestamp, render_key_values, render_table

FINAL_STATES = {s.value for s in AppState if s.is_final}
POLL_S = 0.5


def _container_id(v: str) -> str:
    try:
        ids.ContainerId.parse(v)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return v


def _states(v: str) -> str:
    names = [s.strip().upper() for s in v.split(",") if s.strip()]
    valid = {s.value for s in AppState}
    bad = [s for s in names if s not in valid]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"invalid state {','.join(bad) or v!r}; expected one of "
                                          + ", ".join(s.value for s in AppState))
    return ",".join(names)


def add_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    app = sub.add_parser("app", help="submit, list, watch and kill applications")
    acts = app.add_subparsers(dest="action", required=True, metavar="ACTION")

    # `--user` here filters by owner; the caller's own user is then given before `app`.
    p = acts.add_parser("list", parents=[common_parent(with_user=False)], help="list applications")
    p.add_argument("--state", type=_states, help="comma-separated states, e.g. RUNNING,ACCEPTED")
    p.add_argument("--queue")
    p.add_argument("--user", dest="app_user", metavar="USER", help="only this user's apps")
    p.add_argument("--limit", type=positive_int("--limit"))
    p.set_defaults(func=cmd_list)

    p = acts.add_parser("status", parents=[common], help="one application's report")
    p.add_argument("app_id", type=application_id, metavar="APP_ID")
    p.set_defaults(func=cmd_status)

    p = acts.add_parser("move-to-queue", parents=[common],
                        help="move an application, with what it holds, to another queue (yarn application -movetoqueue)")
    p.add_argument("app_id", type=application_id, metavar="APP_ID")
    p.add_argument("queue", metavar="QUEUE")
    p.set_defaults(func=cmd_move_to_queue)

    p = acts.add_parser("update-lifetime", parents=[common],
                        help="kill the application if it is still running SECONDS from now "
                             "(yarn application -updateLifetime)")
    p.add_argument("app_id", type=application_id, metavar="APP_ID")
    p.add_argument("seconds", type=lifetime_s("SECONDS"), metavar="SECONDS")
    p.set_defaults(func=cmd_update_lifetime)

    p = acts.add_parser("kill", parents=[common], help="kill an application")
    p.add_argument("app_id", type=application_id, metavar="APP_ID")
    p.set_defaults(func=cmd_kill)

    p = acts.add_parser("logs", parents=[common],
                        help="containers' stdout / stderr, from the NMs or the aggregated logs (remote_app_log_dir)")
    p.add_argument("app_id", type=application_id, metavar="APP_ID")
    p.add_argument("--container", type=_container_id, help="only this container")
    p.add_argument("--file", choices=container_logs.LOG_FILES, help="only this file (default: both)")
    p.set_defaults(func=cmd_logs)

    p = acts.add_parser("run", parents=[common], help="run a command in N containers (distributed shell)",
                        usage="elastane app run [-n N] [--memory MB] [--vcores V] [--name NAME] "
                              "[--queue Q] -- CMD [ARG ...]")
    p.add_argument("-n", "--num-containers", type=positive_int("-n"), default=1)
    p.add_argument("--memory", type=positive_int("--memory"), default=256, help="MB per container")
    p.add_argument("--vcores", type=positive_int("--vcores"), default=1, help="vcores per container")
    p.add_argument("--name", help="application name (default: the command)")
    p.add_argument("--queue", default="default")
    p.add_argument("--am-memory", type=positive_int("--am-memory"), default=128, help="MB for the AM")
    p.add_argument("--lifetime", type=lifetime_s("--lifetime"), metavar="SECONDS",
                   help="the RM kills the app if it has not finished this long after submission")
    p.add_argument("--no-wait", action="store_true", help="print the app id and return once submitted")
    p.add_argument("command", nargs="*", metavar="CMD")
    p.set_defaults(func=cmd_run)


def _client(ctx: CliContext) -> RmRestClient:
    return RmRestClient(ctx.rm_url, ctx.user)


# ----- list / status ---------------------------------------------------------------------------

def app_rows(apps: list[AppView]) -> list[list[object]]:
    return [[a.get("id", ""), a.get("name", ""), a.get("user", ""), a.get("queue", ""),
             a.get("state", ""), a.get("finalStatus", ""), f"{float(a.get('progress') or 0):.0f}%",
             format_timestamp(a.get("startedTime")), format_duration((a.get("elapsedTime") or 0) / 1000)]
            for a in apps]


APP_HEADERS = ["APPLICATION-ID", "NAME", "USER", "QUEUE", "STATE", "FINAL-STATUS", "PROGRESS",
               "STARTED", "ELAPSED"]


def cmd_list(args: argparse.Namespace, ctx: CliContext) -> int:
    async def go() -> list[AppView]:
        async with _client(ctx) as c:
            return await c.apps(states=args.state, queue=args.queue, user=args.app_user, limit=args.limit)
    apps = asyncio.run(go())
    ctx.out.write(render_table(APP_HEADERS, app_rows(apps)) + "\n")
    ctx.out.write(f"Total applications: {len(apps)}\n")
    return EXIT_OK


def app_report(app: AppView) -> list[tuple[str, object]]:
    """The `app status` fields, in YARN's `yarn application -status` order."""
    return [
        ("Application-Id", app.get("id")), ("Application-Name", app.get("name")),
        ("Application-Type", app.get("applicationType")), ("User", app.get("user")),
        ("Queue", app.get("queue")), ("State", app.get("state")),
        ("Final-State", app.get("finalStatus")), ("Progress", f"{float(app.get('progress') or 0):.0f}%"),
        ("Start-Time", format_timestamp(app.get("startedTime"))),
        ("Finish-Time", format_timestamp(app.get("finishedTime"))),
        ("Elapsed", format_duration((app.get("elapsedTime") or 0) / 1000)),
        ("Tracking-URL", app.get("trackingUrl") or "-"), ("AM-Host", app.get("amHostHttpAddress") or "-"),
        ("Running-Containers", app.get("runningContainers", 0)),
        ("Allocated-Resource", f"{app.get('allocatedMB', 0)} MB, {app.get('allocatedVCores', 0)} vcores"),
        ("Lifetime", lifetime_text(app)),
        ("Diagnostics", app.get("diagnostics") or "-"),
    ]


def lifetime_text(app: AppView) -> str:
    """The app's LIFETIME timeout as `yarn application -status` shows it: its expiry and the time left."""
    timeouts = (app.get("timeouts") or {}).get("timeout")
    for t in timeouts if isinstance(timeouts, list) else []:
        if isinstance(t, dict) and t.get("type") == LIFETIME:
            expiry, left = t.get("expiryTime"), t.get("remainingTimeInSeconds")
            if expiry == UNLIMITED or not isinstance(left, int):
                return UNLIMITED
            return f"expires {expiry} ({format_duration(left)} left)"
    return "-"


def cmd_status(args: argparse.Namespace, ctx: CliContext) -> int:
    async def go() -> AppView:
        async with _client(ctx) as c:
            return await c.app(args.app_id)
    ctx.out.write(render_key_values(app_report(asyncio.run(go()))) + "\n")
    return EXIT_OK


# ----- move-to-queue ---------------------------------------------------------------------------

def cmd_move_to_queue(args: argparse.Namespace, ctx: CliContext) -> int:
    async def go() -> str:
        async with _client(ctx) as c:
            return await c.move_to_queue(args.app_id, args.queue)
    ctx.out.write(f"Moved {args.app_id} to queue {asyncio.run(go())}\n")
    return EXIT_OK


# ----- update-lifetime -------------------------------------------------------------------------

def expiry_in(seconds: float, now: float | None = None) -> str:
    """The expiryTime `seconds` from now (this machine's clock), as the RM takes it."""
    return format_expiry((time.time() if now is None else now) + seconds)


def cmd_update_lifetime(args: argparse.Namespace, ctx: CliContext) -> int:
    async def go() -> JsonObject:
        async with _client(ctx) as c:
            return await c.put_lifetime(args.app_id, expiry_in(args.seconds))
    t = asyncio.run(go())
    ctx.out.write(f"Updated the lifetime of {args.app_id}: it expires {t.get('expiryTime')} "
                  f"({t.get('remainingTimeInSeconds')} s left)\n")
    return EXIT_OK


# ----- kill ------------------------------------------------------------------------------------

def cmd_kill(args: argparse.Namespace, ctx: CliContext) -> int:
    async def go() -> tuple[AppView, bool]:
        async with _client(ctx) as c:
            app = await c.app(args.app_id)
            if app.get("state") in FINAL_STATES:
                return app, False
            ctx.out.write(f"Killing application {args.app_id}\n")
            await c.kill(args.app_id)
            deadline = time.monotonic() + 30.0
            while app.get("state") not in FINAL_STATES and time.monotonic() < deadline:
                await asyncio.sleep(0.2)  # poll interval while the RM finishes the kill
                app = await c.app(args.app_id)
            return app, True
    app, requested = asyncio.run(go())
    state = app.get("state")
    if not requested:
        ctx.out.write(f"Application {args.app_id} has already finished: {state}/{app.get('finalStatus')}\n")
        return EXIT_OK
    if state == "KILLED":
        ctx.out.write(f"Killed application {args.app_id}\n")
        return EXIT_OK
    if state in FINAL_STATES:
        ctx.out.write(f"Application {args.app_id} finished before the kill: {state}/{app.get('finalStatus')}\n")
        return EXIT_OK
    raise OperationFailed(f"application {args.app_id} is still {state} after the kill request")


# ----- logs ------------------------------------------------------------------------------------

def cmd_logs(args: argparse.Namespace, ctx: CliContext) -> int:
    files = [args.file] if args.file else list(container_logs.LOG_FILES)
    store = container_logs.remote_log_dir(ctx)

    async def go() -> int:
        async with _client(ctx) as c:
            agg: dict[str, container_logs.Aggregated] = {}
            if store is not None:
                agg, refused = await container_logs.aggregated_containers(store, args.app_id)
                for e in refused:
                    ctx.err.write(f"elastane: warning: {e}\n")
            try:
                live = await container_logs.find_containers(c, args.app_id)
            except UsageError:
                if not agg:
                    raise
                live = []       # the RM no longer knows the app; its aggregated logs remain
            on_nm = {r.container_id: r for r in live}
            cids = sorted(set(on_nm) | set(agg))
            if args.container is not None and args.container not in cids:
                raise UsageError(f"container {args.container} of this app was not found on any node"
                                 + (" nor in the aggregated logs" if store else ""))
            if not cids:
                raise OperationFailed(f"no containers of {args.app_id} found on any running node "
                                      + (f"nor in the aggregated logs at {store.url}" if store else
                                         "(finished containers' logs are kept for nm.keep_finished_logs_s; "
                                         "cluster.toml's remote_app_log_dir keeps them beyond their nodes)"))
            for cid in cids:
                if args.container is not None and cid != args.container:
                    continue
                for f in files:
                    await _print_log(c, ctx, args.app_id, cid, f, on_nm.get(cid), agg.get(cid), store)
            return EXIT_OK
    return asyncio.run(go())


async def _print_log(c: RmRestClient, ctx: CliContext, app_id: str, cid: str, f: str,
                     ref: container_logs.ContainerRef | None, agg: container_logs.Aggregated | None,
                     store: RemoteLogDir | None) -> None:
    """One container's log file: aggregated when its node's final file is up (or its NM cannot
    answer), else from its NM."""
    text: str | None = None
    where = ""
    if ref is not None and not (agg is not None and agg.node.final):
        try:
            text, where = await container_logs.fetch_log(c, ref, f), ref.node_http_address
        except UsageError as e:  # 404: this file does not exist for this container
            if agg is None:
                ctx.err.write(f"elastane: {cid} {f}: {e.message}\n")
                return
        except CliError:        # the node is gone: its rolled uploads may have the logs
            if agg is None:
                raise
    if text is None and agg is not None and store is not None:
        if f not in agg.files:
            ctx.err.write(f"elastane: {cid} {f}: not in the aggregated logs of node {agg.node.node_id}\n")
            return
        text = await container_logs.read_aggregated(store, app_id, agg, cid, f)
        where = f"{agg.node.node_id} (aggregated{'' if agg.node.final else ', rolled while running'})"
    if text is None:
        return
    ctx.out.write(f"=== {cid} on {where}: {f} ===\n")
    ctx.out.write(text if not text or text.endswith("\n") else text + "\n")


# ----- run -------------------------------------------------------------------------------------

async def watch_app(client: RmRestClient, app_id: str, line: StatusLine, poll_s: float = POLL_S,
                    timeout_s: float | None = None) -> AppView:
    """Poll the app, redrawing the status line, until it reaches a final state; return its record."""
    started = time.monotonic()
    while True:
        app = await client.app(app_id)
        elapsed = time.monotonic() - started
        key = f"{app.get('state')}:{float(app.get('progress') or 0):.0f}"
        if app.get("state") in FINAL_STATES:
            line.finish(format_status(app, elapsed))
            return app
        line.update(format_status(app, elapsed), key=key)
        if timeout_s is not None and elapsed > timeout_s:
            line.finish()
            raise OperationFailed(f"{app_id} did not finish within {timeout_s:.0f}s (state {app.get('state')})")
        await asyncio.sleep(poll_s)  # poll interval of the live status, not a readiness wait


async def submit_shell(client: RmRestClient, command: list[str], num_containers: int, memory: int,
                       vcores: int, name: str | None = None, queue: str = "default",
                       am_memory: int = 128, lifetime_s: int | None = None) -> str:
    """Submit a distributed-shell app (new-application + POST /apps), killed by the RM after
    `lifetime_s` if given; return its id."""
    from appmaster.distributed_shell import build_submission  # noqa: PLC0415 (only `app run` needs it)

    def build(app_id: str) -> JsonInObject:
        try:
            sub = build_submission(name or " ".join(command)[:64], command, num_containers, memory, vcores,
                                   queue=queue, am_memory=am_memory, app_id=app_id)
        except ValueError as e:
            raise UsageError(str(e)) from None
        if lifetime_s is not None:
            sub["application-timeouts"] = lifetime_timeouts(lifetime_s)
        return sub

    return await client.submit_new(build)



def final_summary(app: AppView) -> str:
    text = f"{app.get('id')} {app.get('state')} with final status {app.get('finalStatus')}"
    if app.get("finalStatus") != "SUCCEEDED" and app.get("diagnostics"):
        text += f"\ndiagnostics: {app['diagnostics']}"
    return text


def cmd_run(args: argparse.Namespace, ctx: CliContext) -> int:
    if not args.command:
        raise UsageError("app run: no command given; put it after --, e.g. "
                         "`elastane app run -n 3 -- python -c 'print(42)'`")

    async def go() -> int:
        async with _client(ctx) as c:
            app_id = await submit_shell(c, args.command, args.num_containers, args.memory, args.vcores,
                                        args.name, args.queue, args.am_memory, args.lifetime)
            ctx.out.write(f"Submitted application {app_id}\n")
            if args.no_wait:
                return EXIT_OK
            line = StatusLine(ctx.out)
            try:
                app = await watch_app(c, app_id, line)
            except asyncio.CancelledError:
                line.finish()
                raise
            ctx.out.write(final_summary(app) + "\n")
            return EXIT_OK if app.get("finalStatus") == "SUCCEEDED" else EXIT_FAILED
    try:
        return asyncio.run(go())
    except KeyboardInterrupt:
        sys.stderr.write("\nelastane: stopped watching; the app keeps running "
                         "(`elastane app kill APP_ID` to stop it)\n")
        return 130
