"""The ``claw-runs`` example runtime against a real ``claw runs serve``: the example pod's proxy, the local backend's
bubblewrap workers, and the scripted fake model (no model provider is reachable here). Nothing sleeps to
synchronise: every wait polls a condition with a deadline, or long-polls the supervisor."""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.examples.runtimes.loading import (
    RUNTIMES,
    Continue,
    Detach,
    Options,
    RecordingRegistry,
    Ref,
    load_example,
)
from tests.integration.runs.conftest import RunsStack

runtime = load_example("claw_runs")

needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap is not installed here (apt-get install -y bubblewrap)"
)
LIMIT_S = 60.0


def registered(stack: RunsStack | None = None, **environ: str) -> Any:
    registry = RecordingRegistry()
    env = {"CLAW_RUNS_INSTALLATION": "acme", **environ}
    if stack is not None:
        env.setdefault("CLAW_RUNS_SOCKET", str(stack.socket_dir / "runs.sock"))
    runtime.register_agent_session_runtimes(registry, env)
    return registry.only()


def options() -> Options:
    return Options(asyncio.Event())


async def launch(stack: RunsStack, run_id: str, task: str) -> None:
    answer = await stack.call("POST", "/v1/runs", stack.launch_body(run_id, task))
    assert answer.status == 202, answer.body


async def wait_for_state(registration: Any, ref: Ref, state: str) -> dict[str, Any]:
    deadline = time.monotonic() + LIMIT_S
    while True:
        observation = await registration.inspect(ref, options())
        assert observation is not None
        if observation["state"] == state:
            return observation  # type: ignore[no-any-return]
        assert observation["state"] in ("starting", "running"), observation
        assert time.monotonic() < deadline, f"never {state}: {observation}"
        await asyncio.sleep(0.05)


async def run_status(stack: RunsStack, run_id: str, wait: str | None = None) -> dict[str, Any]:
    query = f"?wait={wait}&timeout=60s" if wait else ""
    return (await stack.call("GET", f"/v1/runs/acme/{run_id}{query}")).json()  # type: ignore[no-any-return]


def user_messages(stack: RunsStack) -> list[str]:
    chats = [r for r in stack.fake.requests if r.path.endswith("/chat/completions")]
    return [m["content"] for r in chats for m in r.body["messages"] if m["role"] == "user"]


# --- registration and configuration (no supervisor needed) ------------------------------------------------------


def test_registers_all_three_callbacks() -> None:
    registration = registered(CLAW_RUNS_SOCKET="/tmp/cs-none/runs.sock")
    assert registration.id == "claw-runs"
    assert registration.provider == "claw-runs-worker"
    assert callable(registration.inspect)
    assert callable(registration.continue_)
    assert callable(registration.detach)


@pytest.mark.parametrize(
    ("environ", "names"),
    [
        ({}, "CLAW_RUNS_SOCKET"),
        ({"CLAW_RUNS_INSTALLATION": "acme"}, "CLAW_RUNS_SOCKET"),
        ({"CLAW_RUNS_SOCKET": "  ", "CLAW_RUNS_INSTALLATION": "acme"}, "CLAW_RUNS_SOCKET"),
        ({"CLAW_RUNS_SOCKET": "relative/runs.sock", "CLAW_RUNS_INSTALLATION": "acme"}, "CLAW_RUNS_SOCKET"),
        ({"CLAW_RUNS_SOCKET": "/tmp/cs-none/runs.sock"}, "CLAW_RUNS_INSTALLATION"),
        ({"CLAW_RUNS_SOCKET": "/tmp/cs-none/runs.sock", "CLAW_RUNS_INSTALLATION": "Bad One"}, "CLAW_RUNS_INSTALLATION"),
    ],
)
def test_registration_refuses_unless_the_operator_configured_it(
    environ: dict[str, str], names: str, caplog: pytest.LogCaptureFixture
) -> None:
    registry = RecordingRegistry()
    with caplog.at_level(logging.ERROR), pytest.raises(runtime.ClawRunsError) as caught:
        runtime.register_agent_session_runtimes(registry, environ)
    assert caught.value.code == "not_configured"
    assert registry.calls == []
    [record] = caplog.records
    assert record.getMessage().startswith("claw-runs is not registered: ")
    assert names in record.getMessage()
    assert "cs-none" not in record.getMessage()  # the line names the variable, never its value


def test_the_operator_s_settings_are_required_in_python_too() -> None:
    with pytest.raises(runtime.ClawRunsError) as caught:
        runtime.ClawRunsRuntime(socket=Path("relative.sock"), installation="acme")
    assert caught.value.code == "not_configured"
    with pytest.raises(runtime.ClawRunsError) as caught:
        runtime.ClawRunsRuntime(socket=Path("/tmp/cs-none/runs.sock"), installation="")
    assert caught.value.code == "not_configured"
    assert runtime.ClawRunsRuntime(socket=Path("/tmp/cs-none/runs.sock"), installation="acme").installation == "acme"


BAD_REFS = [
    Ref("../../etc/passwd"),
    Ref("a/b"),
    Ref("a.b"),
    Ref(""),
    Ref("x" * 121),
]


@pytest.mark.parametrize("ref", BAD_REFS, ids=[r.session_id[:20] for r in BAD_REFS])
async def test_a_bad_reference_is_refused_before_any_call(ref: Ref) -> None:
    registration = registered(CLAW_RUNS_SOCKET="/tmp/cs-none/runs.sock")
    for call in (
        registration.inspect(ref, options()),
        registration.continue_(ref, Continue("next"), options()),
        registration.detach(ref, Detach("done", True), options()),
    ):
        with pytest.raises(runtime.ClawRunsError) as caught:
            await call
        assert caught.value.code == "invalid_session_id"


CALLER_ENDPOINTS = [
    {"socket": "DECOY"},
    {"socket": "DECOY", "installation": "other"},
    {"socketPath": "DECOY", "runsSocket": "DECOY", "CLAW_RUNS_SOCKET": "DECOY"},
]


@pytest.mark.parametrize("metadata", CALLER_ENDPOINTS, ids=lambda m: ",".join(m))
async def test_a_socket_named_by_a_caller_is_never_connected_to(short_dir: Path, metadata: dict[str, str]) -> None:
    connections: list[int] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        writer.close()

    decoy = short_dir / "decoy.sock"
    offered = {key: str(decoy) if value == "DECOY" else value for key, value in metadata.items()}
    server = await asyncio.start_unix_server(accept, path=str(decoy))
    async with server:
        registration = registered(CLAW_RUNS_SOCKET=str(short_dir / "runs.sock"))  # the operator's: nobody listens
        ref = Ref("r-1", metadata=offered)
        for call in (
            registration.inspect(ref, options()),
            registration.continue_(ref, Continue("next", metadata=offered), options()),
            registration.detach(ref, Detach("done", True), options()),
        ):
            with pytest.raises(runtime.ClawRunsError) as caught:
                await call
            assert caught.value.code == "socket_unavailable"  # it tried the operator's socket, and only that
    assert connections == []


async def test_an_unreachable_supervisor_is_an_error_not_a_state(short_dir: Path) -> None:
    registration = registered(CLAW_RUNS_SOCKET=str(short_dir / "runs.sock"))
    with pytest.raises(runtime.ClawRunsError) as caught:
        await registration.inspect(Ref("r-1"), options())
    assert caught.value.code == "socket_unavailable"


@pytest.mark.parametrize("prompt", [None, "", "   "])
async def test_continue_needs_a_prompt(prompt: str | None) -> None:
    registration = registered(CLAW_RUNS_SOCKET="/tmp/cs-none/runs.sock")
    with pytest.raises(runtime.ClawRunsError) as caught:
        await registration.continue_(Ref("r-1"), Continue(prompt), options())
    assert caught.value.code == "prompt_required"


STATUS = {
    "installation": "acme",
    "run_id": "r-1",
    "generation": 1,
    "template": "worker",
    "template_id": "sha256:abc",
    "cancelled": False,
    "failure": None,
    "result": None,
    "accepted_at": "2026-09-21T14:13:00Z",
    "started_at": "2026-09-21T14:13:10Z",
    "exited_at": None,
    "ended_at": None,
}


@pytest.mark.parametrize(
    ("changes", "answer", "state", "terminated"),
    [
        ({"state": "accepted", "started_at": None}, None, "starting", False),
        ({"state": "running"}, None, "running", False),
        ({"state": "revoking", "result": {"bytes": 3, "truncated": False}}, None, "running", False),
        ({"state": "revoked", "result": {"bytes": 3, "truncated": False}}, None, "running", False),
        ({"state": "stopped", "result": {"bytes": 3, "truncated": False}}, "yes", "completed", True),
        ({"state": "stopped", "cancelled": True}, None, "dead", True),
        ({"state": "failed", "failure": "exit_nonzero"}, None, "dead", True),
        ({"state": "failed", "failure": "timeout"}, None, "dead", True),
        ({"state": "failed", "failure": "spawn_error", "started_at": None}, None, "failed", True),
        ({"state": "failed", "failure": "authority_expired", "started_at": None}, None, "failed", True),
        ({"state": "failed", "failure": "spawn_error", "cancelled": True, "started_at": None}, None, "dead", True),
        ({"state": "something-new"}, None, "unknown", False),
    ],
)
def test_run_states_map_onto_the_closed_vocabulary(
    changes: dict[str, Any], answer: str | None, state: str, terminated: bool
) -> None:
    observation = runtime.observe({**STATUS, **changes}, answer, continuations=0)
    assert observation["state"] == state
    assert observation.get("terminated", False) is terminated
    assert ("finalResponse" in observation) is (state == "completed")
    assert all(isinstance(v, str) for v in observation["metadata"].values())
    assert observation["metadata"]["runState"] == changes["state"]


def test_the_last_event_is_the_latest_timestamp_the_run_has() -> None:
    assert (
        runtime.observe({**STATUS, "state": "running"}, None, continuations=0)["lastEventAt"] == 1790000000000 - 10_000
    )
    ended = {**STATUS, "state": "stopped", "ended_at": "2026-09-21T14:13:20Z"}
    assert runtime.observe(ended, None, continuations=0)["lastEventAt"] == 1790000000000


def test_continuation_ids_fit_the_supervisor_s_run_ids() -> None:
    assert runtime.continuation_id("r-1", 0) == "r-1"
    assert runtime.continuation_id("r-1", 2) == "r-1--c2"
    assert len(runtime.continuation_id("x" * 120, runtime.MAX_CONTINUATIONS)) <= 128


def test_the_readme_names_what_the_module_does() -> None:
    readme = (RUNTIMES / "claw_runs" / "README.md").read_text()
    for needle in ("CLAW_RUNS_SOCKET", "CLAW_RUNS_INSTALLATION", "--c", "task home", "stopRuntime", "claw-runs"):
        assert needle in readme


# --- against a real supervisor ----------------------------------------------------------------------------------


@needs_bwrap
async def test_inspect_follows_a_run_to_its_answer(stack: RunsStack) -> None:
    registration = registered(stack)
    ref = Ref("follow-1", runtime="claw-runs")
    assert await registration.inspect(ref, options()) is None  # no such run yet
    await launch(stack, "follow-1", "@fake reply: the answer\n@fake delay-ms: 1500")
    assert (await run_status(stack, "follow-1", wait="running"))["state"] == "running"
    running = await registration.inspect(ref, options())
    assert running["state"] == "running"
    assert "finalResponse" not in running
    done = await wait_for_state(registration, ref, "completed")
    assert done["finalResponse"] == "the answer"
    assert done["terminated"] is True
    assert done["alive"] is False
    assert isinstance(done["lastEventAt"], int)
    assert done["metadata"]["runId"] == "follow-1"
    assert done["metadata"]["runState"] == "stopped"
    assert done["metadata"]["template"] == "worker"
    assert done["metadata"]["resultTruncated"] == "false"


@needs_bwrap
async def test_a_run_that_fails_after_starting_reads_dead(stack: RunsStack) -> None:
    registration = registered(stack)
    await launch(stack, "fails-1", "@fake fail: 400")
    assert (await run_status(stack, "fails-1", wait="stopped"))["state"] == "failed"
    observation = await registration.inspect(Ref("fails-1"), options())
    assert observation["state"] == "dead"
    assert observation["metadata"]["failure"] == "exit_nonzero"
    assert "finalResponse" not in observation


@needs_bwrap
async def test_continue_launches_the_next_run_of_the_chain_and_inspect_follows_it(stack: RunsStack) -> None:
    registration = registered(stack)
    ref = Ref("chain-1", runtime="claw-runs")
    await launch(stack, "chain-1", "@fake reply: first answer")
    await wait_for_state(registration, ref, "completed")

    started = await registration.continue_(ref, Continue("Now the follow-up.\n@fake reply: second answer"), options())
    assert started["state"] == "starting"
    assert started["metadata"]["runId"] == "chain-1--c1"
    assert started["metadata"]["continuations"] == "1"
    follow_up = await run_status(stack, "chain-1--c1")
    assert follow_up["template"] == "worker"  # the same template as the run it continues

    done = await wait_for_state(registration, ref, "completed")  # the same ref: identity is the request's
    assert done["finalResponse"] == "second answer"
    assert done["metadata"]["runId"] == "chain-1--c1"
    assert "Now the follow-up.\n@fake reply: second answer" in user_messages(stack)

    # A hint from an earlier observation only saves probes; a wrong one is not trusted.
    for hint in ("1", "0", "7", "junk"):
        hinted = await registration.inspect(Ref("chain-1", metadata={"continuations": hint}), options())
        assert hinted["metadata"]["runId"] == "chain-1--c1", hint

    second = await registration.continue_(ref, Continue("@fake reply: third answer"), options())
    assert second["metadata"]["runId"] == "chain-1--c2"
    assert (await wait_for_state(registration, ref, "completed"))["finalResponse"] == "third answer"


@needs_bwrap
async def test_continue_refuses_while_the_current_run_has_not_ended(stack: RunsStack) -> None:
    registration = registered(stack)
    await launch(stack, "busy-1", "@fake reply: slow\n@fake delay-ms: 60000")
    await run_status(stack, "busy-1", wait="running")
    with pytest.raises(runtime.ClawRunsError) as caught:
        await registration.continue_(Ref("busy-1"), Continue("@fake reply: too soon"), options())
    assert caught.value.code == "run_in_progress"
    assert (await stack.call("GET", "/v1/runs/acme/busy-1--c1")).status == 404
    await stack.call("POST", "/v1/runs/acme/busy-1/cancel?wait=stopped&timeout=30s", {"generation": 1})


@needs_bwrap
async def test_a_retried_continue_reports_the_run_it_launched(stack: RunsStack) -> None:
    registration = registered(stack)
    ref = Ref("retry-1")
    await launch(stack, "retry-1", "@fake reply: first")
    await wait_for_state(registration, ref, "completed")
    prompt = "@fake reply: slow follow-up\n@fake delay-ms: 60000"
    first = await registration.continue_(ref, Continue(prompt), options())
    again = await registration.continue_(ref, Continue(prompt), options())
    assert first["metadata"]["runId"] == again["metadata"]["runId"] == "retry-1--c1"
    with pytest.raises(runtime.ClawRunsError) as caught:
        await registration.continue_(ref, Continue("@fake reply: another"), options())
    assert caught.value.code == "run_in_progress"
    assert (await stack.call("GET", "/v1/runs/acme/retry-1--c2")).status == 404
    await stack.call("POST", "/v1/runs/acme/retry-1--c1/cancel?wait=stopped&timeout=30s", {"generation": 1})


@needs_bwrap
async def test_continue_of_an_unknown_run_is_no_such_session(stack: RunsStack) -> None:
    assert await registered(stack).continue_(Ref("nobody"), Continue("@fake reply: x"), options()) is None


@needs_bwrap
async def test_a_supervisor_refusal_comes_back_with_its_code(stack: RunsStack) -> None:
    registration = registered(stack)
    await launch(stack, "home-1", "@fake reply: done")
    await wait_for_state(registration, Ref("home-1"), "completed")
    with pytest.raises(runtime.ClawRunsError) as caught:  # the example pod's template is stateless
        await registration.continue_(Ref("home-1", metadata={"home": "h-1"}), Continue("@fake reply: x"), options())
    assert caught.value.code == "request_invalid"


@needs_bwrap
async def test_detach_with_stop_runtime_cancels_the_current_run(stack: RunsStack) -> None:
    registration = registered(stack)
    ref = Ref("cancel-1")
    await launch(stack, "cancel-1", "@fake reply: never\n@fake delay-ms: 60000")
    await run_status(stack, "cancel-1", wait="running")

    kept = await registration.detach(ref, Detach("only stop tracking", False), options())
    assert kept["state"] == "running"
    assert (await run_status(stack, "cancel-1"))["cancelled"] is False

    stopped = await registration.detach(ref, Detach("no longer needed", True), options())
    assert stopped["state"] == "dead"
    assert stopped["terminated"] is True
    assert stopped["metadata"]["cancelled"] == "true"
    status = await run_status(stack, "cancel-1")
    assert status["cancelled"] is True
    assert status["state"] == "stopped"
    assert (await registration.inspect(ref, options()))["state"] == "dead"


@needs_bwrap
async def test_detach_of_an_unknown_run_is_no_such_session(stack: RunsStack) -> None:
    assert await registered(stack).detach(Ref("nobody"), Detach("x", True), options()) is None
    assert (await stack.call("GET", "/v1/runs/acme/nobody")).status == 404  # no tombstone was left behind


@needs_bwrap
async def test_a_marker_s_socket_and_installation_are_ignored(stack: RunsStack, short_dir: Path) -> None:
    registration = registered(stack)
    await launch(stack, "marker-1", "@fake reply: through the operator's socket")
    metadata = {"socket": str(short_dir / "elsewhere.sock"), "installation": "other"}
    observation = await wait_for_state(registration, Ref("marker-1", metadata=metadata), "completed")
    assert observation["finalResponse"] == "through the operator's socket"
    assert observation["metadata"]["installation"] == "acme"


@needs_bwrap
async def test_the_signal_aborts_a_call(stack: RunsStack) -> None:
    signal = asyncio.Event()
    signal.set()
    with pytest.raises(runtime.ClawRunsError) as caught:
        await registered(stack).inspect(Ref("r-1"), Options(signal))
    assert caught.value.code == "aborted"


# --- through the seam's real registry and dispatcher -----------------------------------------------------------


@needs_bwrap
async def test_a_task_follows_a_run_through_the_seam(stack: RunsStack, monkeypatch: pytest.MonkeyPatch) -> None:
    agent_session = pytest.importorskip("clawstack.connect.agent_session", reason="the seam's core is absent")
    monkeypatch.setenv("CLAW_RUNS_SOCKET", str(stack.socket_dir / "runs.sock"))
    monkeypatch.setenv("CLAW_RUNS_INSTALLATION", "acme")
    registry = agent_session.AgentSessionRuntimeRegistry()
    [report] = agent_session.load_runtime_modules(registry, str(RUNTIMES / "claw_runs" / "runtime.py"))
    assert report.ok, report
    assert registry.capabilities("claw-runs") == {"inspect", "continue", "detach"}
    dispatcher = agent_session.Dispatcher(registry, call_timeout_ms=30_000)
    ref = agent_session.AgentSessionRef(runtime="claw-runs", session_id="seam-1")

    missing = await dispatcher.inspect(ref)
    assert missing.error is not None
    assert missing.error.code == "session_not_found"

    await launch(stack, "seam-1", "@fake reply: through the seam")
    deadline = time.monotonic() + LIMIT_S
    while (result := await dispatcher.inspect(ref)).observation.state != "completed":
        assert result.ok, result
        assert time.monotonic() < deadline, result
        await asyncio.sleep(0.05)
    assert result.observation.final_response == "through the seam"
    assert result.observation.terminated is True

    continued = await dispatcher.dispatch("continue", ref, agent_session.ContinueRequest("@fake reply: again", {}))
    assert continued.ok, continued
    assert continued.observation.metadata["runId"] == "seam-1--c1"
    detached = await dispatcher.dispatch("detach", ref, agent_session.DetachRequest("stop", True))
    assert detached.ok, detached
    assert detached.observation.state in ("dead", "completed")  # the follow-up may have answered first
