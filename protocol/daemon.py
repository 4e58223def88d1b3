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
    """Run `start()`, then wait for SIGTERM/SIGINT and run `stop()` before returning."""
    install_uvloop()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stopped = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopped.set)
        await start()
        await stopped.wait()
        await stop()

    asyncio.run(main())
