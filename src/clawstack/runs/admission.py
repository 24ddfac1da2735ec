"""Checking a launch: request bodies, identifiers, the spec subset, its digest, the template and the grant.

Admission decides, in this order and before anything is written: the body's shape (``request_invalid``), the
spec's digest (``digest_invalid``), and, for a new run, the template (``template_unknown``, ``template_changed``
with ``current_template_id``), the grant (``grant_exceeded``) and callbacks (``callbacks_disabled``). Tombstones,
generations and idempotent repeats are decided against the ledger by the supervisor.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from clawstack.common.clock import parse_timestamp
from clawstack.common.digest import spec_digest
from clawstack.common.strictjson import MAX_SAFE_INTEGER, StrictJSONError, check_spec
from clawstack.common.strictjson import loads as strict_loads
from clawstack.runs.backends.base import INSTALLATION, RUN_ID
from clawstack.runs.errors import RunsError
from clawstack.runs.homes import HOME_ID

MAX_BODY_BYTES: Final = 64 * 1024
SPEC_FIELDS: Final = {
    "template": str,
    "template_id": str,
    "task": str,
    "tools": list,
    "max_runtime_seconds": int,
    "home": str,
}


def check_supported(template: dict[str, Any], backend: str) -> None:
    """Refuse, before anything is written, a template whose runs this supervisor cannot run as compiled: one
    compiled for another backend than the one this supervisor runs (``backend``). Never run such a template as
    something else."""
    if template.get("backend") != backend:
        raise RunsError(
            "template_unsupported",
            f"this supervisor runs the {backend} backend; the template was compiled for the "
            f"{template.get('backend')} backend (claw up, then restart claw runs serve)",
        )


def check_installation(installation: str) -> None:
    if not INSTALLATION.fullmatch(installation):
        raise RunsError("request_invalid", "installation must match [a-z0-9][a-z0-9-]{0,63}")


def check_key(installation: str, run_id: str) -> None:
    check_installation(installation)
    if not RUN_ID.fullmatch(run_id):
        raise RunsError("request_invalid", "run_id must match [A-Za-z0-9_-]{1,128}")


def parse_body(raw: bytes, fields: dict[str, tuple[type, bool]]) -> dict[str, Any]:
    """A JSON object with exactly the allowed fields (name -> (type, required)); strict parsing throughout."""
    if len(raw) > MAX_BODY_BYTES:
        raise RunsError("body_too_large", f"the body is larger than {MAX_BODY_BYTES} bytes")
    try:
        body = strict_loads(raw, max_bytes=MAX_BODY_BYTES, max_depth=8)
    except StrictJSONError as exc:
        raise RunsError("request_invalid", f"invalid JSON body: {exc.message}") from exc
    if not isinstance(body, dict):
        raise RunsError("request_invalid", "the body must be a JSON object")
    for name in body:
        if name not in fields:
            raise RunsError("request_invalid", f"unknown field {name[:40]!r}")
    for name, (kind, required) in fields.items():
        if name not in body:
            if required:
                raise RunsError("request_invalid", f"{name} is required")
            continue
        value = body[name]
        if isinstance(value, bool) or not isinstance(value, kind):
            raise RunsError("request_invalid", f"{name} must be of type {kind.__name__}")
    return body


def parse_generation(body: dict[str, Any]) -> int:
    generation = body["generation"]
    if not 1 <= generation <= MAX_SAFE_INTEGER:
        raise RunsError("request_invalid", "generation must be a positive integer")
    return int(generation)


def parse_time(value: str, name: str) -> datetime:
    try:
        return parse_timestamp(value)
    except ValueError as exc:
        raise RunsError("request_invalid", f"{name} must be an RFC 3339 time with an offset") from exc


@dataclass(frozen=True, slots=True)
class Launch:
    installation: str
    run_id: str
    generation: int
    spec_digest: str
    spec: dict[str, Any]
    authority_expires_at: datetime
    credential: str | None


def parse_launch(raw: bytes) -> Launch:
    body = parse_body(
        raw,
        {
            "installation": (str, True),
            "run_id": (str, True),
            "generation": (int, True),
            "spec_digest": (str, True),
            "spec": (dict, True),
            "authority_expires_at": (str, True),
            "credential": (str, False),
        },
    )
    check_key(body["installation"], body["run_id"])
    spec = body["spec"]
    try:
        check_spec(spec)
    except StrictJSONError as exc:
        raise RunsError("request_invalid", f"spec: {exc.message}") from exc
    for name, value in spec.items():
        kind = SPEC_FIELDS.get(name)
        if kind is None:
            raise RunsError("request_invalid", f"spec: unknown field {name[:40]!r}")
        if not isinstance(value, kind):
            raise RunsError("request_invalid", f"spec: {name} must be of type {kind.__name__}")
    for required in ("template", "task"):
        if required not in spec:
            raise RunsError("request_invalid", f"spec: {required} is required")
    if "home" in spec and not HOME_ID.fullmatch(spec["home"]):
        raise RunsError("request_invalid", "spec: home is 1 to 128 of A-Z a-z 0-9 . _ - and does not start with a dot")
    if spec.get("max_runtime_seconds", 1) < 1:
        raise RunsError("request_invalid", "spec: max_runtime_seconds must be at least 1")
    if spec_digest(spec) != body["spec_digest"]:
        raise RunsError("digest_invalid", "spec_digest does not match the canonical spec")
    credential = body.get("credential")
    if credential is not None and not re.fullmatch(r"[\x21-\x7e]{1,4096}", credential):
        raise RunsError("request_invalid", "credential must be 1 to 4096 visible ASCII characters")
    return Launch(
        installation=body["installation"],
        run_id=body["run_id"],
        generation=parse_generation(body),
        spec_digest=body["spec_digest"],
        spec=spec,
        authority_expires_at=parse_time(body["authority_expires_at"], "authority_expires_at"),
        credential=credential,
    )


def check_grant(launch: Launch, template: dict[str, Any], now: datetime) -> tuple[list[str], int]:
    """The run's tools and runtime, or ``grant_exceeded`` / ``template_changed``."""
    pinned = launch.spec.get("template_id")
    if pinned is not None and pinned != template["id"]:
        raise RunsError(
            "template_changed",
            "the template was recompiled since this spec was built; build a new spec",
            extra={"current_template_id": template["id"]},
        )
    granted = list(template.get("tools", []))
    tools = launch.spec.get("tools", granted)
    outside = sorted(set(tools) - set(granted))
    if outside:
        raise RunsError("grant_exceeded", f"tools outside the template's grant: {', '.join(outside)[:200]}")
    limits = template["limits"]
    runtime = launch.spec.get("max_runtime_seconds", limits["max_runtime_seconds"])
    if runtime > limits["max_runtime_seconds"]:
        raise RunsError("grant_exceeded", f"max_runtime_seconds exceeds the template's {limits['max_runtime_seconds']}")
    check_authority(launch.authority_expires_at, now, limits["max_authority_seconds"])
    if len(launch.spec["task"].encode()) > limits["max_task_bytes"]:
        raise RunsError("grant_exceeded", f"the task is larger than the template's {limits['max_task_bytes']} bytes")
    if template.get("profile") == "task_home" and "home" not in launch.spec:
        raise RunsError("request_invalid", "spec: home is required for a task-home template")
    if template.get("profile") != "task_home" and "home" in launch.spec:
        raise RunsError("request_invalid", "spec: home is refused for a stateless template")
    return list(tools), int(runtime)


def check_authority(expires_at: datetime, now: datetime, max_authority_seconds: int) -> None:
    """An ``authority_expires_at`` a launch or a credential replacement may set: in the future (else
    ``request_invalid``) and no further than the template's max-authority (else ``grant_exceeded``)."""
    if expires_at > now + timedelta(seconds=max_authority_seconds):
        raise RunsError("grant_exceeded", "authority_expires_at is beyond the template's max-authority")
    if expires_at <= now:
        raise RunsError("request_invalid", "authority_expires_at is in the past")


__all__ = [
    "MAX_BODY_BYTES",
    "Launch",
    "check_authority",
    "check_grant",
    "check_installation",
    "check_key",
    "parse_body",
    "parse_generation",
    "parse_launch",
    "parse_time",
]
