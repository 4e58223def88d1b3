"""`elastane ps submit | status`: parameter-server training jobs (application type ELASTANE_PS).

`submit` builds a PS job spec from flags (and an optional JSON spec file the flags override),
validates it here with `protocol.ps_job_spec` so a bad field is named before anything is sent
(exit 2), submits it through the RM's YARN REST API and, with `--wait`, shows a progress bar over
the epochs from the AM's status endpoint (the app's tracking URL) until the app ends.
`--py-files` / `--files` / `--archives` ship files with the job like spark-submit
(elastane_cli.staging); a `module:Class` app found among them (or on sys.path) is imported here so
its own data and hyper-parameter types check the spec before submission.
`status` shows what the AM reports while the job runs, or what the RM knows once it has ended.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import math
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import aiohttp
import msgspec

from protocol import ps_job_spec
from protocol.app_timeouts import lifetime_timeouts
from protocol.http_client import JsonHttpClient, RemoteError
from protocol.json_types import JsonInObject, JsonObject, JsonValue
from protocol.ps_app_schemas import APP_SCHEMAS, PRESET_NAMES
from protocol.ps_status import PsStatus, decode_status
from protocol.yarn_views import AppView

from .app_commands import FINAL_STATES
from .arg_types import application_id, lifetime_s, positive_int
from .context import CliContext
from .errors import EXIT_FAILED, EXIT_OK, OperationFailed, UsageError
from .progress_bar import EpochPoint, EpochProgress, ProgressBar, format_objective
from .ps_reports import (AM_ENDING_PHASES, EXECUTOR_HEADERS, PLAN_HEADERS, ended_report, executor_rows,
                         final_from_diagnostics, final_report, max_epochs_of, plan_history_rows, progress_from_status, running_report)
from .rm_rest_client import RmRestClient
from .staging import ShippedFiles, importable
from .tables import render_key_values, render_table

if TYPE_CHECKING:
    from psruntime.apps.base import PSApp

POLL_S = 0.5
FAST_POLL_S = 0.1        # while the AM evaluates: its final metrics are served only briefly
AM_STATUS_TIMEOUT_S = 5.0
DEFAULT_AM_MEMORY_MB = 512
# The attempts the RM may make (rm.toml's max_app_attempts caps it, default 2): a second attempt
# resumes the job from its latest checkpoint. Attempts lost with their node do not count.
DEFAULT_MAX_ATTEMPTS = 2

# Flags that set one top-level spec field: (flag, spec field).
FIELD_FLAGS = (("--app", "app"), ("--preset", "preset"), ("--workers", "workers"), ("--servers", "servers"),
               ("--blocks", "blocks"), ("--sync", "sync"), ("--staleness", "staleness"),
               ("--max-epochs", "max_epochs"), ("--executor-memory", "executor_memory_mb"),
               ("--executor-vcores", "executor_vcores"), ("--early-stopping", "early_stopping"))


def add_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> argparse._SubParsersAction:
    """Add `elastane ps` and its sub-commands; returns them, for the sub-commands that other modules
    add (elastane_cli.ps_scale_command: `ps scale`)."""
    ps = sub.add_parser("ps", help="submit and watch parameter-server training jobs")
    acts = ps.add_subparsers(dest="action", required=True, metavar="ACTION")

    p = acts.add_parser("submit", parents=[common], help="submit a PS training job",
                        description="Submit a PS job; flags override the fields of --spec-file.")
    p.add_argument("--app", metavar="APP", help=f"the ML app to train: {', '.join(sorted(APP_SCHEMAS))}, "
                                                "or your own as module:Class (docs/app_api.md)")
    p.add_argument("--preset", choices=PRESET_NAMES, help="data size preset (default tiny)")
    p.add_argument("--workers", type=int, help="worker executors (default 2)")
    p.add_argument("--servers", type=int, help="server executors (default 1)")
    p.add_argument("--blocks", type=int, help="model blocks (default 4 x servers)")
    p.add_argument("--sync", choices=("bsp", "ssp"), help="synchronisation (default bsp)")
    p.add_argument("--staleness", type=int, help="SSP staleness bound (default 2 with ssp)")
    p.add_argument("--max-epochs", type=int, help="epoch limit (default: the app's)")
    p.add_argument("--early-stopping", type=int, metavar="EPOCHS",
                   help="end the job once its held-out metric has not improved for EPOCHS epochs")
    p.add_argument("--executor-memory", type=int, metavar="MB", help="MB per executor (default 512)")
    p.add_argument("--executor-vcores", type=int, metavar="V", help="vcores per executor (default 1)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="FIELD=VALUE",
                   help="any spec field by dotted path, e.g. data.num_samples=4000 (repeatable)")
    p.add_argument("--hparam", dest="hparams", action="append", default=[], metavar="KEY=VALUE",
                   help="a hyper-parameter, e.g. learning_rate=0.3 (repeatable)")
    p.add_argument("--place", dest="places", action="append", default=[], metavar="NODE=W,S",
                   help="W workers and S servers of the job's first executors on NODE, a node id "
                        "host:port or a host name (repeatable, one per node; the counts must sum to "
                        "--workers / --servers): the spec's placement")
    p.add_argument("--spec-file", type=Path, metavar="JOB.json", help="a PS job spec as JSON")
    p.add_argument("--name", help="application name (default ps-APP-PRESET)")
    p.add_argument("--queue", default="default")
    p.add_argument("--am-memory", type=positive_int("--am-memory"), default=DEFAULT_AM_MEMORY_MB, metavar="MB",
                   help=f"MB for the ApplicationMaster (default {DEFAULT_AM_MEMORY_MB})")
    p.add_argument("--max-attempts", type=positive_int("--max-attempts"), default=DEFAULT_MAX_ATTEMPTS, metavar="N",
                   help=f"ApplicationMaster attempts the RM may make, >= 1 (default {DEFAULT_MAX_ATTEMPTS}; "
                        "the RM's max_app_attempts caps it)")
    p.add_argument("--lifetime", type=lifetime_s("--lifetime"), metavar="SECONDS",
                   help="the RM kills the job if it has not finished this long after submission")
    p.add_argument("--py-files", action="append", metavar="A.py,B.py",
                   help="Python modules to ship: importable by the AM and executors (repeatable or a comma list)")
    p.add_argument("--files", action="append", metavar="F1,F2",
                   help="files to ship into every container's working dir (repeatable or a comma list)")
    p.add_argument("--archives", action="append", metavar="X.tar.gz",
                   help="archives (.tar, .tar.gz, .tgz, .zip) unpacked in every container's working dir")
    p.add_argument("--staging-dir", metavar="URL",
                   help="where shipped files are uploaded (default: cluster.toml's staging_dir; "
                        "none: local files are referenced in place)")
    p.add_argument("--wait", action="store_true", help="show a progress bar until the job ends")
    p.set_defaults(func=cmd_submit)

    p = acts.add_parser("status", parents=[common], help="a PS job's shape, executors and objective")
    p.add_argument("app_id", type=application_id, metavar="APP_ID")
    p.add_argument("--history", type=positive_int("--history"), default=10, metavar="N",
                   help="how many recent epochs to list (default 10)")
    p.set_defaults(func=cmd_status)
    return acts


# ----- the spec from flags ---------------------------------------------------------------------

def parse_value(text: str) -> JsonValue:
    """A flag value as JSON when it is JSON (4000, 0.3, true, [1, 2]), else the plain string."""
    try:
        value: JsonValue = json.loads(text)
    except ValueError:
        return text
    return value


def _finite(value: JsonValue) -> bool:
    """No NaN or infinity anywhere in `value` (json.loads reads NaN, Infinity and 1e400 as floats)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return True


def parse_assignment(text: str, flag: str) -> tuple[list[str], JsonValue]:
    """`data.num_samples=4000` -> (["data", "num_samples"], 4000); UsageError naming `flag`."""
    key, sep, value = text.partition("=")
    path = key.strip().split(".")
    if not sep or not all(path):
        raise UsageError(f"{flag} expects FIELD=VALUE with a dotted field path, got {text!r}")
    parsed = parse_value(value.strip())
    if not _finite(parsed):
        # JSON has no such numbers: sent, they would arrive as null, and the error name a null.
        raise UsageError(f"{flag} {key.strip()}: {value.strip()!r} is not a finite number")
    return path, parsed


def set_path(spec: JsonObject, path: list[str], value: JsonValue, flag: str) -> None:
    node = spec
    for i, part in enumerate(path[:-1]):
        nxt = node.setdefault(part, {})
        if not isinstance(nxt, dict):
            raise UsageError(f"{flag} {'.'.join(path)}: {'.'.join(path[:i + 1])} is not an object")
        node = nxt
    node[path[-1]] = value


_COUNT = re.compile(r"-?[0-9]+")    # a --place count (a negative one is refused by the spec check, naming it)


def parse_place(text: str) -> JsonObject:
    """`10.0.0.5:45454=1,2` -> one placement entry {node, workers, servers}; UsageError when the
    text is not NODE=WORKERS,SERVERS (a node id has a colon, never an "=")."""
    node, sep, counts = text.rpartition("=")
    parts = counts.split(",")
    # ASCII digits only: str.isdigit also takes '²' or '٣', which int() then refuses.
    if not sep or not node.strip() or len(parts) != 2 or not all(_COUNT.fullmatch(x.strip()) for x in parts):
        raise UsageError(f"--place expects NODE=WORKERS,SERVERS (e.g. 10.0.0.5:45454=1,1), got {text!r}")
    return {"node": node.strip(), "workers": int(parts[0]), "servers": int(parts[1])}


def load_spec_file(path: Path) -> JsonObject:
    try:
        obj: JsonValue = json.loads(path.read_text())
    except OSError as e:
        raise UsageError(f"--spec-file: cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise UsageError(f"--spec-file: {path} is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise UsageError(f"--spec-file: {path} must hold a JSON object, got {type(obj).__name__}")
    return obj


def spec_from_args(args: argparse.Namespace) -> tuple[JsonObject, dict[str, str]]:
    """The PS job spec (builtins, not yet validated): the spec file, then the flags over it; and
    which flag set which top-level field, to name it in errors."""
    spec: JsonObject = load_spec_file(args.spec_file) if args.spec_file else {}
    set_by: dict[str, str] = {}
    for flag, name in FIELD_FLAGS:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            spec[name] = value
            set_by[name] = flag
    if args.places:        # the flags' placement replaces the spec file's as a whole
        spec["placement"] = [parse_place(text) for text in args.places]
        set_by["placement"] = "--place"
    for text in args.sets:
        set_path(spec, *parse_assignment(text, "--set"), "--set")
    for text in args.hparams:
        path, value = parse_assignment(text, "--hparam")
        set_path(spec, ["hparams", *path], value, "--hparam")
    if "app" not in spec:
        raise UsageError("app: required field is missing; give --app (one of "
                         f"{', '.join(sorted(APP_SCHEMAS))}) or a --spec-file with \"app\"")
    return spec, set_by


def validate_spec(spec: JsonObject, set_by: dict[str, str] | None = None) -> ps_job_spec.PSJobSpec:
    """Validate client-side; UsageError (exit 2) naming the field (and the flag that set it)."""
    try:
        return ps_job_spec.validate(spec)
    except ps_job_spec.JobSpecError as e:
        flag = (set_by or {}).get(e.field.split(".", 1)[0].split("[", 1)[0])
        hint = f" (set by {flag})" if flag else ""
        raise UsageError(f"invalid PS job spec: {e}{hint}") from None


class AmStatusReader:
    """Reads GET <trackingUrl>/status; None when the AM does not answer (not up yet, or gone)."""

    def __init__(self, user: str) -> None:
        self.user = user
        self._clients: dict[str, JsonHttpClient] = {}
        self.last_error = ""

    async def read(self, tracking_url: str) -> PsStatus | None:
        base = tracking_url.rstrip("/")
        client = self._clients.get(base)
        if client is None:
            client = self._clients[base] = JsonHttpClient(base, timeout_s=AM_STATUS_TIMEOUT_S, user=self.user)
        try:
            body = await client.get("/status")
        except (RemoteError, aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError) as e:
            self.last_error = f"{base}/status: {e or type(e).__name__}"
            return None
        if not isinstance(body, dict):
            return None
        try:
            return decode_status(body)
        except msgspec.ValidationError as e:
            self.last_error = f"{base}/status: unreadable answer: {e}"
            return None

    async def close(self) -> None:
        for c in self._clients.values():
            await c.close()
        self._clients.clear()


@dataclass
class WatchResult:
    """How a watched job ended: the RM's final app record and the last AM status seen."""

    app: AppView
    status: PsStatus | None


async def watch_ps_job(client: RmRestClient, app_id: str, bar: ProgressBar, max_epochs: int = 0,
                       poll_s: float | None = None, timeout_s: float | None = None) -> WatchResult:
    """Poll the RM and the AM's status, redrawing `bar`, until the app reaches a final state."""
    poll_s = POLL_S if poll_s is None else poll_s
    reader = AmStatusReader(client.user)
    last: PsStatus | None = None
    loop = asyncio.get_running_loop()
    deadline = None if timeout_s is None else loop.time() + timeout_s
    try:
        while True:
            app = await client.app(app_id)
            state = app.get("state")
            if state in FINAL_STATES:
                _draw_the_end(bar, app, last, max_epochs)
                return WatchResult(app, last)
            status = None
            if state == "RUNNING" and app.get("trackingUrl"):
                status = await reader.read(app["trackingUrl"])
            if status is not None:
                last = status
                bar.update(progress_from_status(status, max_epochs))
            elif last is None:
                bar.message(f"{app_id}  {state}  (waiting for the ApplicationMaster)", key=str(state))
            if deadline is not None and loop.time() > deadline:
                raise OperationFailed(f"{app_id} did not finish within {timeout_s:.0f}s (state {state})")
            await asyncio.sleep(min(poll_s, FAST_POLL_S) if _near_the_end(status, max_epochs) else poll_s)  # live view

    finally:
        bar.finish()
        await reader.close()


def _draw_the_end(bar: ProgressBar, app: AppView, last: PsStatus | None, max_epochs: int) -> None:
    """The bar's last frame from the AM's final diagnostics, when the last status seen is older
    than the end (a short job can train through between two polls): the bar always ends where
    the job did."""
    parsed = final_from_diagnostics(app.get("diagnostics"))
    if parsed is None:
        return
    done = int(parsed[1])
    if last is not None and (last.epoch or 0) >= done:
        return
    try:
        history = [EpochPoint(done - 1, float(parsed[0]), 0.0, 0.0)] if done > 0 else []
    except ValueError:
        history = []
    limit = (last.max_epochs if last is not None else None) or max_epochs
    bar.update(EpochProgress(phase=str(app.get("state")), epochs_done=done, max_epochs=max(limit, done),
                             history=history))


def _near_the_end(status: PsStatus | None, max_epochs: int) -> bool:
    """Whether the job is in (or one epoch from) its final phase, whose status the AM serves only
    until it exits: then poll faster to catch the final metrics."""
    if status is None:
        return False
    if status.state in AM_ENDING_PHASES:
        return True
    limit = status.max_epochs or max_epochs     # the AM's app's own, else what this client knew
    return bool(limit) and (status.epoch or 0) >= limit - 1


# ----- a user's app ----------------------------------------------------------------------------

def cluster_staging_dir(ctx: CliContext) -> str | None:
    """cluster.toml's staging_dir: the local cluster's conf, else the installation's."""
    from protocol import config  # noqa: PLC0415 (only a submission with files needs it)

    path = ctx.cluster_dir / "conf" / "cluster.toml"
    try:
        cfg = config.load_cluster(str(path) if path.exists() else None)
    except config.ConfigError as e:
        raise UsageError(f"staging_dir: {e}") from None
    return cfg.staging_dir or None


@contextlib.contextmanager
def shipped_working_dir(shipped: ShippedFiles) -> Iterator[None]:
    """The block runs in a directory where the shipped files are linked by their link names, as
    in the job's containers: an app that opens its data file by a relative name finds it here."""
    from elastane.model_output import in_job_dir  # noqa: PLC0415 (user apps only)

    with tempfile.TemporaryDirectory(prefix="elastane-submit-") as d:
        for link, (path, kind) in shipped.files.items():
            if kind == "FILE":
                os.symlink(path.resolve(), os.path.join(d, link))
        with in_job_dir(Path(d)):
            yield


def check_user_app(spec: ps_job_spec.PSJobSpec, shipped: ShippedFiles,
                   ctx: CliContext) -> PSApp[msgspec.Struct, msgspec.Struct] | None:
    """Validate a `module:Class` job with the app's own types where this client has its code (the
    --py-files' dirs, or sys.path): UsageError naming what is wrong. Without the code here the
    AM checks it when it starts. Returns the app built (None without its code): what the progress
    takes its epoch limit from."""
    from psruntime.apps.base import AppConfigError  # noqa: PLC0415 (user apps only)
    from psruntime.apps.registry import UserCodeError, create_job_app  # noqa: PLC0415

    module = spec.app.split(":", 1)[0]
    # Absolute: the check runs in another working dir (shipped_working_dir)
    with importable([os.path.abspath(d) for d in shipped.module_dirs()]), shipped_working_dir(shipped):
        if importlib.util.find_spec(module.split(".", 1)[0]) is None:
            ctx.err.write(f"elastane: note: module {module!r} is not here to check the job with; "
                          "the AM checks it when it starts\n")
            return None
        try:
            app = create_job_app(spec)
        except (AppConfigError, UserCodeError) as e:
            raise UsageError(f"invalid PS job spec: {e}") from None
        try:
            blocks = app.num_blocks
        except Exception as e:  # noqa: BLE001 - the app's reader: its data may be where only the cluster reads
            ctx.err.write(f"elastane: note: {spec.app} cannot size its data here ({type(e).__name__}: {e}); "
                          "the AM checks it when it starts\n")
            return app
        if spec.workers > blocks:
            raise UsageError(f"invalid PS job spec: workers: {spec.workers} workers but the {spec.app} data has "
                             f"only {blocks} input blocks; lower workers or data.rows_per_block")
    return app


# ----- reports ---------------------------------------------------------------------------------

def cmd_submit(args: argparse.Namespace, ctx: CliContext) -> int:
    spec = validate_spec(*spec_from_args(args))
    shipped = ShippedFiles.from_flags(args.py_files, args.files, args.archives)
    app = check_user_app(spec, shipped, ctx) if spec.is_user_app else None
    max_epochs = max_epochs_of(spec, app)
    staging_dir = args.staging_dir if args.staging_dir is not None else cluster_staging_dir(ctx)
    name = args.name or f"ps-{spec.app.replace(':', '.')}-{spec.preset}"

    async def go() -> int:
        async with RmRestClient(ctx.rm_url, ctx.user) as c:
            app_id = await submit_ps_job(c, spec, name, args.queue, args.am_memory, args.max_attempts,
                                         shipped=shipped, staging_dir=staging_dir, lifetime_s=args.lifetime)
            ctx.out.write(f"Submitted application {app_id}\n")
            ctx.out.flush()
            if not args.wait:
                return EXIT_OK
            result = await watch_ps_job(c, app_id, ProgressBar(ctx.out), max_epochs)
            ctx.out.write(render_key_values(final_report(result)) + "\n")
            return EXIT_OK if result.app.get("finalStatus") == "SUCCEEDED" else EXIT_FAILED
    try:
        return asyncio.run(go())
    except KeyboardInterrupt:
        sys.stderr.write("\nelastane: stopped watching; the job keeps running "
                         "(`elastane app kill APP_ID` to stop it)\n")
        return 130


async def submit_ps_job(client: RmRestClient, spec: ps_job_spec.PSJobSpec, name: str, queue: str = "default",
                        am_memory: int = DEFAULT_AM_MEMORY_MB, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
                        shipped: ShippedFiles | None = None, staging_dir: str | None = None,
                        lifetime_s: int | None = None) -> str:
    """new-application + POST /apps with the PS submission; returns the application id. `shipped`
    files are staged under the new application's id and added to the spec's `resources` (which
    the submission gives the AM's container as its `local-resources` too); `lifetime_s`: the RM
    kills the job if it has not finished that long after submission."""
    from appmaster.ps.submission import build_ps_submission  # noqa: PLC0415 (only `ps submit` needs it)

    def build(app_id: str) -> JsonInObject:
        job = spec
        if shipped:
            staged = shipped.stage(staging_dir, client.user, app_id)
            job = msgspec.structs.replace(spec, resources={**spec.resources, **staged})
        try:
            sub = build_ps_submission(job, name=name, queue=queue, am_memory=am_memory,
                                      max_app_attempts=max_attempts, app_id=app_id)
        except ValueError as e:   # JobSpecError is a ValueError too
            raise UsageError(str(e)) from None
        if lifetime_s is not None:
            sub["application-timeouts"] = lifetime_timeouts(lifetime_s)
        return sub

    return await client.submit_new(build)


def cmd_status(args: argparse.Namespace, ctx: CliContext) -> int:
    async def go() -> tuple[AppView, PsStatus | None, str]:
        async with RmRestClient(ctx.rm_url, ctx.user) as c:
            app = await c.app(args.app_id)
            if app.get("applicationType") not in (None, ps_job_spec.APPLICATION_TYPE):
                raise UsageError(f"{args.app_id} is not a PS job (application type {app['applicationType']}); "
                                 "use `elastane app status`")
            if app.get("state") != "RUNNING" or not app.get("trackingUrl"):
                return app, None, ""
            reader = AmStatusReader(ctx.user)
            try:
                return app, await reader.read(app["trackingUrl"]), reader.last_error
            finally:
                await reader.close()
    app, status, error = asyncio.run(go())
    if status is None:
        ctx.out.write(render_key_values(ended_report(app)) + "\n")
        if app.get("state") == "RUNNING":
            ctx.err.write(f"elastane: the ApplicationMaster's status is not available "
                          f"({error or 'it has not registered a tracking URL yet'})\n")
        elif app.get("state") not in FINAL_STATES:
            ctx.err.write(f"elastane: the job has not started yet ({app.get('state')})\n")
        return EXIT_OK
    pairs, p = running_report(app, status)
    ctx.out.write(render_key_values(pairs) + "\n")
    rows = executor_rows(status)
    if rows:
        ctx.out.write("\nExecutors:\n" + render_table(EXECUTOR_HEADERS, rows) + "\n")
    plans = plan_history_rows(status)
    if plans:
        ctx.out.write("\nCruise plans:\n" + render_table(PLAN_HEADERS, plans) + "\n")
    recent = p.history[-args.history:]
    if recent:
        ctx.out.write("\nRecent epochs:\n" + render_table(
            ["EPOCH", "OBJECTIVE", "EPOCH-TIME"],
            [[h.epoch, format_objective(h.objective), f"{h.epoch_time_s:.3f}s"] for h in recent]) + "\n")
    return EXIT_OK
