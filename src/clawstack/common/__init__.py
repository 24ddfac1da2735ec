"""The shared kernel: strict JSON and the spec digest, private files and trusted directories, HTTP over Unix
sockets with peer credentials, clocks and identifiers. It imports nothing else from clawstack.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from clawstack.common.clock import Clock, ManualClock, SystemClock, format_timestamp, parse_timestamp
from clawstack.common.digest import DigestError, canonical_json, sha256_digest, spec_digest
from clawstack.common.errors import ClawError
from clawstack.common.files import (
    UnsafePathError,
    check_trusted_dir,
    ensure_private_dir,
    fsync_dir,
    read_private,
    write_private,
)
from clawstack.common.ids import new_id, new_secret, new_uuid, secrets_equal
from clawstack.common.strictjson import SpecValue, StrictJSONError, check_spec, loads, loads_spec

if _TYPE_CHECKING:
    from clawstack.common.uds import (
        AsyncUnixClient,
        PeerCredentialError,
        PeerCredentials,
        SocketUnavailableError,
        UnixResponse,
        UnixSocketServer,
        UnixSocketTransport,
        peer_credentials,
        remove_stale_socket,
        request_peer,
        sync_client,
        verify_socket,
    )

#: The names of the Unix-socket HTTP part, imported on first use: it pulls in aiohttp and httpx, which a process
#: that never speaks HTTP over a Unix socket (the gateway) should not pay for at start-up.
_UDS_NAMES = frozenset(
    {
        "AsyncUnixClient",
        "PeerCredentialError",
        "PeerCredentials",
        "SocketUnavailableError",
        "UnixResponse",
        "UnixSocketServer",
        "UnixSocketTransport",
        "peer_credentials",
        "remove_stale_socket",
        "request_peer",
        "sync_client",
        "verify_socket",
    }
)


def __getattr__(name: str) -> object:
    if name in _UDS_NAMES:
        from clawstack.common import uds

        return getattr(uds, name)
    raise AttributeError(f"module 'clawstack.common' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_UDS_NAMES})


__all__ = [
    "AsyncUnixClient",
    "ClawError",
    "Clock",
    "DigestError",
    "ManualClock",
    "PeerCredentialError",
    "PeerCredentials",
    "SocketUnavailableError",
    "SpecValue",
    "StrictJSONError",
    "SystemClock",
    "UnixResponse",
    "UnixSocketServer",
    "UnixSocketTransport",
    "UnsafePathError",
    "canonical_json",
    "check_spec",
    "check_trusted_dir",
    "ensure_private_dir",
    "format_timestamp",
    "fsync_dir",
    "loads",
    "loads_spec",
    "new_id",
    "new_secret",
    "new_uuid",
    "parse_timestamp",
    "peer_credentials",
    "read_private",
    "remove_stale_socket",
    "request_peer",
    "secrets_equal",
    "sha256_digest",
    "spec_digest",
    "sync_client",
    "verify_socket",
    "write_private",
]
