"""``claw proxy serve`` and ``claw proxy self-test`` as real processes, including a SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from clawstack.common.clock import SystemClock
from clawstack.common.ids import new_secret
from clawstack.common.uds import sync_client

from .conftest import KEYS, OPERATOR_TOKEN

READY = "proxy listening: "


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_proxy(config: Path) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "CLAW_PROXY_OPERATOR_TOKEN": OPERATOR_TOKEN}
    proc = subprocess.Popen(
        [sys.executable, "-m", "clawstack", "proxy", "serve", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith(READY):
        proc.kill()
        raise AssertionError(f"no readiness line: {line!r} {proc.stderr.read() if proc.stderr else ''}")
    return proc, line


@pytest.fixture
def config_file(tmp_path: Path, short_dir: Path) -> Iterator[tuple[Path, Path, int]]:
    fake = subprocess.Popen(
        [sys.executable, "-m", "clawstack", "fake-llm", "serve", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert fake.stdout is not None
    fake_url = fake.stdout.readline().strip().removeprefix("fake-llm listening on ")
    sock_dir = short_dir / "op"
    sock_dir.mkdir(mode=0o700)
    port = free_port()
    config = tmp_path / "proxy.json"
    config.write_text(
        json.dumps(
            {
                "worker": {"port": port},
                "operator": {"unix_socket": str(sock_dir / "proxy.sock")},
                "state_dir": "state",
                "revocation_dir": "revocations",
                "env": {"OPENAI_API_KEY": KEYS["OPENAI_API_KEY"]},
                "upstreams": {"openai": {"base_url": fake_url, "api_key_env": "OPENAI_API_KEY"}},
                "data_policy": "permissive",
            }
        )
    )
    config.chmod(0o600)
    try:
        yield config, sock_dir / "proxy.sock", port
    finally:
        fake.terminate()
        fake.wait(10)
        fake.stdout.close()


def create_identity(sock: Path, ident: str, secret: str) -> None:
    with sync_client(sock) as client:
        resp = client.post(
            "/v1/identities",
            headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"},
            json={
                "id": ident,
                "secret": secret,
                "chain": [{"slot": "primary", "ref": "openai/gpt-test"}],
                "expires_at": (SystemClock().now() + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
        )
        assert resp.status_code == 201, resp.text


def revoke(sock: Path, ident: str) -> dict[str, object]:
    with sync_client(sock) as client:
        resp = client.post(f"/v1/identities/{ident}/revoke", headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"})
        assert resp.status_code == 200, resp.text
        return resp.json()  # type: ignore[no-any-return]


def worker_status(port: int, credential: str) -> int:
    import httpx

    return httpx.get(
        f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": f"Bearer {credential}"}
    ).status_code


def test_serve_self_test_sigkill_and_restart(config_file: tuple[Path, Path, int]) -> None:
    config, sock, port = config_file
    proc, line = start_proxy(config)
    try:
        assert f"worker=http://127.0.0.1:{port}/v1" in line
        assert f"operator=unix:{sock}" in line
        env = {**os.environ, "CLAW_PROXY_OPERATOR_TOKEN": OPERATOR_TOKEN}
        done = subprocess.run(
            [sys.executable, "-m", "clawstack", "proxy", "self-test", "--config", str(config)],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert "revocation self-test passed" in done.stdout
        secret = new_secret()
        create_identity(sock, "run-k", secret)
        assert worker_status(port, f"run-k:{secret}") == 200
        assert revoke(sock, "run-k")["newly_revoked"] is True
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    proc, _ = start_proxy(config)
    try:
        assert worker_status(port, f"run-k:{secret}") == 403
        assert revoke(sock, "run-k")["newly_revoked"] is False
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        assert not sock.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = proc.stderr.read() if proc.stderr else ""
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    assert OPERATOR_TOKEN not in stderr
    assert secret not in stderr
    assert KEYS["OPENAI_API_KEY"] not in stderr


def test_bad_config_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    bad = tmp_path / "proxy.json"
    bad.write_text(
        json.dumps(
            {"worker": {"port": 0}, "operator": {"port": 0}, "state_dir": "s", "revocation_dir": "r", "surprise": True}
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "clawstack", "proxy", "serve", "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "CLAW_PROXY_OPERATOR_TOKEN": OPERATOR_TOKEN},
    )
    assert done.returncode != 0
    assert "surprise" in done.stderr
    no_token = tmp_path / "ok.json"
    no_token.write_text(
        json.dumps({"worker": {"port": 0}, "operator": {"port": 0}, "state_dir": "s", "revocation_dir": "r"})
    )
    env = {k: v for k, v in os.environ.items() if k != "CLAW_PROXY_OPERATOR_TOKEN"}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "clawstack", "proxy", "serve", "--config", str(no_token)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert done.returncode != 0
    assert "CLAW_PROXY_OPERATOR_TOKEN" in done.stderr
    assert time.monotonic() - started < 30
