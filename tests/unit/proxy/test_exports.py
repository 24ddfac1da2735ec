"""The public API of clawstack.proxy is exactly this list."""

import types

import clawstack.proxy


def test_exported_members() -> None:
    public = {
        name
        for name in dir(clawstack.proxy)
        if not name.startswith("_") and not isinstance(getattr(clawstack.proxy, name), types.ModuleType)
    }
    assert sorted(clawstack.proxy.__all__) == sorted(public)
