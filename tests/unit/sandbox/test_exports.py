"""The public API of clawstack.sandbox is exactly this list."""

import types

import clawstack.sandbox


def test_exported_members() -> None:
    public = {
        name
        for name in dir(clawstack.sandbox)
        if not name.startswith("_") and not isinstance(getattr(clawstack.sandbox, name), types.ModuleType)
    }
    assert sorted(clawstack.sandbox.__all__) == sorted(public)


def test_every_error_has_a_stable_code() -> None:
    codes = {
        clawstack.sandbox.SandboxError: "sandbox_error",
        clawstack.sandbox.SandboxUnavailableError: "sandbox_unavailable",
        clawstack.sandbox.SandboxSpecError: "spec_invalid",
        clawstack.sandbox.SandboxStartError: "start_failed",
        clawstack.sandbox.ConfinedPathError: "path_invalid",
        clawstack.sandbox.PathEscapeError: "path_escape",
        clawstack.sandbox.PathNotFoundError: "path_not_found",
    }
    for error, code in codes.items():
        assert error.code == code
        assert issubclass(error, clawstack.sandbox.SandboxError)
