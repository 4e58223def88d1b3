"""The PS AM with a test's hook after every BSP clock: the AM command of the cluster tests that
inject a fault or a directive at a point that does not depend on how fast the host is.

A hook is Python source defining `make_hook(master, am)`, which returns a function of no
arguments; the AM calls it after every clock (after the master's own per-clock work), in the AM's
event loop, with the `PSApplicationMaster` and its `ApplicationMaster` at hand.
"""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from protocol.durable_storage import write_atomic

SCRIPTED_AM = r'''
import asyncio, json, os, signal, sys, time
from pathlib import Path
from protocol import container_env, daemon
from protocol.internal_api import ShapeDirective
from appmaster.am_client import ApplicationMaster
from appmaster.am_events import ShapeChanged
from appmaster.ps.__main__ import load_spec, parse_args
from appmaster.ps.runtime.master import PSApplicationMaster

HOOK


async def main():
    spec = load_spec(parse_args([]))
    am = ApplicationMaster.from_env()
    master = PSApplicationMaster(am, spec, os.environ[container_env.AM_DIR],
                                 host=os.environ.get(container_env.NM_HOST, "127.0.0.1"))
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, master.request_stop)
    inner = master.training.loop.on_clock
    hook = make_hook(master, am)

    def on_clock():
        if inner is not None:
            inner()
        hook()
    master.training.loop.on_clock = on_clock
    try:
        status = await master.run()
    finally:
        await am.close()
    return 0 if status is not None else 143


daemon.setup_logging("ps-am-scripted")
sys.exit(asyncio.run(main()))
'''


def use_scripted_am(submission: dict[str, Any], script_dir: Path, hook: str,
                    environment: dict[str, str] | None = None) -> dict[str, Any]:
    """Make `submission` (a PS job's YARN submission) run the PS AM with `hook` (see the module
    doc), written under `script_dir`, with `environment` added to the AM's environment."""
    # Written atomically: tests submit several jobs with the same script dir, and rewriting the
    # file in place let an AM that had just started read it empty (python then exits 0 at once,
    # which the RM reports as an AM that ended without unregistering).
    script = script_dir / "scripted_am.py"
    write_atomic(script, SCRIPTED_AM.replace("HOOK", textwrap.dedent(hook).strip()).encode(), durable=False)
    spec = submission["am-container-spec"]
    spec["commands"]["command"] = f"python {script}"
    spec["environment"]["entry"] += [{"key": k, "value": v} for k, v in (environment or {}).items()]
    return submission


GATE_ENV = "ELASTANE_TEST_GATE"


def throttle_until_gate(seconds: float) -> str:
    """A hook that makes each BSP clock `seconds` longer until the gate file (its path in the AM's
    `GATE_ENV`) exists: a job then trains through what the test does (a failover) on any host,
    and the test opens the gate to let it run out."""
    return f"""
def make_hook(master, am):
    gate = Path(os.environ["{GATE_ENV}"])

    def hook():
        if not gate.exists():
            time.sleep({seconds})
    return hook
"""
