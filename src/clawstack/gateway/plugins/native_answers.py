"""What the native facade answers: acceptance receipts, collected results (with the collector's output-schema
enforcement), list entries, and the instructions a profile and a schema add to a child's prompt. Python names
are snake_case; stored records keep OpenClaw's camelCase (``subagentProfile``)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from clawstack.gateway.custody import COMPLETION_STATES, ChildRecord, PluginOwner
from clawstack.gateway.plugins.profiles import SubagentProfile

__all__ = ["accepted", "child_instructions", "collected", "list_entry", "structured_output"]


def _status(record: ChildRecord) -> str:
    return record.completion if record.completion is not None else record.execution


def _resolved(record: ChildRecord, owner: PluginOwner | None) -> dict[str, str]:
    """The child's own controls as the host set them (never the request's echo); unknown ones stay absent."""
    resolved = {"model": record.model}
    if owner is not None and owner.thinking is not None:
        resolved["thinking"] = owner.thinking
    return resolved


def accepted(record: ChildRecord, owner: PluginOwner | None, requested: dict[str, Any]) -> dict[str, Any]:
    return {
        "run_id": record.run_id,
        "child_session_key": record.child_key,
        "request_id": None if owner is None else owner.request_id,
        "selection": {"requested": requested, "resolved": _resolved(record, owner)},
    }


def child_instructions(profile: SubagentProfile | None, schema: Mapping[str, Any] | None) -> str | None:
    parts = [] if profile is None else [profile.instructions]
    if schema is not None:
        parts.append(
            "Your final answer must be exactly one JSON document, with nothing before or after it, that "
            f"matches this JSON schema:\n{json.dumps(schema, sort_keys=True)}"
        )
    return "\n\n".join(parts) if parts else None


def structured_output(text: str | None, schema: Mapping[str, Any]) -> tuple[Any, str | None]:
    """The answer as the JSON document ``schema`` describes, or ``(None, why not)``: text alone is no result."""
    import jsonschema  # type: ignore[import-untyped]  # imported here: only a schema needs it

    body = (text or "").strip()
    fenced = re.fullmatch(r"```(?:json)?\s*\n(.*)\n```", body, re.DOTALL)
    if fenced is not None:
        body = fenced.group(1).strip()
    try:
        document = json.loads(body)
    except ValueError:
        return None, "the answer is not the JSON document the output schema asks for"
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(document))
    if error is not None:
        where = "/".join(str(part) for part in error.absolute_path) or "(the document)"
        return None, f"the answer does not match the output schema at {where}: {error.message}"[:1000]
    return document, None


def collected(record: ChildRecord, owner: PluginOwner) -> dict[str, Any]:
    assert record.completion in COMPLETION_STATES
    status, error, structured = record.completion, record.error, None
    if owner.output_schema is not None and status == "done":
        structured, failure = structured_output(record.result, owner.output_schema)
        if failure is not None:
            status, error = "failed", failure
    return {
        "run_id": record.run_id,
        "status": status,
        "result": record.result,
        "result_truncated": record.result_truncated,
        "structured_output": structured,
        "error": error,
        "selection": {"requested": {}, "resolved": _resolved(record, owner)},
    }


def list_entry(record: ChildRecord, request_id: str | None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "run_id": record.run_id,
        "child_session_key": record.child_key,
        "request_id": request_id,
        "status": _status(record),
    }
    if record.label is not None:
        entry["label"] = record.label
    return entry
