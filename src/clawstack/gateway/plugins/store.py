"""``api.store``: a small durable key-value space per plugin id, in one SQLite file.

One :class:`PluginStore` owns one database file (WAL, ``synchronous=FULL``) and is its only writer: opening takes
an exclusive lock on ``<file>.lock``, so a second store on the same file is refused. It holds every plugin's
entries, keyed by plugin id, so an entry survives a gateway restart and a reload of the plugin (the new instance
has the same id). Its methods block; the per-plugin :class:`PluginStoreSpace` (``api.store``) runs them in a
thread (``asyncio.to_thread``) and is what plugins use::

    await api.store.set("review:pending", ["run-1", "run-2"])
    pending = await api.store.get("review:pending", default=[])
    await api.store.delete("review:pending")            # True if it existed
    names = await api.store.keys(prefix="review:")      # sorted, at most MAX_KEYS

Rules, each refused with a stable code and nothing changed:

* a key is a non-empty string of at most :data:`MAX_KEY_CHARS` (256) characters, without lone surrogates
  (``plugin_store_key_invalid``);
* a value is a JSON value: ``None``, ``bool``, ``int`` within ±(2**53 - 1), finite ``float``, ``str``, ``list``
  and ``dict`` with string keys, nested at most 32 deep (``plugin_store_value_invalid``); what ``get`` returns is
  a fresh copy, so changing it changes nothing stored;
* the quota per plugin (``plugin_store_quota_exceeded``, with ``quota`` naming which): one value at most
  :data:`MAX_VALUE_BYTES` (64 KiB) of UTF-8 JSON, at most :data:`MAX_KEYS` (1000) keys, and at most
  :data:`MAX_PLUGIN_BYTES` (1 MiB) in all, counting each entry as the UTF-8 bytes of its key plus its value.

Every method of a space rechecks the plugin's lifetime: a retired api raises
:class:`~clawstack.gateway.plugins.api.PluginRetiredError` before anything is read or written, a write whose
plugin was retired while it waited for the database is rolled back, and a read whose plugin was retired while it
read is not returned. A write is committed (on disk) before its method returns.

Errors (all :class:`~clawstack.gateway.plugins.api.PluginError`)::

    PluginError
     └── PluginStoreError                   plugin_store_error
          ├── PluginStoreUnavailableError   plugin_store_unavailable  no store wired, closed, or the file failed
          ├── PluginStoreKeyError           plugin_store_key_invalid
          ├── PluginStoreValueError         plugin_store_value_invalid
          └── PluginStoreQuotaError         plugin_store_quota_exceeded  quota: value_bytes | keys | total_bytes
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sqlite3
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal

from clawstack.common.files import UnsafePathError
from clawstack.common.sqlite import DatabaseError, DatabaseLockedError, WriterDatabase
from clawstack.gateway.plugins.api import PluginError, PluginLifetime

__all__ = [
    "MAX_KEYS",
    "MAX_KEY_CHARS",
    "MAX_PLUGIN_BYTES",
    "MAX_VALUE_BYTES",
    "PLUGIN_STORE",
    "PLUGIN_STORE_FILE",
    "PluginStore",
    "PluginStoreError",
    "PluginStoreKeyError",
    "PluginStoreQuotaError",
    "PluginStoreSpace",
    "PluginStoreUnavailableError",
    "PluginStoreValueError",
    "StoreQuota",
    "StoreUsage",
    "encode_json_value",
]

#: The capability string advertised when ``api.store`` is wired.
PLUGIN_STORE: Final = "store"

#: The database's file name inside the gateway's data directory.
PLUGIN_STORE_FILE: Final = "plugin-store.sqlite3"

#: The longest key, in characters.
MAX_KEY_CHARS: Final = 256

#: The largest value, in bytes of its UTF-8 JSON.
MAX_VALUE_BYTES: Final = 64 * 1024

#: The most keys one plugin may hold (``keys()`` therefore returns at most this many).
MAX_KEYS: Final = 1000

#: The most bytes one plugin may hold: the UTF-8 bytes of every key plus its value.
MAX_PLUGIN_BYTES: Final = 1024 * 1024

_MAX_SAFE_INTEGER: Final = 2**53 - 1
_MAX_DEPTH: Final = 32
_SCHEMA_VERSION: Final = 1
_SCHEMA: Final = (
    """
    CREATE TABLE IF NOT EXISTS entries (
        plugin_id TEXT NOT NULL,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        size INTEGER NOT NULL,
        PRIMARY KEY (plugin_id, key)
    ) WITHOUT ROWID
    """,
)

StoreQuota = Literal["value_bytes", "keys", "total_bytes"]


class PluginStoreError(PluginError):
    """Root of the ``api.store`` errors."""

    code = "plugin_store_error"


class PluginStoreUnavailableError(PluginStoreError):
    """This gateway keeps no plugin store, the store is closed, or its database cannot be used."""

    code = "plugin_store_unavailable"


class PluginStoreKeyError(PluginStoreError):
    """A key is not a non-empty string of at most 256 characters."""

    code = "plugin_store_key_invalid"


class PluginStoreValueError(PluginStoreError):
    """A value is not a JSON value (see the module docstring)."""

    code = "plugin_store_value_invalid"


class PluginStoreQuotaError(PluginStoreError):
    """A write would exceed the plugin's quota; ``quota`` is ``value_bytes``, ``keys`` or ``total_bytes``."""

    code = "plugin_store_quota_exceeded"

    def __init__(self, message: str, *, quota: StoreQuota) -> None:
        super().__init__(message)
        self.quota: StoreQuota = quota


@dataclass(frozen=True, slots=True)
class StoreUsage:
    """What one plugin holds: how many keys and how many bytes (keys plus values, UTF-8)."""

    keys: int
    bytes: int


def _json_problem(value: object, depth: int) -> str | None:
    if depth > _MAX_DEPTH:
        return f"nested deeper than {_MAX_DEPTH} levels"
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if -_MAX_SAFE_INTEGER <= value <= _MAX_SAFE_INTEGER else "holds an integer beyond ±(2**53 - 1)"
    if isinstance(value, float):
        return None if math.isfinite(value) else "holds NaN or an infinity"
    if isinstance(value, str):
        return None if _encodable(value) else "holds a string with a lone surrogate"
    if isinstance(value, list):
        for item in value:
            problem = _json_problem(item, depth + 1)
            if problem is not None:
                return problem
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return "holds an object key that is not a string"
            if not _encodable(key):
                return "holds an object key with a lone surrogate"
            problem = _json_problem(item, depth + 1)
            if problem is not None:
                return problem
        return None
    return f"holds a value of type {type(value).__name__}, which is not a JSON value"


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def encode_json_value(value: object) -> str:
    """``value`` as compact JSON text; :class:`ValueError` saying why when it is not a JSON value.

    A JSON value is ``None``, ``bool``, ``int`` within ±(2**53 - 1), finite ``float``, ``str``, ``list`` and
    ``dict`` with string keys, nested at most 32 deep, without lone surrogates.
    """
    problem = _json_problem(value, 0)
    if problem is not None:
        raise ValueError(problem)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _check_key(key: object) -> str:
    if not isinstance(key, str) or not key:
        raise PluginStoreKeyError("a store key must be a non-empty string")
    if len(key) > MAX_KEY_CHARS:
        raise PluginStoreKeyError(f"a store key may have at most {MAX_KEY_CHARS} characters")
    if not _encodable(key):
        raise PluginStoreKeyError("a store key may not hold a lone surrogate")
    return key


def _check_prefix(prefix: object) -> str:
    if not isinstance(prefix, str) or len(prefix) > MAX_KEY_CHARS or not _encodable(prefix):
        raise PluginStoreKeyError(f"a key prefix must be a string of at most {MAX_KEY_CHARS} characters")
    return prefix


class PluginStore:
    """Every plugin's entries in one SQLite file, with this object as its only writer (see the module docstring).

    The database is opened by :meth:`open` or, failing that, by the first use; :meth:`close` ends the store for
    good (later uses raise :class:`PluginStoreUnavailableError`). The file is created mode 0600 in a directory
    made mode 0700. Methods block and may be called from several threads.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._database = WriterDatabase(self.path, _SCHEMA, _SCHEMA_VERSION, what="plugin store")
        self._closed = False
        self._mutex = threading.RLock()

    def open(self) -> None:
        """Lock, create or open the database (idempotent); :class:`PluginStoreUnavailableError` if it cannot."""
        with self._mutex:
            self._ensure_open()

    def close(self) -> None:
        """Close the database and release the lock, for good. Idempotent."""
        with self._mutex:
            self._closed = True
            self._database.close()

    def __enter__(self) -> PluginStore:
        self.open()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _ensure_open(self) -> None:
        if self._closed:
            raise PluginStoreUnavailableError("the plugin store is closed")
        try:
            self._database.open()
        except DatabaseLockedError as exc:
            raise PluginStoreUnavailableError("another gateway holds the plugin store") from exc
        except (DatabaseError, UnsafePathError, OSError) as exc:
            raise PluginStoreUnavailableError(f"the plugin store cannot be used: {exc}") from exc

    @contextlib.contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._mutex:
            self._ensure_open()
            try:
                with self._database.read() as db:
                    yield db
            except DatabaseError as exc:
                raise PluginStoreUnavailableError(str(exc)) from exc

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._mutex:
            self._ensure_open()
            try:
                with self._database.write() as db:
                    yield db
            except DatabaseError as exc:
                raise PluginStoreUnavailableError(str(exc)) from exc

    def get(self, plugin_id: str, key: str) -> str | None:
        """The JSON text stored under ``key`` for ``plugin_id``, or ``None``."""
        with self._read() as db:
            row = db.execute("SELECT value FROM entries WHERE plugin_id=? AND key=?", (plugin_id, key)).fetchone()
        return None if row is None else str(row[0])

    def set(self, plugin_id: str, key: str, text: str, *, check: Callable[[], None] | None = None) -> None:
        """Store the JSON ``text`` under ``key`` within the quota; ``check()`` runs just before the commit."""
        value_bytes = len(text.encode("utf-8"))
        if value_bytes > MAX_VALUE_BYTES:
            raise PluginStoreQuotaError(
                f"a store value may be at most {MAX_VALUE_BYTES} bytes of JSON (this one is {value_bytes})",
                quota="value_bytes",
            )
        size = len(key.encode("utf-8")) + value_bytes
        with self._write() as db:
            count, total = db.execute(
                "SELECT count(*), coalesce(sum(size), 0) FROM entries WHERE plugin_id=?", (plugin_id,)
            ).fetchone()
            old = db.execute("SELECT size FROM entries WHERE plugin_id=? AND key=?", (plugin_id, key)).fetchone()
            if old is None and count >= MAX_KEYS:
                raise PluginStoreQuotaError(f"plugin {plugin_id!r} already holds {MAX_KEYS} keys", quota="keys")
            after = total - (0 if old is None else old[0]) + size
            if after > MAX_PLUGIN_BYTES:
                raise PluginStoreQuotaError(
                    f"plugin {plugin_id!r} may hold at most {MAX_PLUGIN_BYTES} bytes (this write would make {after})",
                    quota="total_bytes",
                )
            db.execute(
                "INSERT INTO entries (plugin_id, key, value, size) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (plugin_id, key) DO UPDATE SET value=excluded.value, size=excluded.size",
                (plugin_id, key, text, size),
            )
            if check is not None:
                check()

    def delete(self, plugin_id: str, key: str, *, check: Callable[[], None] | None = None) -> bool:
        """Remove ``key``; ``True`` if it existed. ``check()`` runs just before the commit."""
        with self._write() as db:
            removed = db.execute("DELETE FROM entries WHERE plugin_id=? AND key=?", (plugin_id, key)).rowcount > 0
            if check is not None:
                check()
        return removed

    def keys(self, plugin_id: str, prefix: str = "") -> tuple[str, ...]:
        """The keys of ``plugin_id`` that start with ``prefix``, in code-point order (at most :data:`MAX_KEYS`)."""
        with self._read() as db:
            rows = db.execute(
                "SELECT key FROM entries WHERE plugin_id=? AND substr(key, 1, ?)=? ORDER BY key LIMIT ?",
                (plugin_id, len(prefix), prefix, MAX_KEYS),
            ).fetchall()
        return tuple(str(row[0]) for row in rows)

    def usage(self, plugin_id: str) -> StoreUsage:
        """How many keys and bytes ``plugin_id`` holds."""
        with self._read() as db:
            count, total = db.execute(
                "SELECT count(*), coalesce(sum(size), 0) FROM entries WHERE plugin_id=?", (plugin_id,)
            ).fetchone()
        return StoreUsage(int(count), int(total))


class PluginStoreSpace:
    """``api.store``: one plugin instance's view of its entries (see the module docstring)."""

    def __init__(self, store: PluginStore, plugin_id: str, lifetime: PluginLifetime) -> None:
        self._store = store
        self._plugin_id = plugin_id
        self._lifetime = lifetime

    def __repr__(self) -> str:
        return f"PluginStoreSpace(plugin_id={self._plugin_id!r})"

    async def get(self, key: str, default: Any = None) -> Any:
        """The value stored under ``key`` (a fresh copy), or ``default``."""
        self._lifetime.check()
        key = _check_key(key)
        text = await asyncio.to_thread(self._store.get, self._plugin_id, key)
        self._lifetime.check()
        return default if text is None else json.loads(text)

    async def set(self, key: str, value: Any) -> None:
        """Store ``value`` under ``key``, replacing what was there; committed when this returns."""
        self._lifetime.check()
        key = _check_key(key)
        try:
            text = encode_json_value(value)
        except ValueError as exc:
            raise PluginStoreValueError(f"the value for this key is not a JSON value: it {exc}") from None
        await asyncio.to_thread(self._store.set, self._plugin_id, key, text, check=self._lifetime.check)

    async def delete(self, key: str) -> bool:
        """Remove ``key``; ``True`` if it existed."""
        self._lifetime.check()
        key = _check_key(key)
        return await asyncio.to_thread(self._store.delete, self._plugin_id, key, check=self._lifetime.check)

    async def keys(self, prefix: str = "") -> tuple[str, ...]:
        """The keys starting with ``prefix``, in code-point order; never more than :data:`MAX_KEYS`."""
        self._lifetime.check()
        prefix = _check_prefix(prefix)
        keys = await asyncio.to_thread(self._store.keys, self._plugin_id, prefix)
        self._lifetime.check()
        return keys

    async def usage(self) -> StoreUsage:
        """How much of the quota this plugin uses: keys and bytes."""
        self._lifetime.check()
        usage = await asyncio.to_thread(self._store.usage, self._plugin_id)
        self._lifetime.check()
        return usage
