"""Tests for ``api.store`` (clawstack.gateway.plugins.store): durability, quota, bad input and the plugin lifetime.

Plugins are real directories loaded by a real :class:`PluginLoader` over a real :class:`PluginStore` (one SQLite
file under ``tmp_path``); a restart is a new store object and a new loader on the same file, a crash is a child
process killed with SIGKILL right after its write returned.
"""

from __future__ import annotations

import math
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawstack.gateway.plugins import (
    PLUGIN_STORE,
    CommandContext,
    PluginApi,
    PluginLoader,
    PluginRetiredError,
    PluginStore,
    PluginStoreKeyError,
    PluginStoreQuotaError,
    PluginStoreUnavailableError,
    PluginStoreValueError,
)
from clawstack.gateway.plugins.store import MAX_KEYS, MAX_PLUGIN_BYTES, MAX_VALUE_BYTES, encode_json_value
from tests.unit.gateway.test_plugins import EXAMPLES, loaded, make_config, write_plugin

QUIET = "def register(api):\n    pass\n"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[PluginStore]:
    with PluginStore(tmp_path / "data" / "plugin-store.sqlite3") as opened:
        yield opened


def load(tmp_path: Path, store: PluginStore | None, *plugin_ids: str) -> tuple[PluginLoader, list[PluginApi]]:
    for plugin_id in plugin_ids:
        if not (tmp_path / "plugins" / plugin_id).exists():
            write_plugin(tmp_path / "plugins", plugin_id, QUIET)
    loader = PluginLoader(make_config(tmp_path), search_paths=[tmp_path / "plugins"], store=store)
    loader.load()
    return loader, [loaded(loader, p)[1] for p in plugin_ids]


async def test_set_get_delete_keys_and_usage(tmp_path: Path, store: PluginStore) -> None:
    _, (api,) = load(tmp_path, store, "demo")
    assert await api.store.get("missing") is None
    assert await api.store.get("missing", default={"d": 1}) == {"d": 1}
    value = {"ids": ["run-1", "run-2"], "n": 2, "ok": True, "ratio": 0.5, "none": None, "text": "é✓"}
    await api.store.set("review:pending", value)
    await api.store.set("review:done", [])
    await api.store.set("other", "x")
    assert await api.store.get("review:pending") == value
    assert await api.store.keys() == ("other", "review:done", "review:pending")
    assert await api.store.keys(prefix="review:") == ("review:done", "review:pending")
    assert await api.store.keys(prefix="nothing") == ()

    copy = await api.store.get("review:pending")
    copy["ids"].append("changed")
    assert await api.store.get("review:pending") == value  # a fresh copy each time

    await api.store.set("other", {"replaced": True})
    assert await api.store.get("other") == {"replaced": True}
    usage = await api.store.usage()
    assert usage.keys == 3
    expected = sum(
        len(k.encode()) + len(encode_json_value(v).encode())
        for k, v in (("review:pending", value), ("review:done", []), ("other", {"replaced": True}))
    )
    assert usage.bytes == expected

    assert await api.store.delete("other") is True
    assert await api.store.delete("other") is False
    assert await api.store.get("other") is None
    assert await api.store.keys() == ("review:done", "review:pending")


async def test_keys_are_in_code_point_order_and_prefixes_are_exact(tmp_path: Path, store: PluginStore) -> None:
    _, (api,) = load(tmp_path, store, "demo")
    for key in ("b", "a", "é", "A", "a%", "a_", "ab", "😀"):
        await api.store.set(key, 1)
    assert await api.store.keys() == tuple(sorted(["b", "a", "é", "A", "a%", "a_", "ab", "😀"]))
    assert await api.store.keys(prefix="a") == ("a", "a%", "a_", "ab")
    assert await api.store.keys(prefix="a_") == ("a_",)  # no LIKE wildcards
    assert await api.store.keys(prefix="a%") == ("a%",)


async def test_each_plugin_has_its_own_space(tmp_path: Path, store: PluginStore) -> None:
    _, (one, two) = load(tmp_path, store, "one", "two")
    await one.store.set("shared-name", "one's")
    assert await two.store.get("shared-name") is None
    await two.store.set("shared-name", "two's")
    assert await one.store.get("shared-name") == "one's"
    assert await one.store.keys() == ("shared-name",)
    assert await two.store.delete("shared-name") is True
    assert await one.store.get("shared-name") == "one's"


async def test_entries_survive_a_restart_on_the_same_file(tmp_path: Path) -> None:
    path = tmp_path / "data" / "plugin-store.sqlite3"
    with PluginStore(path) as first:
        _, (api,) = load(tmp_path, first, "demo")
        await api.store.set("kept", {"runIds": ["a"]})
    with PluginStore(path) as second:
        _, (api,) = load(tmp_path, second, "demo")
        assert await api.store.get("kept") == {"runIds": ["a"]}
        assert await api.store.keys() == ("kept",)


async def test_entries_survive_a_reload_and_the_old_api_is_refused(tmp_path: Path, store: PluginStore) -> None:
    loader, (old,) = load(tmp_path, store, "demo")
    await old.store.set("kept", 1)
    space = old.store
    loader.reload("demo")
    _, new = loaded(loader, "demo")
    assert await new.store.get("kept") == 1
    with pytest.raises(PluginRetiredError):
        _ = old.store
    for use in (
        space.get("kept"),
        space.set("kept", 2),
        space.delete("kept"),
        space.keys(),
        space.usage(),
    ):
        with pytest.raises(PluginRetiredError) as caught:
            await use
        assert caught.value.code == "plugin_retired"
    assert await new.store.get("kept") == 1  # the retired api changed nothing


def test_a_write_whose_plugin_is_retired_before_the_commit_is_rolled_back(store: PluginStore) -> None:
    def retired() -> None:
        raise PluginRetiredError("retired while waiting")

    with pytest.raises(PluginRetiredError):
        store.set("demo", "k", '"v"', check=retired)
    assert store.get("demo", "k") is None
    store.set("demo", "k", '"v"')
    with pytest.raises(PluginRetiredError):
        store.delete("demo", "k", check=retired)
    assert store.get("demo", "k") == '"v"'


def test_a_write_is_on_disk_when_it_returns(tmp_path: Path) -> None:
    """A child process sets a key, says so, and is SIGKILLed at once; the entry is there afterwards."""
    path = tmp_path / "data" / "plugin-store.sqlite3"
    code = textwrap.dedent(
        f"""
        import os, signal, sys
        from pathlib import Path
        from clawstack.gateway.plugins import PluginStore
        store = PluginStore(Path({str(path)!r}))
        store.set("demo", "key", '{{"written": true}}')
        sys.stdout.write("written\\n")
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.stdout == "written\n", proc.stderr
    assert proc.returncode == -signal.SIGKILL
    with PluginStore(path) as reopened:
        assert reopened.get("demo", "key") == '{"written": true}'


def test_the_file_is_private_in_wal_with_full_sync(tmp_path: Path, store: PluginStore) -> None:
    store.set("demo", "k", "1")
    assert stat.S_IMODE(os.stat(store.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(store.path.parent).st_mode) == 0o700
    db = sqlite3.connect(store.path)
    try:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        db.close()


def test_one_writer_and_a_closed_store_is_unavailable(tmp_path: Path, store: PluginStore) -> None:
    with pytest.raises(PluginStoreUnavailableError, match="another gateway holds the plugin store") as caught:
        PluginStore(store.path).open()
    assert caught.value.code == "plugin_store_unavailable"
    store.close()
    store.close()  # idempotent
    with pytest.raises(PluginStoreUnavailableError, match="closed"):
        store.get("demo", "k")
    with PluginStore(store.path) as again:  # the lock went with the close
        assert again.keys("demo") == ()


async def test_without_a_store_api_store_is_not_available(tmp_path: Path, store: PluginStore) -> None:
    _, (without,) = load(tmp_path, None, "demo")
    with pytest.raises(PluginStoreUnavailableError, match="keeps no plugin store") as caught:
        _ = without.store
    assert caught.value.code == "plugin_store_unavailable"
    assert PLUGIN_STORE not in without.runtime.capabilities
    _, (wired,) = load(tmp_path, store, "demo")
    assert PLUGIN_STORE in wired.runtime.capabilities


# -- quota -------------------------------------------------------------------------------------------------------


async def test_a_value_over_64_kib_is_refused(tmp_path: Path, store: PluginStore) -> None:
    _, (api,) = load(tmp_path, store, "demo")
    fits = "x" * (MAX_VALUE_BYTES - 2)  # plus the two quotes: exactly the limit
    await api.store.set("big", fits)
    with pytest.raises(PluginStoreQuotaError) as caught:
        await api.store.set("big", fits + "x")
    assert (caught.value.code, caught.value.quota) == ("plugin_store_quota_exceeded", "value_bytes")
    with pytest.raises(PluginStoreQuotaError):
        await api.store.set("big", "é" * (MAX_VALUE_BYTES // 2))  # counted in UTF-8 bytes, not characters
    assert await api.store.get("big") == fits  # unchanged


async def test_at_most_1000_keys_per_plugin(tmp_path: Path, store: PluginStore) -> None:
    _, (api, other) = load(tmp_path, store, "demo", "other")
    for index in range(MAX_KEYS):
        await api.store.set(f"k{index:04d}", index)
    with pytest.raises(PluginStoreQuotaError) as caught:
        await api.store.set("one-more", 0)
    assert caught.value.quota == "keys"
    assert await api.store.get("one-more") is None
    await api.store.set("k0000", "replaced")  # an existing key can still change
    assert len(await api.store.keys()) == MAX_KEYS  # keys() returns them all
    await other.store.set("k0000", 1)  # the quota is per plugin
    assert await api.store.delete("k0001")
    await api.store.set("one-more", 0)


async def test_at_most_1_mib_per_plugin(tmp_path: Path, store: PluginStore) -> None:
    _, (api,) = load(tmp_path, store, "demo")
    chunk = "x" * (60 * 1024)
    for index in range(17):  # 17 × (60 KiB + key + quotes) < 1 MiB < 18 × …
        await api.store.set(f"chunk{index:02d}", chunk)
    used = (await api.store.usage()).bytes
    assert used <= MAX_PLUGIN_BYTES
    with pytest.raises(PluginStoreQuotaError) as caught:
        await api.store.set("chunk17", chunk)
    assert caught.value.quota == "total_bytes"
    assert (await api.store.usage()).bytes == used
    await api.store.set("chunk00", "small")  # replacing frees what the old value used
    await api.store.set("chunk17", chunk)


# -- bad input -----------------------------------------------------------------------------------------------------

BAD_KEYS: list[tuple[str, Any]] = [
    ("empty", ""),
    ("not a string", 7),
    ("none", None),
    ("bytes", b"key"),
    ("257 characters", "k" * 257),
    ("lone surrogate", "k\ud800"),
]


@pytest.mark.parametrize("key", [k for _, k in BAD_KEYS], ids=[n for n, _ in BAD_KEYS])
async def test_bad_keys_are_refused(tmp_path: Path, store: PluginStore, key: Any) -> None:
    _, (api,) = load(tmp_path, store, "demo")
    for use in (api.store.get(key), api.store.set(key, 1), api.store.delete(key)):
        with pytest.raises(PluginStoreKeyError) as caught:
            await use
        assert caught.value.code == "plugin_store_key_invalid"
    assert await api.store.keys() == ()


async def test_a_256_character_key_is_accepted(tmp_path: Path, store: PluginStore) -> None:
    _, (api,) = load(tmp_path, store, "demo")
    await api.store.set("é" * 256, 1)
    assert await api.store.keys() == ("é" * 256,)


@pytest.mark.parametrize("prefix", [7, None, "p" * 257, "\udfff"])
async def test_bad_prefixes_are_refused(tmp_path: Path, store: PluginStore, prefix: Any) -> None:
    _, (api,) = load(tmp_path, store, "demo")
    with pytest.raises(PluginStoreKeyError):
        await api.store.keys(prefix=prefix)


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


BAD_VALUES: list[tuple[str, Any, str]] = [
    ("set", {1, 2}, "of type set"),
    ("tuple", (1, 2), "of type tuple"),
    ("bytes", b"x", "of type bytes"),
    ("object", object(), "of type object"),
    ("nan", math.nan, "NaN or an infinity"),
    ("infinity", [math.inf], "NaN or an infinity"),
    ("big integer", 2**53, "beyond"),
    ("negative big integer", {"n": -(2**53)}, "beyond"),
    ("integer key", {1: "x"}, "key that is not a string"),
    ("lone surrogate", {"t": "\ud800"}, "lone surrogate"),
    ("surrogate key", {"\ud800": 1}, "lone surrogate"),
    ("too deep", _nested(33), "deeper than 32"),
]


@pytest.mark.parametrize(("value", "why"), [(v, w) for _, v, w in BAD_VALUES], ids=[n for n, _, _ in BAD_VALUES])
async def test_bad_values_are_refused_and_change_nothing(
    tmp_path: Path, store: PluginStore, value: Any, why: str
) -> None:
    _, (api,) = load(tmp_path, store, "demo")
    await api.store.set("k", "before")
    with pytest.raises(PluginStoreValueError) as caught:
        await api.store.set("k", value)
    assert caught.value.code == "plugin_store_value_invalid"
    assert why in caught.value.message
    assert await api.store.get("k") == "before"


async def test_the_deepest_accepted_value(tmp_path: Path, store: PluginStore) -> None:
    _, (api,) = load(tmp_path, store, "demo")
    await api.store.set("deep", _nested(32))
    assert await api.store.get("deep") == _nested(32)


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53 - 1), max_value=2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=["Cs"]), max_size=10),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(st.characters(exclude_categories=["Cs"]), max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=_JSON)
async def test_every_json_value_round_trips(tmp_path: Path, store: PluginStore, value: Any) -> None:
    _, (api,) = load(tmp_path, store, "demo")
    await api.store.set("v", value)
    assert await api.store.get("v") == value


_NOT_JSON = st.one_of(
    st.sets(st.integers(), max_size=2),
    st.tuples(st.integers()),
    st.binary(max_size=4),
    st.integers().filter(lambda n: abs(n) > 2**53 - 1),
    st.sampled_from([math.nan, math.inf, -math.inf]),
    st.dictionaries(st.integers(), st.integers(), min_size=1, max_size=2),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bad=_NOT_JSON, inside=st.sampled_from(["bare", "list", "object"]))
async def test_nothing_that_is_not_json_is_stored(tmp_path: Path, store: PluginStore, bad: Any, inside: str) -> None:
    _, (api,) = load(tmp_path, store, "demo")
    value = {"bare": bad, "list": [1, bad], "object": {"a": bad}}[inside]
    with pytest.raises(PluginStoreValueError):
        await api.store.set("k", value)
    assert await api.store.keys() == ()


# -- the example plugin --------------------------------------------------------------------------------------------


async def test_the_example_plugin_remembers_across_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "data" / "plugin-store.sqlite3"
    context = CommandContext("example-plugin", "remember", "buy milk", authenticated=True)
    for answer_expected in ("Remembered (1 items kept).", "Remembered (2 items kept)."):
        with PluginStore(path) as store:
            loader = PluginLoader(make_config(tmp_path), search_paths=[EXAMPLES / "example-plugin"], store=store)
            loader.load()
            loaded(loader, "example-plugin")
            remember = loader.commands.get("remember")
            recall = loader.commands.get("recall")
            assert remember is not None
            assert recall is not None
            assert await remember.handler(context) == answer_expected
    with PluginStore(path) as store:
        loader = PluginLoader(make_config(tmp_path), search_paths=[EXAMPLES / "example-plugin"], store=store)
        loader.load()
        recall = loader.commands.get("recall")
        assert recall is not None
        assert await recall.handler(context) == "buy milk; buy milk"


async def test_the_example_plugin_says_when_there_is_no_store(tmp_path: Path) -> None:
    loader = PluginLoader(make_config(tmp_path), search_paths=[EXAMPLES / "example-plugin"])
    loader.load()
    remember = loader.commands.get("remember")
    assert remember is not None
    context = CommandContext("example-plugin", "remember", "x", authenticated=True)
    assert await remember.handler(context) == "Could not remember that (plugin_store_unavailable)."
