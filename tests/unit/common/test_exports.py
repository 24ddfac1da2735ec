"""The public API of clawstack.common is exactly this list."""

import clawstack.common


def test_exported_members() -> None:
    assert sorted(clawstack.common.__all__) == sorted(
        name for name in dir(clawstack.common) if not name.startswith("_") and not _is_module(name)
    )
    assert clawstack.common.__all__ == sorted(clawstack.common.__all__, key=lambda n: (not n[0].isupper(), n))


def _is_module(name: str) -> bool:
    import types

    return isinstance(getattr(clawstack.common, name), types.ModuleType)
