"""Request shapes: which API an upstream model is served through, learned from its answers.

A chain entry's request goes out as Chat Completions (``/chat/completions``) unless the proxy has learned that
the model wants the Responses API (``/responses``), or the route is a plan route, which speaks only Responses.
Two rejections teach the proxy something, and each is retried once in the corrected shape:

- a ``400`` saying ``max_tokens`` is not supported switches that model to the Responses adapter
  (:mod:`clawstack.proxy.responses_api`), where the limit is ``max_output_tokens``;
- a ``400`` saying ``temperature`` or ``top_p`` is not supported drops that parameter for that model.

What is learned is kept per ``provider/model`` for the proxy's lifetime and reused by every later request, so
the rejection is paid once. Whatever the shape, the body is checked against that shape's allowlist
(:func:`~clawstack.proxy.request_guard.check_outgoing`) last, before it is sent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from clawstack.proxy.providers import Route
from clawstack.proxy.request_guard import check_outgoing
from clawstack.proxy.responses_api import (
    ResponsesStreamTranslator,
    chat_to_responses,
    rejected_sampling_parameter,
    rejects_max_tokens,
    responses_to_chat,
)

SAMPLING: Final = frozenset({"temperature", "top_p"})


@dataclass(slots=True)
class Shapes:
    """What the proxy learned, per ``(provider, model)``."""

    responses: set[tuple[str, str]] = field(default_factory=set)
    dropped: dict[tuple[str, str], set[str]] = field(default_factory=dict)

    def uses_responses(self, route: Route) -> bool:
        return route.plan or (route.prefix, route.model) in self.responses

    def shape(self, route: Route, body: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        """``(path, payload)`` for ``body`` (a Chat Completions body) on ``route`` as learned so far. Raises
        :class:`ValueError` for a body the Responses API cannot express and
        :class:`~clawstack.proxy.errors.RequestError` for one outside the shape's allowlist."""
        kept = {k: v for k, v in body.items() if k not in self.dropped.get((route.prefix, route.model), ())}
        if self.uses_responses(route):
            shaped = chat_to_responses(kept)
            check_outgoing("responses", shaped)
            return "/responses", shaped
        check_outgoing("chat", kept)
        return "/chat/completions", kept

    def learn(self, route: Route, status: int, error_body: bytes, sent: Mapping[str, Any]) -> str | None:
        """Learn from a request-fault answer; return what changed (``responses`` or ``drop:<param>``), or
        ``None`` when the rejection teaches nothing and the request stays refused."""
        key = (route.prefix, route.model)
        if not self.uses_responses(route) and rejects_max_tokens(status, error_body):
            self.responses.add(key)
            return "responses"
        param = rejected_sampling_parameter(status, error_body)
        if param in SAMPLING and param in sent and param not in self.dropped.get(key, set()):
            self.dropped.setdefault(key, set()).add(param)
            return f"drop:{param}"
        return None


def translator(route: Route, shapes: Shapes) -> ResponsesStreamTranslator | None:
    """A stream translator when ``route`` answers in the Responses API's events, else ``None``."""
    return ResponsesStreamTranslator(model=route.model) if shapes.uses_responses(route) else None


def chat_body(route: Route, shapes: Shapes, raw: bytes) -> bytes:
    """A non-streamed answer as Chat Completions bytes; raises :class:`ValueError` for an answer that is not a
    completed reply."""
    if not shapes.uses_responses(route):
        return raw
    return json.dumps(responses_to_chat(json.loads(raw), model=route.model), ensure_ascii=False).encode()


__all__ = ["Shapes", "chat_body", "translator"]
