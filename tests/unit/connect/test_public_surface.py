"""The boundary stays honest: what the public docs and shipped source may not contain, and what the entry points
may not do on their own.

- The docs (``README.md``, ``docs/**/*.md``), ``src/`` and ``examples/`` name no private host (a host under a
  private-use zone such as ``.internal`` or ``.corp``, or a ``corp.``/``intranet.`` subdomain), no e-mail address
  outside the reserved example domains, no absolute path of a developer machine (``/home/<name>/``,
  ``/Users/<name>/``, ``/root/``, ``C:\\Users\\<name>\\``) and no thread or artifact id.
- ``src/clawstack/connect`` names no runtime: ClawConnect ships the seam, never an adapter. The example runtimes
  live under ``examples/runtimes/`` and the docs may name them.
- Neither ``claw connect mcp`` nor ``claw connect http`` registers a runtime unless the operator names host
  modules in ``CLAWCONNECT_AGENT_SESSION_RUNTIME_MODULES``.

People and company names cannot be matched by pattern; these checks cover what can be: hosts, addresses, paths
and ids. Each pattern's exemptions are listed with the reason they are not private.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[3]
CONNECT_SRC = ROOT / "src" / "clawstack" / "connect"


def _text_files(*roots: Path, suffixes: tuple[str, ...] | None = None) -> Iterator[Path]:
    for root in roots:
        candidates = [root] if root.is_file() else sorted(root.rglob("*"))
        for path in candidates:
            if not path.is_file() or "__pycache__" in path.parts or "node_modules" in path.parts:
                continue
            if suffixes is not None and path.suffix not in suffixes:
                continue
            try:
                path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue  # binary: nothing a reader sees
            yield path


def public_files() -> list[Path]:
    docs = list(_text_files(ROOT / "README.md", ROOT / "docs", suffixes=(".md",)))
    return docs + list(_text_files(ROOT / "src", ROOT / "examples"))


@dataclass(frozen=True)
class Rule:
    name: str
    pattern: re.Pattern[str]
    allowed: frozenset[str] = frozenset()  # exact matches that are not private, each with its reason at the rule


RESERVED_MAIL_DOMAIN = re.compile(
    r"(?:[a-z0-9-]+\.)*(?:example\.(?:com|org|net)|example|test|invalid|localhost)$|^localhost$", re.IGNORECASE
)
RULES = [
    Rule(
        "private host",
        re.compile(
            r"\b[a-z0-9][a-z0-9-]*(?:\.[a-z0-9-]+)*\.(?:internal|corp|intranet|lan|private)\b"
            r"|\b(?:corp|intranet)\.[a-z0-9-]+\.[a-z]{2,}\b",
            re.IGNORECASE,
        ),
        # A one-label placeholder in an error message's "as in https://…"; it names no organisation. Docker's
        # own name for the host seen from a container (extra_hosts host-gateway), which the compose backend uses.
        frozenset({"orchestrator.internal", "host.docker.internal"}),
    ),
    Rule(
        "developer path",
        re.compile(r"(?<![\w.~-])/(?:home|Users)/[A-Za-z0-9._-]+/?|(?<![\w.~-])/root/|[A-Za-z]:\\Users\\[^\\\s]+"),
        # The task-home mount point inside a worker's sandbox, not a path on anyone's machine.
        frozenset({"/home/task", "/home/task/"}),
    ),
    Rule("thread or artifact id", re.compile(r"\b(?:thread|artifact)_(?=[A-Za-z0-9]*\d)[A-Za-z0-9]{8,}\b")),
]
EMAIL = re.compile(r"(?<![\w.+-])[A-Za-z0-9._%+-]+@([A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)\b")


def findings(text: str) -> list[str]:
    found = [
        f"{rule.name}: {match.group(0)}"
        for rule in RULES
        for match in rule.pattern.finditer(text)
        if match.group(0) not in rule.allowed
    ]
    found += [
        f"e-mail address: {match.group(0)}"
        for match in EMAIL.finditer(text)
        if not RESERVED_MAIL_DOMAIN.search(match.group(1))
    ]
    return found


@pytest.mark.parametrize(
    "text",
    [
        "deployed on build-07.acme.internal",
        "see https://wiki.corp.example-co.com/page",
        "ssh ci@runner.corp",
        "intranet.acme.de has the runbook",
        "cd /home/jdoe/src/clawstack",
        "open /Users/jane.doe/project",
        "saved to /root/.clawconnect/jobs.sqlite3",
        r"C:\Users\jdoe\AppData",
        "write to jane.doe@acme-industries.com",
        "from thread_8fK2pQ7xZ1",
        "artifact_2b7e9c41d0 holds it",
    ],
)
def test_the_rules_catch_what_they_are_for(text: str) -> None:
    assert findings(text), text


@pytest.mark.parametrize(
    "text",
    [
        "alice@example.org and ops@example.com and a@b.example and x@host.test",
        "as in https://orchestrator.internal",
        "x-claw.run.home: {mount: /home/task}",
        "files in /tmp/cs-abc and /etc/passwd and /srv/agents",
        "thread_safety and artifact_directory",
        "@pytest.mark.docker and obj.internals",
    ],
)
def test_the_rules_leave_the_ordinary_alone(text: str) -> None:
    assert findings(text) == []


def test_public_docs_and_source_name_no_private_host_address_path_or_id() -> None:
    files = public_files()
    assert any(p.name == "README.md" for p in files)
    assert any(p.suffix == ".py" and "src" in p.parts for p in files)
    problems = [
        f"{path.relative_to(ROOT)}:{number}: {finding}"
        for path in files
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for finding in findings(line)
    ]
    assert problems == []


RUNTIME_NAMES = re.compile(r"local[-_]tmux|claw[-_]runs|\btmux\b|claude[-_]fleet", re.IGNORECASE)


def test_clawconnect_s_source_names_no_runtime() -> None:
    files = list(_text_files(CONNECT_SRC))
    assert any(p.name == "server.py" for p in files)
    problems = [
        f"{path.relative_to(ROOT)}:{number}: {match.group(0)}"
        for path in files
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for match in RUNTIME_NAMES.finditer(line)
    ]
    assert problems == []


# --- the entry points register nothing of their own -----------------------------------------------------------


class _StopBeforeServing(Exception):
    pass


@dataclass
class EntryPointRun:
    services: list[Any]
    registries: list[Any]
    registered: list[str]


@pytest.fixture
def agents_file(tmp_path: Path) -> Path:
    path = tmp_path / "agents.json"
    agent = {"id": "house", "url": "ws://127.0.0.1:9", "token": "token-0123456789", "openclawAgentId": "main"}
    path.write_text(json.dumps({"default": "house", "agents": [agent]}))
    return path


def run_entry_point(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, agents_file: Path, command: str) -> EntryPointRun:
    """``claw connect <command>`` as the CLI builds it, stopped where the service would start serving.

    Every registry created and every ``register`` call is recorded; the HTTP server is built before the service
    starts, the stdio server after, so the stdio server is then built from the same service as ``serve_stdio``
    builds it."""
    agent_session = pytest.importorskip("clawstack.connect.agent_session", reason="the agent-session seam is absent")
    from clawstack.cli.connect import connect
    from clawstack.connect import ConnectService
    from clawstack.connect.server import create_mcp_server

    registry_class = agent_session.AgentSessionRuntimeRegistry
    record = EntryPointRun([], [], [])
    original_init, original_register = registry_class.__init__, registry_class.register
    original_service_init = ConnectService.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        record.registries.append(self)

    def register(self: Any, id: str, **kwargs: Any) -> None:
        record.registered.append(id)
        original_register(self, id, **kwargs)

    def service_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_service_init(self, *args, **kwargs)
        record.services.append(self)

    async def start(self: Any) -> None:
        raise _StopBeforeServing

    monkeypatch.setattr(registry_class, "__init__", init)
    monkeypatch.setattr(registry_class, "register", register)
    monkeypatch.setattr(ConnectService, "__init__", service_init)
    monkeypatch.setattr(ConnectService, "start", start)
    for name in ("MCP_USER_TOKENS", "MCP_USER_TOKENS_FILE", "PUBLIC_MCP_PASS"):
        monkeypatch.delenv(name, raising=False)
    arguments = [command, "--agents", str(agents_file), "--data-dir", str(tmp_path / "data")]
    if command == "http":
        arguments += ["--port", "0"]
    result = CliRunner().invoke(connect, arguments)
    assert isinstance(result.exception, _StopBeforeServing), result.output
    [service] = record.services
    if command == "mcp":
        create_mcp_server(service, agent_session_runtimes=service.agent_session_runtimes)
    return record


@pytest.mark.parametrize("command", ["mcp", "http"])
@pytest.mark.parametrize("setting", [None, "", " , \n"])
def test_neither_entry_point_registers_a_runtime_of_its_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, agents_file: Path, command: str, setting: str | None
) -> None:
    if setting is None:
        monkeypatch.delenv("CLAWCONNECT_AGENT_SESSION_RUNTIME_MODULES", raising=False)
    else:
        monkeypatch.setenv("CLAWCONNECT_AGENT_SESSION_RUNTIME_MODULES", setting)
    record = run_entry_point(monkeypatch, tmp_path, agents_file, command)
    assert record.registered == []
    assert record.registries
    assert all(len(registry) == 0 for registry in record.registries)
    [service] = record.services
    assert len(service.agent_session_runtimes) == 0


@pytest.mark.parametrize("command", ["mcp", "http"])
def test_an_entry_point_registers_exactly_what_the_operator_names(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, agents_file: Path, command: str
) -> None:
    # The control for the test above: the same recording sees a host module's registration.
    module = ROOT / "examples" / "runtimes" / "local_tmux" / "runtime.py"
    monkeypatch.setenv("CLAWCONNECT_AGENT_SESSION_RUNTIME_MODULES", str(module))
    monkeypatch.setenv("LOCAL_TMUX_RUNTIME_ROOT", str(tmp_path / "sessions"))
    record = run_entry_point(monkeypatch, tmp_path, agents_file, command)
    assert record.registered == ["local-tmux"]
    [service] = record.services
    assert service.agent_session_runtimes.ids() == ("local-tmux",)


def test_the_server_factories_default_to_an_empty_registry_of_their_own(tmp_path: Path, agents_file: Path) -> None:
    agent_session = pytest.importorskip("clawstack.connect.agent_session", reason="the agent-session seam is absent")
    from clawstack.connect import ConnectService, JobStore, TokenAuth, create_app, load_agents
    from clawstack.connect.server import create_mcp_server

    agents = load_agents(agents_file)
    first = ConnectService(agents, JobStore(tmp_path / "a.sqlite3"))
    second = ConnectService(agents, JobStore(tmp_path / "b.sqlite3"))
    create_mcp_server(first)
    create_app(second, TokenAuth.from_env({}))
    for service in (first, second):
        assert isinstance(service.agent_session_runtimes, agent_session.AgentSessionRuntimeRegistry)
        assert len(service.agent_session_runtimes) == 0
    assert first.agent_session_runtimes is not second.agent_session_runtimes  # never a shared, global table
