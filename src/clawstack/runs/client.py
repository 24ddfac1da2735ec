"""The client library of the supervisor's API (synchronous, on httpx), which the ``claw runs`` commands use.

Every call verifies the socket directory and the server's peer UID (:mod:`clawstack.common.uds`). Refusals come
back as :class:`~clawstack.runs.errors.RunsError` with the server's code.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from clawstack.common.clock import format_timestamp
from clawstack.common.digest import spec_digest
from clawstack.common.uds import sync_client
from clawstack.runs.errors import RunsError


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
            try:
                error = response.json()["error"]
                raise RunsError(
                    str(error["code"]),
                    str(error["message"]),
                    extra={k: v for k, v in error.items() if k not in ("code", "message")},
                )
            except (ValueError, KeyError, TypeError) as exc:
                raise RunsError("internal_error", f"the supervisor answered HTTP {response.status_code}") from exc
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
        return self._call("POST", "/v1/runs", body=body).json()  # type: ignore[no-any-return]

    def status(
        self, installation: str, run_id: str, *, wait: str | None = None, timeout_s: float | None = None
    ) -> dict[str, Any]:
        params = _wait_params(wait, timeout_s)
        return self._call("GET", f"/v1/runs/{installation}/{run_id}", params=params).json()  # type: ignore[no-any-return]

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
            f"/v1/runs/{installation}/{run_id}/cancel",
            body={"generation": generation},
            params=_wait_params(wait, timeout_s),
        ).json()

    def result(self, installation: str, run_id: str) -> tuple[str, bool]:
        response = self._call("GET", f"/v1/runs/{installation}/{run_id}/result")
        return response.text, response.headers.get("X-Claw-Result-Truncated") == "true"

    def templates(self) -> dict[str, Any]:
        return self._call("GET", "/v1/templates").json()  # type: ignore[no-any-return]

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/v1/health").json()  # type: ignore[no-any-return]


def _wait_params(wait: str | None, timeout_s: float | None) -> dict[str, str]:
    params = {}
    if wait is not None:
        params["wait"] = wait
    if timeout_s is not None:
        params["timeout"] = f"{timeout_s:g}s"
    return params


def load_spec(path: Path) -> dict[str, Any]:
    """A spec file for ``claw runs launch --spec``."""
    spec = json.loads(path.read_text())
    if not isinstance(spec, dict):
        raise RunsError("request_invalid", "a spec file holds a JSON object")
    return spec


__all__ = ["RunsClient", "load_spec"]
