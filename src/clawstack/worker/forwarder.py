"""The task-home forwarder: relays a worker's TCP connections to the proxy's worker API and nowhere else.

Hermes speaks HTTP over TCP to a base URL; the proxy's worker API is a Unix socket (local backend) or a TCP
address on the pod's network (compose). The forwarder listens on one address and relays every connection, byte
for byte, to its one fixed target: it parses nothing, so it can reach nothing else. Under the local backend it
runs in the worker's sandbox, whose network namespace has only loopback, so it is the only route out.

``python -m clawstack.worker.forwarder --listen HOST:PORT --to unix:PATH|HOST:PORT`` runs it on its own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Sequence
from typing import Final

BUFFER_BYTES: Final = 64 * 1024


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(BUFFER_BYTES):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


class Forwarder:
    """Relays connections accepted on ``listen`` (host, port) to ``target``: ``unix:PATH`` or ``HOST:PORT``."""

    def __init__(self, target: str) -> None:
        if target.startswith("unix:"):
            self._unix: str | None = target[len("unix:") :]
            self._tcp: tuple[str, int] | None = None
        else:
            host, _, port = target.rpartition(":")
            self._unix, self._tcp = None, (host, int(port))
        self._server: asyncio.Server | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen; returns the port."""
        self._server = await asyncio.start_server(self._relay, host, port)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            if self._unix is not None:
                upstream_r, upstream_w = await asyncio.open_unix_connection(self._unix)
            else:
                assert self._tcp is not None
                upstream_r, upstream_w = await asyncio.open_connection(*self._tcp)
        except OSError:
            client_w.close()
            return
        try:
            await asyncio.gather(_pump(client_r, upstream_w), _pump(upstream_r, client_w))
        finally:
            for writer in (upstream_w, client_w):
                writer.close()


def _address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError("expected HOST:PORT")
    return host, int(port)


async def _serve(listen: tuple[str, int], target: str) -> None:
    forwarder = Forwarder(target)
    port = await forwarder.start(*listen)
    print(f"forwarder listening on {listen[0]}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await forwarder.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clawstack.worker.forwarder")
    parser.add_argument("--listen", type=_address, required=True)
    parser.add_argument("--to", required=True, help="unix:PATH or HOST:PORT")
    args = parser.parse_args(argv)
    if not args.to.startswith("unix:"):
        try:
            _address(args.to)
        except argparse.ArgumentTypeError:
            parser.error("--to: expected unix:PATH or HOST:PORT")
    asyncio.run(_serve(args.listen, args.to))
    return 0


if __name__ == "__main__":
    sys.exit(main())
