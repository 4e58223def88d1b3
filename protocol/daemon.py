"""Run an asyncio daemon under uvloop with clean shutdown on SIGTERM / SIGINT."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from typing import Awaitable, Callable


def install_uvloop() -> None:
    try:
        import uvloop  # noqa: PLC0415
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:  # uvloop is optional (e.g. on platforms without it)
        pass


def setup_logging(name: str, level: str | None = None) -> None:
    logging.basicConfig(
        level=getattr(logging, (level or os.environ.get("ELASTANE_LOG_LEVEL", "INFO")).upper()),
        format=f"%(asctime)s {name}[%(process)d] %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def run_daemon(start: Callable[[], Awaitable[object]], stop: Callable[[], Awaitable[None]]) -> None:
    """Run `start()`, then wait for SIGTERM/SIGINT and run `stop()` before returning. A `start()`
    that fails half-way is undone by `stop()` (what it made -- cgroups, pools, servers -- goes as
    on a SIGTERM), then its error ends the daemon."""
    install_uvloop()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stopped = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopped.set)
        try:
            await start()
        except BaseException:
            try:
                await stop()
            except Exception:   # noqa: BLE001 - the start's error is the one to report
                logging.getLogger(__name__).exception("stopping after a failed start failed too")
            raise
        await stopped.wait()
        await stop()

    asyncio.run(main())
