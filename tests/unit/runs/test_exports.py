"""The public API of clawstack.runs is exactly this list."""

import types

import clawstack.runs


def test_exported_members() -> None:
    public = {
        name
        for name in dir(clawstack.runs)
        if not name.startswith("_") and not isinstance(getattr(clawstack.runs, name), types.ModuleType)
    }
    assert sorted(clawstack.runs.__all__) == sorted(public)
