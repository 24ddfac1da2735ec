"""Callback URLs, origin and path-template validation, callback bodies, and the sender's argument checks."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clawstack.runs.callbacks import (
    SUMMARY_LIMIT_BYTES,
    CallbackKind,
    CallbackResult,
    CallbackSender,
    CallbackTarget,
    end_body,
    run_body,
    validate_origin,
    validate_path_template,
)

ORIGIN = "https://orchestrator.internal"


def body(**extra: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "installation": "acme",
        "run_id": "run-1",
        "generation": 3,
        "outcome": "succeeded",
        "reason": "",
        "summary": "done",
        "stored_result_truncated": False,
    }
    fields.update(extra)
    return end_body(**fields)


# --- URLs -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["start", "heartbeat", "end"])
def test_url_is_origin_path_and_kind(kind: CallbackKind) -> None:
    target = CallbackTarget(ORIGIN, "/api/{installation}/runs/{run_id}")
    assert target.url(kind, "acme", "run-1") == f"{ORIGIN}/api/acme/runs/run-1/{kind}"


def test_url_without_placeholders() -> None:
    assert CallbackTarget(ORIGIN, "/callbacks").url("end", "acme", "r") == f"{ORIGIN}/callbacks/end"


@pytest.mark.parametrize(
    ("installation", "run_id", "path"),
    [
        ("acme", "a b", "/i/acme/r/a%20b"),
        ("acme", "x/y", "/i/acme/r/x%2Fy"),
        ("acme", "q?x=1#f", "/i/acme/r/q%3Fx%3D1%23f"),
        ("acme", "100%", "/i/acme/r/100%25"),
        ("ac/../me", "r", "/i/ac%2F..%2Fme/r/r"),
        ("acme", "é🦞", "/i/acme/r/%C3%A9%F0%9F%A6%9E"),
        ("acme", "A-z_0.9~", "/i/acme/r/A-z_0.9~"),
        ("acme", "{run_id}", "/i/acme/r/%7Brun_id%7D"),
    ],
)
def test_url_escapes_values_as_single_segments(installation: str, run_id: str, path: str) -> None:
    target = CallbackTarget(ORIGIN, "/i/{installation}/r/{run_id}")
    assert target.url("start", installation, run_id) == f"{ORIGIN}{path}/start"


def test_url_placeholders_inside_a_segment_and_repeated() -> None:
    target = CallbackTarget(ORIGIN, "/x-{installation}.{run_id}/{run_id}")
    assert target.url("heartbeat", "acme", "r 1") == f"{ORIGIN}/x-acme.r%201/r%201/heartbeat"


@pytest.mark.parametrize(
    ("installation", "run_id", "message"),
    [
        ("", "r", "empty path segment"),
        ("acme", "", "empty path segment"),
        ("acme", ".", "'.' or '..'"),
        ("acme", "..", "'.' or '..'"),
    ],
)
def test_url_refuses_values_that_would_change_the_path(installation: str, run_id: str, message: str) -> None:
    target = CallbackTarget(ORIGIN, "/i/{installation}/r/{run_id}")
    with pytest.raises(ValueError, match=message):
        target.url("start", installation, run_id)


def test_url_refuses_an_unknown_kind() -> None:
    with pytest.raises(ValueError, match="unknown callback kind"):
        CallbackTarget(ORIGIN, "/r/{run_id}").url("finish", "acme", "r")  # type: ignore[arg-type]


def test_target_is_validated_and_canonical() -> None:
    target = CallbackTarget("HTTPS://Orchestrator.Internal:0443", "/r/{run_id}")
    assert target.origin == "https://orchestrator.internal:443"
    with pytest.raises(ValueError, match="path"):
        CallbackTarget("https://orchestrator.internal/api", "/r/{run_id}")
    with pytest.raises(ValueError, match="placeholder"):
        CallbackTarget(ORIGIN, "/r/{task}")


# --- origins --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("origin", "canonical"),
    [
        ("https://orchestrator.internal", "https://orchestrator.internal"),
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
        ("HTTP://Orch.Example.COM", "http://orch.example.com"),
        ("https://orch_1:9000", "https://orch_1:9000"),
        ("http://[::1]:8443", "http://[::1]:8443"),
        ("http://[0:0:0:0:0:0:0:1]", "http://[::1]"),
        ("https://xn--bcher-kva.example:00443", "https://xn--bcher-kva.example:443"),
        ("http://localhost:65535", "http://localhost:65535"),
    ],
)
def test_validate_origin_accepts(origin: str, canonical: str) -> None:
    assert validate_origin(origin) == canonical


@pytest.mark.parametrize(
    ("origin", "message"),
    [
        ("", "empty"),
        ("orchestrator.internal", "must start with http:// or https://"),
        ("ftp://orchestrator.internal", "must start with http:// or https://"),
        ("ws://orchestrator.internal", "must start with http:// or https://"),
        ("https:/orchestrator.internal", "must start with http:// or https://"),
        ("//orchestrator.internal", "must start with http:// or https://"),
        ("https://", "needs a host"),
        ("https://:8080", "needs a host"),
        ("https://orchestrator.internal/", "not even a trailing '/'"),
        ("https://orchestrator.internal/api", "must not have a path"),
        ("https://orchestrator.internal?x=1", "query"),
        ("https://orchestrator.internal#top", "fragment"),
        ("https://user:hunter2@orchestrator.internal", "user information"),
        ("https://orchestrator.internal:", "port must be a number from 1 to 65535"),
        ("https://orchestrator.internal:0", "port must be a number from 1 to 65535"),
        ("https://orchestrator.internal:65536", "port must be a number from 1 to 65535"),
        ("https://orchestrator.internal:8a", "port must be a number from 1 to 65535"),
        ("https://orchestrator.internal:-1", "port must be a number from 1 to 65535"),
        ("https://orchestrator.internal:80:90", "port must be a number from 1 to 65535"),
        ("https://orchestrator internal", "without spaces"),
        ("https://orchestrator.internal\n", "without spaces"),
        (" https://orchestrator.internal", "without spaces"),
        ("https://orchestrator\x00.internal", "printable ASCII"),
        ("https://bücher.example", "xn--"),
        ("https://-orchestrator.internal", "not a valid host name"),
        ("https://orchestrator..internal", "not a valid host name"),
        ("https://orchestrator.internal.", "not a valid host name"),
        ("https://orch%41.internal", "not a valid host name"),
        ("https://[::1", "IPv6 address"),
        ("https://[orchestrator]:80", "IPv6 address"),
        ("https://[::1]x", "not a port"),
        ("https://[::1]:99999", "port must be a number"),
    ],
)
def test_validate_origin_refuses(origin: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        validate_origin(origin)
    assert "hunter2" not in str(caught.value)


@given(st.text(max_size=40))
def test_validate_origin_accepts_only_scheme_host_port(text: str) -> None:
    try:
        canonical = validate_origin(text)
    except ValueError:
        return
    scheme, _, authority = canonical.partition("://")
    assert scheme in ("http", "https")
    assert authority
    assert not any(ch in authority for ch in "/?#@ ")
    assert validate_origin(canonical) == canonical


# --- path templates -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "template",
    [
        "/api/runs/{run_id}",
        "/api/{installation}/runs/{run_id}",
        "/callbacks",
        "/x-{installation}.{run_id}",
        "/a%20b/{run_id}",
        "/v1/runs:{run_id}/~user/@x;y=1,(z)!$&'*+",
    ],
)
def test_validate_path_template_accepts(template: str) -> None:
    assert validate_path_template(template) == template


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("", "must start with '/'"),
        ("api/runs/{run_id}", "must start with '/'"),
        ("{run_id}", "must start with '/'"),
        ("/", "must not end with '/'"),
        ("/api/runs/", "must not end with '/'"),
        ("/api//runs", "empty path segment"),
        ("/api/./runs", "'.' or '..'"),
        ("/api/../runs", "'.' or '..'"),
        ("/api/%2e%2E/runs", "'.' or '..'"),
        ("/runs/{task}", "unknown placeholder {task}"),
        ("/runs/{}", "unknown placeholder {}"),
        ("/runs/{RUN_ID}", "unknown placeholder"),
        ("/runs/{ run_id }", "unknown placeholder"),
        ("/runs/{run_id:>10}", "unknown placeholder"),
        ("/runs/{run_id!r}", "unknown placeholder"),
        ("/runs/{0}", "unknown placeholder"),
        ("/runs/{run_id", "unbalanced"),
        ("/runs/run_id}", "unbalanced"),
        ("/runs/{{run_id}}", "unbalanced"),
        ("/runs?x=1", "no spaces, query or fragment"),
        ("/runs#top", "no spaces, query or fragment"),
        ("/my runs", "no spaces, query or fragment"),
        ("/runs\n", "no spaces, query or fragment"),
        ("/runs/%zz", "%XX escapes"),
        ("/runs/%4", "%XX escapes"),
        ("/rüns", "URL path characters"),
        ("/runs\\x", "URL path characters"),
    ],
)
def test_validate_path_template_refuses(template: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("{", r"\{").replace("}", r"\}").replace("?", r"\?")):
        validate_path_template(template)


# --- bodies ---------------------------------------------------------------------------------------------------


def test_run_body() -> None:
    assert run_body(installation="acme", run_id="r", generation=2) == {
        "installation": "acme",
        "run_id": "r",
        "generation": 2,
    }


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"installation": ""}, "installation"),
        ({"run_id": ""}, "run_id"),
        ({"generation": 0}, "positive integer"),
        ({"generation": -1}, "positive integer"),
        ({"generation": True}, "positive integer"),
        ({"generation": 1.0}, "positive integer"),
        ({"generation": "1"}, "positive integer"),
    ],
)
def test_run_body_refuses(fields: dict[str, Any], message: str) -> None:
    arguments: dict[str, Any] = {"installation": "acme", "run_id": "r", "generation": 1, **fields}
    with pytest.raises(ValueError, match=message):
        run_body(**arguments)


def test_end_body_has_exactly_the_stateless_fields() -> None:
    assert body() == {
        "installation": "acme",
        "run_id": "run-1",
        "generation": 3,
        "outcome": "succeeded",
        "reason": "",
        "summary": "done",
        "summary_truncated": False,
    }
    failed = body(outcome="failed", reason="exit_nonzero", summary="")
    assert (failed["outcome"], failed["reason"], failed["summary"]) == ("failed", "exit_nonzero", "")


def test_end_body_reports_a_truncated_stored_result() -> None:
    assert body(stored_result_truncated=True)["summary_truncated"] is True


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"outcome": "cancelled"}, "succeeded or failed"),
        ({"reason": "exit_nonzero"}, "empty when the run succeeded"),
        ({"outcome": "failed"}, "failure code"),
        ({"result_outcome": "answer"}, "go together"),
        ({"session": "s-1"}, "go together"),
        ({"result_outcome": "maybe", "session": "s-1"}, "answer or question"),
        ({"served_by": {"api_key": 1}}, "go together"),
        ({"served_by_complete": True}, "go together"),
        ({"last_plan_failure": "subscription_unavailable"}, "with served_by"),
        ({"served_by": {"api_key": -1}, "served_by_complete": True}, "never negative"),
        ({"served_by": {"api_key": True}, "served_by_complete": True}, "counts"),
        ({"served_by": {"api_key": 1.5}, "served_by_complete": True}, "counts"),
        ({"served_by": {3: 1}, "served_by_complete": True}, "credential classes"),
    ],
)
def test_end_body_refuses(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        body(**fields)


def test_end_body_task_home_result_fields() -> None:
    result = body(result_outcome="question", session="sess-42")
    assert result["result_outcome"] == "question"
    assert result["session"] == "sess-42"
    assert "served_by" not in result


def test_end_body_proxy_report_fields() -> None:
    served = {"subscription": 12, "api_key": 3}
    result = body(served_by=served, served_by_complete=False, last_plan_failure="subscription_limit_reached")
    served["api_key"] = 99
    assert result["served_by"] == {"subscription": 12, "api_key": 3}
    assert result["served_by_complete"] is False
    assert result["last_plan_failure"] == "subscription_limit_reached"
    assert "result_outcome" not in result
    assert "session" not in result
    without_failure = body(served_by={}, served_by_complete=True)
    assert "last_plan_failure" not in without_failure


@pytest.mark.parametrize(
    ("summary", "expected", "cut"),
    [
        ("a" * SUMMARY_LIMIT_BYTES, "a" * SUMMARY_LIMIT_BYTES, False),
        ("a" * (SUMMARY_LIMIT_BYTES + 1), "a" * SUMMARY_LIMIT_BYTES, True),
        ("a" * (SUMMARY_LIMIT_BYTES - 2) + "é", "a" * (SUMMARY_LIMIT_BYTES - 2) + "é", False),
        ("a" * (SUMMARY_LIMIT_BYTES - 1) + "é", "a" * (SUMMARY_LIMIT_BYTES - 1), True),
        ("a" * (SUMMARY_LIMIT_BYTES - 4) + "🦞", "a" * (SUMMARY_LIMIT_BYTES - 4) + "🦞", False),
        ("a" * (SUMMARY_LIMIT_BYTES - 3) + "🦞", "a" * (SUMMARY_LIMIT_BYTES - 3), True),
        ("a" * (SUMMARY_LIMIT_BYTES - 2) + "🦞", "a" * (SUMMARY_LIMIT_BYTES - 2), True),
        ("a" * (SUMMARY_LIMIT_BYTES - 1) + "🦞", "a" * (SUMMARY_LIMIT_BYTES - 1), True),
        ("a" * (SUMMARY_LIMIT_BYTES - 2) + "€x", "a" * (SUMMARY_LIMIT_BYTES - 2), True),
        ("€" * 30000, "€" * 21845, True),
    ],
)
def test_end_body_cuts_the_summary_at_64_kib_on_a_character_boundary(summary: str, expected: str, cut: bool) -> None:
    result = body(summary=summary)
    assert result["summary"] == expected
    assert result["summary_truncated"] is cut
    assert len(result["summary"].encode("utf-8")) <= SUMMARY_LIMIT_BYTES


def test_end_body_replaces_lone_surrogates() -> None:
    result = body(summary="ok\ud800!")
    assert result["summary"] == "ok\ufffd!"
    assert result["summary_truncated"] is False


@given(
    padding=st.integers(min_value=SUMMARY_LIMIT_BYTES - 24, max_value=SUMMARY_LIMIT_BYTES + 8),
    tail=st.text(alphabet=st.sampled_from(["a", "ß", "€", "한", "🦞", "\u0301", "\x00", "\U0010ffff"]), max_size=16),
    head=st.text(max_size=8),
    stored_result_truncated=st.booleans(),
)
def test_summary_cut_is_a_valid_maximal_prefix(
    head: str, padding: int, tail: str, stored_result_truncated: bool
) -> None:
    original = head + "x" * padding + tail
    result = body(summary=original, stored_result_truncated=stored_result_truncated)
    summary: str = result["summary"]
    encoded = summary.encode("utf-8")  # raises if it is not valid UTF-8 text
    assert encoded.decode("utf-8") == summary
    assert len(encoded) <= SUMMARY_LIMIT_BYTES
    assert original.startswith(summary)
    cut = summary != original
    assert result["summary_truncated"] is (stored_result_truncated or cut)
    if cut:
        next_character = original[len(summary)]
        assert len(encoded) + len(next_character.encode("utf-8")) > SUMMARY_LIMIT_BYTES


# --- results and the sender's arguments -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "status", "ended"),
    [
        ("rejected", 401, True),
        ("rejected", 403, True),
        ("rejected", 400, False),
        ("rejected", 302, False),
        ("rejected", None, False),
        ("acked", 200, False),
        ("abandoned", 503, False),
        ("abandoned", None, False),
        ("skipped", None, False),
    ],
)
def test_authority_ended_only_on_401_and_403(state: Any, status: int | None, ended: bool) -> None:
    assert CallbackResult(state=state, status=status, attempts=1, detail="").authority_ended is ended


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"timeout_s": 0}, "timeout_s"),
        ({"timeout_s": float("inf")}, "timeout_s"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"backoff_initial_s": -1.0}, "backoff_initial_s"),
        ({"backoff_initial_s": float("nan")}, "backoff_initial_s"),
        ({"backoff_initial_s": 5.0, "backoff_max_s": 1.0}, "backoff_max_s"),
    ],
)
def test_sender_refuses_bad_settings(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CallbackSender(CallbackTarget(ORIGIN, "/r/{run_id}"), **arguments)


async def test_send_refuses_bodies_it_cannot_route_or_encode() -> None:
    secret_text = "task output 7f3a"
    async with CallbackSender(CallbackTarget(ORIGIN, "/r/{run_id}")) as sender:
        with pytest.raises(ValueError, match="'run_id'"):
            await sender.send("start", "token", {"installation": "acme", "generation": 1})
        with pytest.raises(ValueError, match="'installation'"):
            await sender.send("start", "token", {"installation": 7, "run_id": "r", "generation": 1})
        with pytest.raises(ValueError, match="not JSON text") as caught:
            await sender.send("end", "token", {**body(summary=secret_text), "extra": {secret_text, 1}})
        assert secret_text not in str(caught.value)
        assert caught.value.__cause__ is None
        assert caught.value.__suppress_context__
        with pytest.raises(ValueError, match="not JSON text"):
            await sender.send("end", "token", {**body(), "score": float("nan")})
        with pytest.raises(ValueError, match="unknown callback kind"):
            await sender.send("finish", "token", body())  # type: ignore[arg-type]


async def test_send_after_close_is_refused() -> None:
    sender = CallbackSender(CallbackTarget(ORIGIN, "/r/{run_id}"))
    await sender.close()
    await sender.close()
    with pytest.raises(RuntimeError, match="closed"):
        await sender.send("start", "token", run_body(installation="acme", run_id="r", generation=1))
