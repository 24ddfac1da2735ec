"""The chatgpt plan sign-in against the synthetic identity provider over TLS: login, store, tokens, CLI.

A test "browser" opens the printed authorize URL over TLS (trusting only the test CA) and follows the redirect
to the real loopback listener. Every test also checks that no token, code or verifier the IdP handed out
appears in stdout, stderr, log records, exception messages or reprs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import stat
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner

from clawstack.cli._proxy_auth import auth
from clawstack.common.clock import ManualClock
from clawstack.proxy.config import PlanRoute
from clawstack.proxy.plan import (
    AuthStore,
    PlanLoginError,
    PlanSigninRequired,
    PlanStoreError,
    PlanTokens,
    PlanUnavailable,
    SignIn,
    login,
    plan_ssl_context,
)
from clawstack.proxy.plan.chatgpt import classify_plan_failure, limit_reset_s, plan_headers, responses_url
from clawstack.proxy.plan.chatgpt import shape_plan_request as shape
from clawstack.proxy.plan.tokens import REFRESH_RETRY_S
from tests.integration.proxy.plan_idp import PlanIdP, plan_idp_fixture  # noqa: F401

P = "chatgpt"
WAIT_S = 15.0


@pytest.fixture(autouse=True)
def _debug_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)


@pytest.fixture
def store(tmp_path: Path) -> AuthStore:
    return AuthStore(tmp_path / "pod" / ".claw-auth" / "subscriptions")


def route_ssl(idp: PlanIdP) -> Any:
    return plan_ssl_context(PlanRoute(issuer=idp.issuer, base_url=idp.base_url, ca_file=str(idp.ca_file)))


def assert_clean(idp: PlanIdP, *texts: str) -> None:
    leaked = [secret for secret in idp.secrets() for text in texts if secret in text]
    assert not leaked, "a token, code or verifier leaked"


async def start_login(store: AuthStore, idp: PlanIdP, **kwargs: Any) -> tuple[asyncio.Task[SignIn], str]:
    printed: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    options: dict[str, Any] = {"issuer": idp.issuer, "listen": ("127.0.0.1", 0), "ssl_context": route_ssl(idp)}
    options.update(kwargs)
    task = asyncio.create_task(login(store, print_url=printed.set_result, **options))
    done, _ = await asyncio.wait({task, printed}, timeout=WAIT_S, return_when=asyncio.FIRST_COMPLETED)
    if printed not in done:
        task.result() if task in done else pytest.fail("login printed no URL")
    return task, printed.result()


def tokens_for(store: AuthStore, idp: PlanIdP, clock: ManualClock, **kwargs: Any) -> PlanTokens:
    return PlanTokens(store, issuer=idp.issuer, ssl_context=route_ssl(idp), clock=clock, **kwargs)


# -- login -------------------------------------------------------------------------------------------------


async def test_login_end_to_end(plan_idp: PlanIdP, store: AuthStore, caplog: pytest.LogCaptureFixture) -> None:
    assert store.state(P, ManualClock().now()) == {"provider": P, "state": "not_signed_in"}
    task, url = await start_login(store, plan_idp)
    status, page = await plan_idp.browse(url)
    signin = await asyncio.wait_for(task, WAIT_S)
    assert status == 200
    assert "Signed in to chatgpt as you@example.com" in page
    assert (signin.account_email, signin.account_id) == ("you@example.com", "acct-test-0001")
    issued = plan_idp.tokens_issued[-1]
    assert (signin.access_token, signin.refresh_token, signin.id_token) == (
        issued.access_token,
        issued.refresh_token,
        issued.id_token,
    )
    redirect = plan_idp.authorize_requests[-1]["redirect_uri"]
    assert redirect.startswith("http://localhost:")
    assert redirect.endswith("/auth/callback")
    assert ":0/" not in redirect
    assert store.load(P) == signin
    assert store.state(P, signin.signed_in_at) == {"provider": P, "state": "signed_in", "account": "you@example.com"}
    for secret in plan_idp.secrets():
        assert secret not in repr(signin)
    assert_clean(plan_idp, caplog.text, page)


async def test_store_modes(plan_idp: PlanIdP, store: AuthStore) -> None:
    assert not store.directory.parent.exists()
    task, url = await start_login(store, plan_idp)
    await plan_idp.browse(url)
    await asyncio.wait_for(task, WAIT_S)
    assert stat.S_IMODE(os.stat(store.directory).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(store.directory.parent).st_mode) == 0o700  # .claw-auth
    assert stat.S_IMODE(os.stat(store.path(P)).st_mode) == 0o600
    assert sorted(os.listdir(store.directory)) == ["chatgpt.json"]  # no temporary file left behind


async def test_forged_callback_is_refused_and_the_genuine_one_completes(
    plan_idp: PlanIdP, store: AuthStore, caplog: pytest.LogCaptureFixture
) -> None:
    task, url = await start_login(store, plan_idp)
    callback = await plan_idp.authorize(url)
    for forged in (plan_idp.with_query(callback, state="forged-state"), plan_idp.with_query(callback, state=None)):
        status, page = await plan_idp.visit(forged)
        assert status == 400
        assert "does not match" in page
    assert not task.done()
    assert store.load(P) is None
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert any("wrong state" in text for text in warnings)
    assert any("missing state" in text for text in warnings)
    assert "forged-state" not in caplog.text
    status, _ = await plan_idp.visit(callback)
    assert status == 200
    assert (await asyncio.wait_for(task, WAIT_S)).account_email == "you@example.com"
    assert_clean(plan_idp, caplog.text)


async def test_error_callback_fails_the_login(
    plan_idp: PlanIdP, store: AuthStore, caplog: pytest.LogCaptureFixture
) -> None:
    plan_idp.script(authorize_error="access_denied")
    task, url = await start_login(store, plan_idp)
    status, page = await plan_idp.browse(url)
    assert status == 400
    assert "access_denied" in page
    with pytest.raises(PlanLoginError) as caught:
        await asyncio.wait_for(task, WAIT_S)
    assert caught.value.code == "signin_denied"
    assert "access_denied" in caught.value.message
    assert store.state(P, ManualClock().now())["state"] == "not_signed_in"
    assert_clean(plan_idp, caplog.text, str(caught.value))


async def test_a_refused_code_exchange_fails_the_login(plan_idp: PlanIdP, store: AuthStore) -> None:
    plan_idp.script(token_error="invalid_grant")
    task, url = await start_login(store, plan_idp)
    status, _ = await plan_idp.browse(url)
    with pytest.raises(PlanLoginError) as caught:
        await asyncio.wait_for(task, WAIT_S)
    assert status == 502
    assert caught.value.code == "signin_failed"
    assert "invalid_grant" in caught.value.message
    assert store.load(P) is None
    assert_clean(plan_idp, str(caught.value))


async def test_the_issuer_must_present_a_certificate_the_route_trusts(plan_idp: PlanIdP, store: AuthStore) -> None:
    task, url = await start_login(store, plan_idp, ssl_context=None)  # system CAs: the test CA is unknown
    status, _ = await plan_idp.browse(url)
    with pytest.raises(PlanLoginError) as caught:
        await asyncio.wait_for(task, WAIT_S)
    assert status == 502
    assert "cannot reach" in caught.value.message
    assert store.load(P) is None


async def test_login_times_out_and_a_busy_port_is_reported(plan_idp: PlanIdP, store: AuthStore) -> None:
    task, _ = await start_login(store, plan_idp, timeout_s=0.2)
    with pytest.raises(PlanLoginError) as caught:
        await asyncio.wait_for(task, WAIT_S)
    assert caught.value.code == "signin_timeout"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(PlanLoginError) as caught:
            await login(store, issuer=plan_idp.issuer, listen=busy.getsockname(), print_url=print)
    assert caught.value.code == "signin_listen_failed"


# -- the store ---------------------------------------------------------------------------------------------


async def test_a_loose_or_foreign_store_is_refused(plan_idp: PlanIdP, store: AuthStore) -> None:
    clock = ManualClock()
    signin = plan_idp.mint_signin(clock.now())
    store.save(signin)
    os.chmod(store.directory, 0o750)
    with pytest.raises(PlanStoreError) as caught:
        store.load(P)
    assert str(store.directory) in caught.value.message
    assert "0750" in caught.value.message
    with pytest.raises(PlanStoreError):
        store.save(signin)
    os.chmod(store.directory, 0o700)
    os.chmod(store.path(P), 0o644)
    with pytest.raises(PlanStoreError) as caught:
        store.state(P, clock.now())
    assert "0600" in caught.value.message
    os.chmod(store.path(P), 0o600)
    store.path(P).write_text('{"version": 1, "access_token": "' + signin.access_token + '"')
    with pytest.raises(PlanStoreError) as caught:
        store.load(P)
    assert caught.value.code == "auth_store_unreadable"
    store.path(P).unlink()
    (store.directory / "elsewhere.json").write_text("{}")
    os.chmod(store.directory / "elsewhere.json", 0o600)
    store.path(P).symlink_to(store.directory / "elsewhere.json")
    with pytest.raises(PlanStoreError) as caught:
        store.load(P)
    assert "symlink" in caught.value.message
    with pytest.raises(PlanUnavailable):
        await tokens_for(store, plan_idp, clock).access(P)
    assert_clean(plan_idp, str(caught.value))


def test_state_table(plan_idp: PlanIdP, store: AuthStore) -> None:
    clock = ManualClock()
    now = clock.now()
    signin = plan_idp.mint_signin(now)
    assert store.state(P, now) == {"provider": P, "state": "not_signed_in"}
    store.save(signin.with_changes(limited_until=now + timedelta(minutes=15)))
    assert store.state(P, now) == {
        "provider": P,
        "state": "signed_in",
        "account": "you@example.com",
        "limited_until": "2026-01-01T00:15:00Z",
    }
    assert "limited_until" not in store.state(P, now + timedelta(minutes=16))
    store.save(signin.with_changes(needs_signin=True))
    assert store.state(P, now)["state"] == "signin_required"
    store.save(signin.with_changes(refresh_token=None))
    assert store.state(P, now)["state"] == "signed_in"
    assert store.state(P, now + timedelta(hours=2))["state"] == "signin_required"  # expired, nothing to refresh with
    assert store.remove(P) is True
    assert store.remove(P) is False
    assert store.state(P, now)["state"] == "not_signed_in"
    with pytest.raises(ValueError, match="supported: chatgpt"):
        store.load("claude")


# -- tokens ------------------------------------------------------------------------------------------------


async def test_refresh_before_expiry_rotates_and_is_recorded(plan_idp: PlanIdP, store: AuthStore) -> None:
    clock = ManualClock()
    first = plan_idp.mint_signin(clock.now(), expires_in_s=3600)
    store.save(first)
    tokens = tokens_for(store, plan_idp, clock)
    try:
        assert await tokens.access(P) == (first.access_token, "acct-test-0001")
        assert plan_idp.refreshes == 0
        clock.advance(3600 - 299)  # inside the 300 s margin
        access, account = await tokens.access(P)
        assert plan_idp.refreshes == 1
        assert access != first.access_token
        assert account == "acct-test-0001"
        saved = store.load(P)
        assert saved is not None
        assert saved.access_token == access
        assert saved.refreshed_at == clock.now()
        assert saved.refresh_token != first.refresh_token
        assert saved.expires_at == clock.now() + timedelta(hours=1)
        assert await tokens.access(P) == (access, account)
        assert plan_idp.refreshes == 1
    finally:
        await tokens.aclose()


async def test_concurrent_callers_share_one_refresh(plan_idp: PlanIdP, store: AuthStore) -> None:
    clock = ManualClock()
    store.save(plan_idp.mint_signin(clock.now(), expires_in_s=60))
    tokens = tokens_for(store, plan_idp, clock)
    try:
        results = await asyncio.gather(*(tokens.access(P) for _ in range(20)))
        assert plan_idp.refreshes == 1
        assert len(set(results)) == 1
        forced = await asyncio.gather(*(tokens.access(P, force=True) for _ in range(20)))
        assert plan_idp.refreshes == 1
        assert set(forced) == set(results)
        clock.advance(10)
        assert (await tokens.access(P, force=True)) != results[0]
        assert plan_idp.refreshes == 2
    finally:
        await tokens.aclose()


@pytest.mark.parametrize("outcome", ["invalid_grant", "expired"])
async def test_a_refused_refresh_requires_a_new_sign_in(
    plan_idp: PlanIdP, store: AuthStore, outcome: Any, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    store.save(plan_idp.mint_signin(clock.now(), expires_in_s=60))
    plan_idp.script(refresh=[outcome])
    tokens = tokens_for(store, plan_idp, clock)
    try:
        with pytest.raises(PlanSigninRequired) as caught:
            await tokens.access(P)
        assert caught.value.reason == "subscription_signin_required"
        assert "claw proxy auth login chatgpt" in caught.value.message
        assert store.state(P, clock.now())["state"] == "signin_required"
        with pytest.raises(PlanSigninRequired):
            await tokens.access(P, force=True)
        assert plan_idp.refreshes == 1  # a sign-in known to be over costs no more calls
        assert_clean(plan_idp, caplog.text, str(caught.value))
    finally:
        await tokens.aclose()


async def test_transient_refresh_faults(plan_idp: PlanIdP, store: AuthStore) -> None:
    clock = ManualClock()
    signin = plan_idp.mint_signin(clock.now(), expires_in_s=600)
    store.save(signin)
    plan_idp.script(refresh=["server_error", "malformed", "server_error"])
    tokens = tokens_for(store, plan_idp, clock)
    try:
        clock.advance(400)  # due, not expired: the current token still serves
        assert (await tokens.access(P))[0] == signin.access_token
        clock.advance(REFRESH_RETRY_S - 1)
        assert (await tokens.access(P))[0] == signin.access_token
        assert plan_idp.refreshes == 1  # no new attempt before REFRESH_RETRY_S
        with pytest.raises(PlanUnavailable) as caught:
            await tokens.access(P, force=True)
        assert "malformed" in caught.value.message
        assert caught.value.retryable
        clock.advance(600)
        with pytest.raises(PlanUnavailable):
            await tokens.access(P)
        assert store.state(P, clock.now())["state"] == "signed_in"  # a passing fault is not a lost sign-in
        assert (await tokens.access(P))[0] != signin.access_token
        assert plan_idp.refreshes == 4
    finally:
        await tokens.aclose()


async def test_a_new_login_and_a_logout_are_picked_up_without_restart(plan_idp: PlanIdP, store: AuthStore) -> None:
    clock = ManualClock()
    tokens = tokens_for(store, plan_idp, clock)
    try:
        with pytest.raises(PlanSigninRequired):
            await tokens.access(P)
        task, url = await start_login(store, plan_idp)
        await plan_idp.browse(url)
        first = await asyncio.wait_for(task, WAIT_S)
        assert (await tokens.access(P))[0] == first.access_token
        task, url = await start_login(store, plan_idp)
        await plan_idp.browse(url)
        second = await asyncio.wait_for(task, WAIT_S)
        assert (await tokens.access(P))[0] == second.access_token != first.access_token
        store.remove(P)
        with pytest.raises(PlanSigninRequired):
            await tokens.access(P)
        assert plan_idp.refreshes == 0
    finally:
        await tokens.aclose()


async def test_a_refresh_never_overwrites_a_sign_in_made_meanwhile(plan_idp: PlanIdP, store: AuthStore) -> None:
    clock = ManualClock()
    store.save(plan_idp.mint_signin(clock.now(), expires_in_s=60))
    plan_idp.script(refresh_delay_s=0.3)
    tokens = tokens_for(store, plan_idp, clock)
    try:
        pending = asyncio.create_task(tokens.access(P))
        await asyncio.wait_for(plan_idp.refresh_started.wait(), WAIT_S)
        newer = plan_idp.mint_signin(clock.now(), expires_in_s=3600)
        store.save(newer)
        assert (await pending)[0] == newer.access_token
        saved = store.load(P)
        assert saved is not None
        assert saved.access_token == newer.access_token
    finally:
        await tokens.aclose()


async def test_a_cancelled_caller_does_not_lose_the_rotated_token(plan_idp: PlanIdP, store: AuthStore) -> None:
    clock = ManualClock()
    store.save(plan_idp.mint_signin(clock.now(), expires_in_s=60))
    plan_idp.script(refresh_delay_s=0.2)
    tokens = tokens_for(store, plan_idp, clock)
    try:
        pending = asyncio.create_task(tokens.access(P))
        await asyncio.wait_for(plan_idp.refresh_started.wait(), WAIT_S)
        pending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pending
        await tokens.aclose()  # waits for the refresh in flight
        saved = store.load(P)
        assert saved is not None
        assert saved.refresh_token == plan_idp.tokens_issued[-1].refresh_token
        clock.advance(3600)
        assert (await tokens.access(P))[0] != saved.access_token
        assert plan_idp.refreshes == 2
    finally:
        await tokens.aclose()


async def test_usage_limit_rest_is_persisted(plan_idp: PlanIdP, store: AuthStore) -> None:
    clock = ManualClock()
    store.save(plan_idp.mint_signin(clock.now()))
    tokens = tokens_for(store, plan_idp, clock)
    until = clock.now() + timedelta(seconds=900)
    await tokens.rest(P, until)
    assert tokens.limited_until(P) == until
    assert tokens_for(store, plan_idp, clock).limited_until(P) == until  # another process sees the file
    assert tokens.state(P)["limited_until"] == "2026-01-01T00:15:00Z"
    clock.advance(901)
    assert tokens.limited_until(P) is None
    assert "limited_until" not in tokens.state(P)
    await tokens.aclose()


async def test_plan_backend_round_trip_through_the_fixture(plan_idp: PlanIdP, store: AuthStore) -> None:
    clock = ManualClock()
    store.save(plan_idp.mint_signin(clock.now()))
    tokens = tokens_for(store, plan_idp, clock)
    body = shape({"model": "gpt-5.6-terra", "input": "hi", "temperature": 0.3})
    plan_idp.script(backend=["ok", "limit", "not_included"], resets_in_s=77)
    try:
        async with aiohttp.ClientSession() as session:

            async def send() -> tuple[int, bytes]:
                access, account = await tokens.access(P)
                async with session.post(
                    responses_url(plan_idp.base_url),
                    json=body,
                    headers=plan_headers(access, account, "sess-1"),
                    ssl=route_ssl(plan_idp),
                ) as answer:
                    return answer.status, await answer.read()

            status, stream = await send()
            assert status == 200
            assert b"event: response.completed" in stream
            status, failure = await send()
            assert classify_plan_failure(status, failure) == "subscription_limit_reached"
            assert limit_reset_s(failure) == 77.0
            status, failure = await send()
            assert classify_plan_failure(status, failure) == "subscription_not_eligible"
            plan_idp.revoke_access_tokens()
            status, failure = await send()
            assert classify_plan_failure(status, failure) == "subscription_signin_required"
        first = plan_idp.requests[0]
        assert first.body["stream"] is True
        assert first.body["store"] is False
        assert "temperature" not in first.body
        assert first.headers["chatgpt-account-id"] == "acct-test-0001"
        assert first.headers["session_id"] == "sess-1"
        assert first.headers["originator"] == "codex_cli_rs"
    finally:
        await tokens.aclose()


# -- the CLI -----------------------------------------------------------------------------------------------


@pytest.fixture
def pod(tmp_path: Path, plan_idp: PlanIdP) -> Path:
    """A pod directory whose proxy config (where claw up writes it) has a chatgpt plan route on the fixture."""
    pod = tmp_path / "pod"
    config = pod / ".claw-runtime" / "proxy" / "proxy.json"
    config.parent.mkdir(parents=True)
    config.write_text(
        json.dumps(
            {
                "worker": {"port": 0},
                "operator": {"port": 0},
                "state_dir": "state",
                "revocation_dir": str(pod / ".claw-revocations"),
                "auth_dir": str(pod / ".claw-auth" / "subscriptions"),
                "plan_routes": {"chatgpt": {"issuer": plan_idp.issuer, "ca_file": str(plan_idp.ca_file)}},
            }
        )
    )
    config.chmod(0o600)
    return pod


def cli(*args: str, env: dict[str, str | None] | None = None) -> Any:
    return CliRunner().invoke(auth, list(args), env=env or {"CLAW_PROXY_CONFIG": None}, catch_exceptions=False)


async def test_cli_login_status_logout(plan_idp: PlanIdP, pod: Path) -> None:
    config = str(pod / ".claw-runtime" / "proxy" / "proxy.json")
    result = cli("status", "--pod", str(pod))
    assert result.exit_code == 0
    assert result.output == "chatgpt: not_signed_in — sign in with: claw proxy auth login chatgpt\n"
    env = {**os.environ, "CLAW_PROXY_CONFIG": config}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "clawstack", "proxy", "auth", "login", "chatgpt", "--listen", "127.0.0.1:0",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stderr is not None
    lines = [(await asyncio.wait_for(proc.stdout.readline(), WAIT_S)).decode() for _ in range(2)]
    url = lines[1].strip()
    assert lines[0].startswith("Open this URL")
    assert url.startswith(plan_idp.issuer + "/oauth/authorize?")
    status, _ = await plan_idp.browse(url)
    rest, errors = await asyncio.wait_for(proc.communicate(), WAIT_S)
    assert proc.returncode == 0, errors.decode()
    assert status == 200
    assert rest.decode() == "signed in to chatgpt as you@example.com\n"
    assert ":0/" not in plan_idp.authorize_requests[-1]["redirect_uri"]
    assert_clean(plan_idp, "".join(lines), rest.decode(), errors.decode())

    result = cli("status", env={"CLAW_PROXY_CONFIG": config})
    assert result.output == "chatgpt: signed_in (you@example.com)\n"
    result = cli("status", "--json", "--config", config)
    assert json.loads(result.output) == {
        "subscriptions": [{"provider": "chatgpt", "state": "signed_in", "account": "you@example.com"}]
    }
    store = AuthStore(pod / ".claw-auth" / "subscriptions")
    signin = store.load(P)
    assert signin is not None
    store.save(signin.with_changes(needs_signin=True))
    result = cli("status", "--pod", str(pod))
    assert result.output.startswith("chatgpt: signin_required — the sign-in expired; sign in again with: claw")
    assert cli("logout", "chatgpt", "--pod", str(pod)).output == "signed out of chatgpt: removed its sign-in\n"
    assert cli("logout", "chatgpt", "--pod", str(pod)).output == "chatgpt: not signed in; nothing to remove\n"
    assert cli("status", "--pod", str(pod)).output.startswith("chatgpt: not_signed_in")
    assert_clean(plan_idp, result.output)


def test_cli_refusals(pod: Path, tmp_path: Path) -> None:
    result = cli("login", "claude", "--pod", str(pod))
    assert result.exit_code == 2
    assert "supported providers: chatgpt" in result.output
    result = cli("login", "chatgpt", "--listen", "nowhere", "--pod", str(pod))
    assert result.exit_code == 2
    assert "HOST:PORT" in result.output
    config = pod / ".claw-runtime" / "proxy" / "proxy.json"
    data = json.loads(config.read_text())
    del data["auth_dir"]
    config.write_text(json.dumps(data))
    for command in (["status"], ["logout", "chatgpt"], ["login", "chatgpt"]):
        result = cli(*command, "--pod", str(pod))
        assert result.exit_code == 1
        assert "this proxy has no plan routes" in result.output
        assert "auth_dir" in result.output
    empty = tmp_path / "empty-pod"
    empty.mkdir()
    result = cli("status", "--pod", str(empty))
    assert result.exit_code == 1
    assert "run claw up first" in result.output
