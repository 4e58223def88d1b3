"""Entry point of the PS ApplicationMaster: `python -m appmaster.ps`.

Inside the AM container the RM launched: the job spec comes from the env variable
ELASTANE_PS_SPEC (set by the RM from the submission's `elastane.ps-job`, see
protocol.ps_job_spec) or from `--spec FILE`; checkpoints and the final status go under
ELASTANE_AM_DIR (or `--am-dir`): a path or an fsspec URL (protocol.durable_storage). Exit
codes: 0 when the job unregistered (SUCCEEDED or FAILED), 143 when stopped by
SIGTERM / the RM, 2 for a bad spec or environment.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from protocol import container_env, daemon, durable_storage
from protocol.ps_job_spec import PS_SPEC_ENV, JobSpecError, PSJobSpec, validate

from ..am_client import ApplicationMaster
from ..rm_client import AmEnvironmentError
from .runtime.master import PSApplicationMaster
from .user_errors import fail_before_start

log = logging.getLogger("appmaster.ps")
EXIT_STOPPED = 143


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m appmaster.ps", description="The PS ApplicationMaster.")
    p.add_argument("--spec", default=None, help=f"job spec JSON file (default: env {PS_SPEC_ENV})")
    p.add_argument("--am-dir", default=None, help="durable dir for checkpoints, a path or an fsspec URL such as "
                                                  f"s3://bucket/prefix (default: env {container_env.AM_DIR})")
    p.add_argument("--host", default=None, help="address to serve on (default: env NM_HOST, else 127.0.0.1)")
    return p.parse_args(list(argv))


def load_spec(ns: argparse.Namespace) -> PSJobSpec:
    if ns.spec:
        try:
            raw = Path(ns.spec).read_bytes()
        except OSError as e:
            raise JobSpecError("", f"cannot read --spec: {e}") from None
    else:
        raw = os.environ.get(PS_SPEC_ENV, "").encode()
        if not raw:
            raise JobSpecError("", f"no job spec: set {PS_SPEC_ENV} or pass --spec FILE")
    return validate(raw)


async def _amain(spec: PSJobSpec, am_dir: str, host: str) -> int:
    am = ApplicationMaster.from_env()
    try:
        master = PSApplicationMaster(am, spec, am_dir, host=host)
    except Exception as e:  # noqa: BLE001 - the app could not be built (user code, its config): FAILED
        try:
            await fail_before_start(am, spec, e, host)
        finally:
            await am.close()
        return 0
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, master.request_stop)
    try:
        status = await master.run()
    finally:
        await am.close()
    log.info("PS job ended: %s: %s", status.value if status else "stopped", master.job.diagnostics)
    return 0 if status is not None else EXIT_STOPPED


def main(argv: Sequence[str] | None = None) -> int:
    ns = parse_args(sys.argv[1:] if argv is None else argv)
    daemon.setup_logging("ps-am")
    try:
        spec = load_spec(ns)
    except JobSpecError as e:
        print(f"appmaster.ps: invalid job spec: {e}", file=sys.stderr)
        return 2
    am_dir = ns.am_dir or os.environ.get(container_env.AM_DIR) or tempfile.mkdtemp(prefix="ps-am-")
    try:        # a local path may be relative here (by hand): it names a dir of this host
        if durable_storage.local_path(am_dir) is None:
            durable_storage.validate(am_dir)
    except durable_storage.DurableStorageError as e:
        source = "--am-dir" if ns.am_dir else container_env.AM_DIR
        print(f"appmaster.ps: invalid {source}: {e}", file=sys.stderr)
        return 2
    host = ns.host or os.environ.get(container_env.NM_HOST) or "127.0.0.1"
    daemon.install_uvloop()
    try:
        return asyncio.run(_amain(spec, am_dir, host))
    except AmEnvironmentError as e:
        print(f"appmaster.ps: {e} (submit it with appmaster.ps.submission.build_ps_submission)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
