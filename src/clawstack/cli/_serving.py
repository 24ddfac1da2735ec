"""Running a service in the foreground: start it, print one readiness line, stop cleanly on SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Awaitable, Callable

import click


def configure_logging(level: str) -> None:
    """Log to stderr; stdout carries only the readiness line."""
    logging.basicConfig(
        level=level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


async def serve_until_signal(
    start: Callable[[], Awaitable[str]], stop: Callable[[], Awaitable[None]], *, name: str
) -> None:
    """Await ``start()`` (which returns the readiness line), print that line, wait for a signal, ``stop()``."""
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    try:
        try:
            ready = await start()
            click.echo(ready)
            sys.stdout.flush()
            await stopping.wait()
            logging.getLogger(name).info("stopping on signal")
        finally:
            await stop()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
