"""The client library of the supervisor's API: :class:`RunsClient` (synchronous, on httpx; the ``claw runs``
commands use it) and :class:`AsyncRunsClient` (asyncio, on aiohttp), with the same methods.

Every call verifies the socket directory and the server's peer UID (:mod:`clawstack.common.uds`). Every ``installation``, ``run_id``, ``home`` and deliverable name is checked against
the server's own patterns before a path is built from it: one outside them is refused here, ``request_invalid``,
and nothing is sent. Refusals come back as :class:`~clawstack.runs.errors.RunsError` with the server's code.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import httpx

from clawstack.common.clock import format_timestamp
from clawstack.common.digest import spec_digest
from clawstack.common.uds import AsyncUnixClient, UnixResponse, sync_client
from clawstack.runs.backends.base import INSTALLATION, RUN_ID
from clawstack.runs.deliverables import NAME as DELIVERABLE_NAME
from clawstack.runs.errors import RunsError
from clawstack.runs.homes import HOME_ID


class RunsClient:
    """A synchronous client for one supervisor socket."""

    def __init__(self, socket_path: Path, *, server_uid: int | None = None, timeout_s: float = 75.0) -> None:
        self._http = sync_client(socket_path, server_uid=server_uid, timeout_s=timeout_s)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RunsClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call(
        self, method: str, path: str, *, body: Any = None, params: dict[str, str] | None = None
    ) -> httpx.Response:
        response = self._http.request(method, path, json=body, params=params)
        if response.status_code >= 400:
            raise _error(response.status_code, response.content)
        return response

    def launch(
        self,
        installation: str,
        run_id: str,
        spec: dict[str, Any],
        *,
        authority_expires_at: datetime,
        generation: int = 1,
        credential: str | None = None,
    ) -> dict[str, Any]:
        body = _launch_body(installation, run_id, spec, authority_expires_at, generation, credential)
        return self._call("POST", "/v1/runs", body=body).json()  # type: ignore[no-any-return]

    def status(
        self, installation: str, run_id: str, *, wait: str | None = None, timeout_s: float | None = None
    ) -> dict[str, Any]:
        params = _wait_params(wait, timeout_s)
        return self._call("GET", f"/v1/runs/{_run(installation, run_id)}", params=params).json()  # type: ignore[no-any-return]

    def cancel(
        self,
        installation: str,
        run_id: str,
        *,
        generation: int,
        wait: str | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        return self._call(  # type: ignore[no-any-return]
            "POST",
            f"/v1/runs/{_run(installation, run_id)}/cancel",
            body={"generation": generation},
            params=_wait_params(wait, timeout_s),
        ).json()

    def result(self, installation: str, run_id: str) -> tuple[str, bool]:
        response = self._call("GET", f"/v1/runs/{_run(installation, run_id)}/result")
        return response.text, response.headers.get("X-Claw-Result-Truncated") == "true"

    def list_runs(
        self,
        installation: str | None = None,
        state: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """One page of ``GET /v1/runs``: ``{"runs": [status, …], "next_cursor": str | None}``, newest first."""
        params = _list_params(installation, state, limit, cursor)
        return self._call("GET", "/v1/runs", params=params).json()  # type: ignore[no-any-return]

    def templates(self) -> dict[str, Any]:
        return self._call("GET", "/v1/templates").json()  # type: ignore[no-any-return]

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/v1/health").json()  # type: ignore[no-any-return]

    def home(self, installation: str, home: str) -> dict[str, Any]:
        """``GET /v1/homes/{installation}/{home}``: whether it exists and which run reserves it."""
        return self._call("GET", f"/v1/homes/{_home(installation, home)}").json()  # type: ignore[no-any-return]

    def delete_home(self, installation: str, home: str) -> dict[str, Any]:
        """``DELETE /v1/homes/{installation}/{home}`` (``home_busy`` while a run reserves it)."""
        return self._call("DELETE", f"/v1/homes/{_home(installation, home)}").json()  # type: ignore[no-any-return]

    def deliverables(self, installation: str, home: str) -> dict[str, Any]:
        path = f"/v1/homes/{_home(installation, home)}/deliverables"
        return self._call("GET", path).json()  # type: ignore[no-any-return]

    def deliverable(self, installation: str, home: str, name: str, *, sha256: str | None = None) -> dict[str, Any]:
        """One deliverable, base64 in JSON; with ``sha256``, ``deliverable_changed`` if it changed since."""
        path = f"/v1/homes/{_home(installation, home)}/deliverables/{_deliverable(name)}"
        params = None if sha256 is None else {"sha256": sha256}
        return self._call("GET", path, params=params).json()  # type: ignore[no-any-return]


class AsyncRunsClient:
    """An asyncio client for one supervisor socket, with the methods of :class:`RunsClient`."""

    def __init__(self, socket_path: Path, *, server_uid: int | None = None, timeout_s: float = 75.0) -> None:
        self._http = AsyncUnixClient(socket_path, server_uid=server_uid)
        self._timeout_s = timeout_s

    async def close(self) -> None:
        await self._http.close()

    async def __aenter__(self) -> AsyncRunsClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _call(self, method: str, path: str, body: Any = None) -> UnixResponse:
        response = await self._http.request(method, path, json_body=body, timeout_s=self._timeout_s)
        if response.status >= 400:
            raise _error(response.status, response.body)
        return response

    async def launch(
        self,
        installation: str,
        run_id: str,
        spec: dict[str, Any],
        *,
        authority_expires_at: datetime,
        generation: int = 1,
        credential: str | None = None,
    ) -> dict[str, Any]:
        body = _launch_body(installation, run_id, spec, authority_expires_at, generation, credential)
        return (await self._call("POST", "/v1/runs", body)).json()  # type: ignore[no-any-return]

    async def status(
        self, installation: str, run_id: str, *, wait: str | None = None, timeout_s: float | None = None
    ) -> dict[str, Any]:
        path = f"/v1/runs/{_run(installation, run_id)}{_query(wait, timeout_s)}"
        return (await self._call("GET", path)).json()  # type: ignore[no-any-return]

    async def cancel(
        self,
        installation: str,
        run_id: str,
        *,
        generation: int,
        wait: str | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        path = f"/v1/runs/{_run(installation, run_id)}/cancel{_query(wait, timeout_s)}"
        return (await self._call("POST", path, {"generation": generation})).json()  # type: ignore[no-any-return]

    async def result(self, installation: str, run_id: str) -> tuple[str, bool]:
        response = await self._call("GET", f"/v1/runs/{_run(installation, run_id)}/result")
        return response.body.decode("utf-8"), response.headers.get("X-Claw-Result-Truncated") == "true"

    async def list_runs(
        self,
        installation: str | None = None,
        state: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """One page of ``GET /v1/runs``: ``{"runs": [status, …], "next_cursor": str | None}``, newest first."""
        params = _list_params(installation, state, limit, cursor)
        path = "/v1/runs" + ("?" + urlencode(params) if params else "")
        return (await self._call("GET", path)).json()  # type: ignore[no-any-return]

    async def templates(self) -> dict[str, Any]:
        return (await self._call("GET", "/v1/templates")).json()  # type: ignore[no-any-return]

    async def health(self) -> dict[str, Any]:
        return (await self._call("GET", "/v1/health")).json()  # type: ignore[no-any-return]

    async def home(self, installation: str, home: str) -> dict[str, Any]:
        return (await self._call("GET", f"/v1/homes/{_home(installation, home)}")).json()  # type: ignore[no-any-return]

    async def delete_home(self, installation: str, home: str) -> dict[str, Any]:
        path = f"/v1/homes/{_home(installation, home)}"
        return (await self._call("DELETE", path)).json()  # type: ignore[no-any-return]

    async def deliverables(self, installation: str, home: str) -> dict[str, Any]:
        path = f"/v1/homes/{_home(installation, home)}/deliverables"
        return (await self._call("GET", path)).json()  # type: ignore[no-any-return]

    async def deliverable(
        self, installation: str, home: str, name: str, *, sha256: str | None = None
    ) -> dict[str, Any]:
        path = f"/v1/homes/{_home(installation, home)}/deliverables/{_deliverable(name)}"
        path += "" if sha256 is None else "?" + urlencode({"sha256": sha256})
        return (await self._call("GET", path)).json()  # type: ignore[no-any-return]


def _checked(value: str, pattern: re.Pattern[str], what: str) -> str:
    if not isinstance(value, str) or pattern.fullmatch(value) is None:
        raise RunsError("request_invalid", f"the {what} is outside its pattern; nothing was sent")
    return value


def _run(installation: str, run_id: str) -> str:
    """``{installation}/{run_id}`` for a path, each checked against the server's pattern first."""
    return f"{_checked(installation, INSTALLATION, 'installation')}/{_checked(run_id, RUN_ID, 'run_id')}"


def _home(installation: str, home: str) -> str:
    return f"{_checked(installation, INSTALLATION, 'installation')}/{_checked(home, HOME_ID, 'home')}"


def _deliverable(name: str) -> str:
    return quote(_checked(name, DELIVERABLE_NAME, "deliverable name"))


def _launch_body(
    installation: str,
    run_id: str,
    spec: dict[str, Any],
    authority_expires_at: datetime,
    generation: int,
    credential: str | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "installation": installation,
        "run_id": run_id,
        "generation": generation,
        "spec_digest": spec_digest(spec),
        "spec": spec,
        "authority_expires_at": format_timestamp(authority_expires_at),
    }
    if credential is not None:
        body["credential"] = credential
    return body


def _error(status: int, body: bytes) -> RunsError:
    try:
        error = json.loads(body)["error"]
        return RunsError(
            str(error["code"]),
            str(error["message"]),
            extra={k: v for k, v in error.items() if k not in ("code", "message")},
        )
    except (ValueError, KeyError, TypeError):
        return RunsError("internal_error", f"the supervisor answered HTTP {status}")


def _query(wait: str | None, timeout_s: float | None) -> str:
    params = _wait_params(wait, timeout_s)
    return ("?" + "&".join(f"{k}={v}" for k, v in params.items())) if params else ""


def _wait_params(wait: str | None, timeout_s: float | None) -> dict[str, str]:
    params = {}
    if wait is not None:
        params["wait"] = wait
    if timeout_s is not None:
        params["timeout"] = f"{timeout_s:g}s"
    return params


def _list_params(installation: str | None, state: str | None, limit: int | None, cursor: str | None) -> dict[str, str]:
    given = {"installation": installation, "state": state, "limit": limit, "cursor": cursor}
    return {name: str(value) for name, value in given.items() if value is not None}


def load_spec(path: Path) -> dict[str, Any]:
    """A spec file for ``claw runs launch --spec``."""
    spec = json.loads(path.read_text())
    if not isinstance(spec, dict):
        raise RunsError("request_invalid", "a spec file holds a JSON object")
    return spec


__all__ = ["AsyncRunsClient", "RunsClient", "load_spec"]
