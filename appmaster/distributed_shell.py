"""Distributed shell: run one shell command in N containers (YARN's DistributedShell, simplified).

As the AM (inside the AM container the RM launched):

    python -m appmaster.distributed_shell --num-containers N --container-memory MB \
        --container-vcores V [--queue Q] -- CMD ARGS...

It asks for N containers of that size, runs `shlex.join(CMD ARGS...)` in each, and unregisters
SUCCEEDED when every container exits 0, FAILED otherwise with diagnostics naming each failed
container and its exit status ("container_..._000002 exited with -104 (KILLED_EXCEEDED_PMEM)").
There are no retries: a container lost with its node (-100) or one whose launch failed (-1000)
counts as failed. On SIGTERM or the RM's SHUTDOWN it stops its containers and exits without
unregistering (the RM already decided the app's fate).

As a client library: `build_submission(...)` returns the YARN REST submission context that runs it.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import shlex
import signal
import socket
import sys
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from protocol import daemon
from protocol.internal_api import LaunchContext
from protocol.records import ExitStatus, FinalStatus, Resource

from .am_client import ApplicationMaster
from .am_events import ContainersAllocated, ContainersCompleted, NodesUpdated, Shutdown
from .container_book import AmContainer
from .rm_client import AmEnvironmentError

log = logging.getLogger("appmaster.distributed_shell")

APPLICATION_TYPE = "DISTRIBUTED_SHELL"
EXIT_KILLED = 143          # what a shell reports for SIGTERM; the attempt's fate is already decided


@dataclass
class ShellResult:
    """How the distributed shell ended."""

    final_status: Optional[FinalStatus]     # None: killed / shut down, did not unregister
    diagnostics: str
    exit_statuses: dict[str, int] = field(default_factory=dict)


class DistributedShell:
    """The AM logic: ask, launch the command everywhere, collect exit statuses, decide."""

    def __init__(self, am: ApplicationMaster, num_containers: int, resource: Resource, command: Sequence[str],
                 environment: dict[str, str] | None = None):
        if num_containers <= 0:
            raise ValueError(f"--num-containers must be positive, got {num_containers}")
        if not command:
            raise ValueError("no command given after --")
        self.am = am
        self.num_containers = num_containers
        self.resource = resource
        self.command = shlex.join(command)
        self.environment = dict(environment or {})
        self.results: dict[str, AmContainer] = {}
        self._launched = 0
        self.stop_requested = asyncio.Event()

    def request_stop(self) -> None:
        """SIGTERM: stop containers and exit without unregistering."""
        self.stop_requested.set()

    async def run(self) -> ShellResult:
        await self.am.register(host=socket.gethostname(), port=-1, tracking_url="")
        self.am.add_ask(self.num_containers, self.resource, tag="shell")
        stop_wait = asyncio.create_task(self.stop_requested.wait())
        try:
            while len(self.results) < self.num_containers:
                ev_task = asyncio.create_task(self.am.next_event())
                done, _ = await asyncio.wait({ev_task, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
                if stop_wait in done:
                    ev_task.cancel()
                    await self._stop_everything()
                    return ShellResult(None, "stopped by SIGTERM", self._statuses())
                ev = ev_task.result()
                if isinstance(ev, ContainersAllocated):
                    await self._launch(ev.containers)
                elif isinstance(ev, ContainersCompleted):
                    self._record(ev.containers)
                elif isinstance(ev, NodesUpdated):
                    for n in ev.nodes:
                        log.info("node %s is now %s", n.node_id, n.state)
                elif isinstance(ev, Shutdown):
                    await self._stop_everything()
                    return ShellResult(None, ev.reason, self._statuses())
                self.am.set_progress(len(self.results) / self.num_containers)
        finally:
            stop_wait.cancel()
        failed = [c for c in self.results.values() if c.exit_status != ExitStatus.SUCCESS]
        if not failed:
            diag = f"all {self.num_containers} containers exited 0"
            status = FinalStatus.SUCCEEDED
        else:
            diag = "; ".join(_describe(c) for c in sorted(failed, key=lambda c: c.container_id))
            status = FinalStatus.FAILED
        await self.am.finish(status, diag)
        return ShellResult(status, diag, self._statuses())

    async def _launch(self, containers: list[AmContainer]) -> None:
        to_launch = []
        for c in containers:
            if self._launched < self.num_containers:
                self._launched += 1
                to_launch.append(c)
            else:
                self.am.release(c)
        ctx = LaunchContext(commands=[self.command], environment=self.environment)
        results = await asyncio.gather(*(self.am.launch(c, ctx) for c in to_launch))
        for c, ok in zip(to_launch, results):
            log.info("launched %s on %s: %s", c.container_id, c.node_id, "ok" if ok else c.diagnostics)

    def _record(self, containers: list[AmContainer]) -> None:
        for c in containers:
            self.results[c.container_id] = c
            log.info("%s", _describe(c) + (f": {c.diagnostics}" if c.diagnostics else ""))

    async def _stop_everything(self) -> None:
        try:
            async with asyncio.timeout(15.0):
                await self.am.stop_all()
        except asyncio.TimeoutError:
            log.warning("stopping containers timed out")

    def _statuses(self) -> dict[str, int]:
        return {cid: c.exit_status for cid, c in self.results.items()}


def _describe(c: AmContainer) -> str:
    return c.describe_exit()


# ----- submission (client side) --------------------------------------------------------------

def am_command(cmd: Sequence[str], num_containers: int, memory: int, vcores: int, queue: str = "default") -> str:
    """The AM container's command line that runs `cmd` in `num_containers` containers."""
    args = ["python", "-m", "appmaster.distributed_shell", "--num-containers", str(num_containers),
            "--container-memory", str(memory), "--container-vcores", str(vcores), "--queue", queue, "--"]
    return shlex.join(args + list(cmd))


def build_submission(name: str, cmd: Sequence[str], num_containers: int, memory: int, vcores: int,
                     queue: str = "default", am_memory: int = 128, am_vcores: int = 1,
                     max_app_attempts: int = 1, app_id: str | None = None,
                     environment: dict[str, str] | None = None) -> dict[str, Any]:
    """YARN REST application-submission-context (POST /ws/v1/cluster/apps) for a distributed shell.

    `app_id` comes from POST /ws/v1/cluster/apps/new-application; if None, set
    `"application-id"` before submitting.
    """
    for label, v in (("num_containers", num_containers), ("memory", memory), ("vcores", vcores),
                     ("am_memory", am_memory), ("am_vcores", am_vcores), ("max_app_attempts", max_app_attempts)):
        if v <= 0:
            raise ValueError(f"{label} must be positive, got {v}")
    if not cmd:
        raise ValueError("cmd must not be empty")
    env = {"PYTHONUNBUFFERED": "1", **(environment or {})}
    sub: dict[str, Any] = {
        "application-name": name,
        "application-type": APPLICATION_TYPE,
        "queue": queue,
        "priority": 0,
        "am-container-spec": {
            "commands": {"command": am_command(cmd, num_containers, memory, vcores, queue)},
            "environment": {"entry": [{"key": k, "value": v} for k, v in env.items()]},
        },
        "unmanaged-AM": False,
        "max-app-attempts": max_app_attempts,
        "resource": {"memory": am_memory, "vCores": am_vcores},
        "keep-containers-across-application-attempts": False,
    }
    if app_id is not None:
        sub = {"application-id": app_id, **sub}
    return sub


# ----- entry point ---------------------------------------------------------------------------

def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m appmaster.distributed_shell",
                                description="Distributed shell ApplicationMaster: run CMD in N containers.")
    p.add_argument("--num-containers", type=int, required=True)
    p.add_argument("--container-memory", type=int, required=True, help="MB per container")
    p.add_argument("--container-vcores", type=int, default=1)
    p.add_argument("--queue", default="default", help="the app's queue (informational inside the AM)")
    p.add_argument("--env", action="append", default=[], metavar="K=V", help="extra container env")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    ns = p.parse_args(list(argv))
    if ns.command and ns.command[0] == "--":
        ns.command = ns.command[1:]
    if not ns.command:
        p.error("no command given (put it after --)")
    for label, v in (("--num-containers", ns.num_containers), ("--container-memory", ns.container_memory),
                     ("--container-vcores", ns.container_vcores)):
        if v <= 0:
            p.error(f"{label} must be positive, got {v}")
    for kv in ns.env:
        if "=" not in kv:
            p.error(f"--env expects K=V, got {kv!r}")
    return ns


async def _amain(ns: argparse.Namespace) -> int:
    env = dict(kv.split("=", 1) for kv in ns.env)
    am = ApplicationMaster.from_env()
    shell = DistributedShell(am, ns.num_containers, Resource(ns.container_memory, ns.container_vcores),
                             ns.command, env)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, shell.request_stop)
    try:
        result = await shell.run()
    except Exception:   # e.g. registration refused: exit non-zero so the RM fails the attempt
        log.exception("distributed shell failed")
        return 1
    finally:
        await am.close()
    log.info("distributed shell ended: %s: %s", result.final_status.value if result.final_status else "stopped",
             result.diagnostics)
    if result.final_status is None:
        return EXIT_KILLED
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ns = parse_args(sys.argv[1:] if argv is None else argv)
    daemon.setup_logging("distributed-shell")
    daemon.install_uvloop()
    try:
        return asyncio.run(_amain(ns))
    except AmEnvironmentError as e:
        print(f"distributed_shell: {e} (submit it with build_submission / `elastane app run`)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
