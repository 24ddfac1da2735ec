"""The public API of clawstack.pod is exactly this list."""

import types

import clawstack.pod


def test_exported_members() -> None:
    public = {
        name
        for name in dir(clawstack.pod)
        if not name.startswith("_") and not isinstance(getattr(clawstack.pod, name), types.ModuleType)
    }
    assert sorted(clawstack.pod.__all__) == sorted(public)
