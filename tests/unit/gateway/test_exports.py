"""The public API of clawstack.gateway is exactly this list."""

import types

import clawstack.gateway


def test_exported_members() -> None:
    public = {
        name
        for name in dir(clawstack.gateway)
        if not name.startswith("_") and not isinstance(getattr(clawstack.gateway, name), types.ModuleType)
    }
    assert sorted(clawstack.gateway.__all__) == sorted(public)
