"""Host modules from ``CLAWCONNECT_AGENT_SESSION_RUNTIME_MODULES``: dotted paths and files, comma- or
newline-separated; one broken module is reported and blocks nothing else."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from clawstack.connect.agent_session import AgentSessionRuntimeRegistry, load_runtime_modules

GOOD = """
async def inspect(ref, options):
    return {"state": "running"}

def register_agent_session_runtimes(registry):
    registry.register("{rid}", provider="p", inspect=inspect)
"""


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("spec", [None, "", " , \n ,"])
def test_nothing_named_registers_nothing(spec: str | None) -> None:
    registry = AgentSessionRuntimeRegistry()
    assert load_runtime_modules(registry, spec) == []
    assert len(registry) == 0


def test_one_broken_module_does_not_block_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    package = tmp_path / "hostpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "runtimes.py").write_text(GOOD.replace("{rid}", "dotted"))
    monkeypatch.syspath_prepend(str(tmp_path))
    half = """
async def inspect(ref, options):
    return None

def register_agent_session_runtimes(registry):
    registry.register("half-one", provider="p", inspect=inspect)
    raise RuntimeError("boom")
"""
    entries = [
        write(tmp_path / "first.py", GOOD.replace("{rid}", "first")),
        write(tmp_path / "syntax.py", "def broken(:\n"),
        str(tmp_path / "missing.py"),
        "no_such_module_anywhere",
        write(tmp_path / "nohook.py", "X = 1\n"),
        write(tmp_path / "half.py", half),
        write(tmp_path / "dup.py", GOOD.replace("{rid}", "first")),
        write(tmp_path / "asynchook.py", "async def register_agent_session_runtimes(registry):\n    pass\n"),
        "hostpkg.runtimes",
    ]
    spec = ",".join(entries[:4]) + "\n" + "\n".join(entries[4:])
    registry = AgentSessionRuntimeRegistry()
    with caplog.at_level(logging.ERROR):
        reports = load_runtime_modules(registry, spec)
    assert [(r.ok, r.code) for r in reports] == [
        (True, None),
        (False, "module_import_failed"),
        (False, "module_not_found"),
        (False, "module_not_found"),
        (False, "register_missing"),
        (False, "register_failed"),
        (False, "agent_session_runtime_duplicate"),
        (False, "register_invalid"),
        (True, None),
    ]
    assert reports[0].runtimes == ("first",)
    assert registry.ids() == ("first", "dotted")  # the half-registered module left nothing behind
    assert "half-one" not in registry
    assert sum("not loaded" in r.message for r in caplog.records) == 7
    assert "boom" not in caplog.text
