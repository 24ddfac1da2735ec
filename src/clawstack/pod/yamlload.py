"""Load a pod file's YAML strictly: one mapping, no duplicate keys, bounded size and expansion.

PyYAML's ``safe_load`` is too forgiving for a file that decides what untrusted workers may reach: a repeated
key silently replaces the first (so a reviewed ``image`` or ``max-authority`` can be overridden further down),
a few nested aliases expand into billions of nodes, an anchor can contain an alias to itself, and every later
stage would have to cope with several documents or a top level that is not a mapping. This module refuses each
of those with a stable code and a line number.

What it keeps is what Compose files rely on: YAML 1.1 scalars (PyYAML's resolver), anchors and aliases within
limits, and merge keys (``x-common: &common`` then ``<<: *common``), where a key written in the mapping
overrides the merged one, as YAML specifies.

Messages never quote the file's values: a syntax error names its line and column and PyYAML's description of
the problem, with any quoted text from the file cut out, because pod files sit next to credentials and are
sometimes edited with one pasted into the wrong place. Only keys are named (a duplicate key, a top-level key
that is not a string), since keys are names.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

import yaml
from yaml.error import Mark, MarkedYAMLError
from yaml.events import AliasEvent, StreamEndEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.reader import ReaderError

from clawstack.pod.errors import PodFileError

MAX_YAML_BYTES: Final = 1024 * 1024
"""A pod file larger than this is refused before it is parsed."""

MAX_ALIASES: Final = 100
"""A pod file with more aliases (``*name``) than this is refused."""

MAX_DEPTH: Final = 64
"""How many levels deep a node may sit (the top-level mapping is level 1), as written and with aliases expanded."""

MAX_EXPANDED_NODES: Final = 100_000
"""How many nodes the document may have once every alias is expanded (what later stages will walk)."""

_MERGE_TAG: Final = "tag:yaml.org,2002:merge"
_SHOWN_CHARS: Final = 80
# A quoted fragment in a PyYAML message; kept only when it is a token name ('<block end>') or one character.
_QUOTED = re.compile(r"'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\"")
_HARMLESS_QUOTED = re.compile(r"<[a-z ]+>|\\?.|\\x[0-9a-f]{2}|\\u[0-9a-f]{4}")


class _Refused(Exception):
    """A rule of this module, broken; converted to :class:`PodFileError` by :func:`load_yaml`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _PodLoader(yaml.SafeLoader):
    """SafeLoader that counts aliases, bounds nesting, and refuses duplicate keys."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self._aliases = 0
        self._depth = 0
        # Each mapping's keys as written, recorded before merge keys are flattened into it.
        self._written_keys: dict[int, list[Node]] = {}

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        if self.check_event(AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise _Refused("yaml_too_complex", f"more than {MAX_ALIASES} aliases (one more{_at(_next_mark(self))})")
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused("yaml_too_complex", f"nested more than {MAX_DEPTH} levels deep{_at(_next_mark(self))}")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_mapping_node(self, anchor: Any) -> MappingNode:
        node = super().compose_mapping_node(anchor)
        self._written_keys[id(node)] = [key for key, _ in node.value]
        return node

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        self._refuse_duplicate_keys(node)
        return super().construct_mapping(node, deep=deep)

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as exc:  # e.g. a timestamp with month 13
            raise _Refused(
                "yaml_invalid",
                f"invalid value{_at(node.start_mark)}: it looks like a date or a number but is not one;"
                " quote it to keep it a string",
            ) from exc

    def _refuse_duplicate_keys(self, node: MappingNode) -> None:
        seen: dict[Any, Node] = {}
        for key_node in self._written_keys.get(id(node), []):
            if key_node.tag == _MERGE_TAG:
                key: Any = ("<<",)  # a tuple, so it cannot equal any scalar key
                shown = "<<"
            else:
                key = self.construct_object(key_node, deep=True)
                shown = key_node.value if isinstance(key_node, ScalarNode) else str(key)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:
                continue  # an unhashable key: the constructor refuses it with its own message
            if first is not key_node:
                raise _Refused(
                    "yaml_duplicate_key",
                    f"duplicate key {_quote(shown)}{_at(key_node.start_mark)}"
                    f" (first defined at line {first.start_mark.line + 1})",
                )


def _next_mark(loader: _PodLoader) -> Mark:
    mark: Mark = loader.peek_event().start_mark  # type: ignore[no-untyped-call]
    return mark


def _quote(text: str) -> str:
    shown = text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "…"
    return json.dumps(shown, ensure_ascii=False)


def _at(mark: Mark | None) -> str:
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


def _without_quotes(text: str) -> str:
    def replace(match: re.Match[str]) -> str:
        inner = match.group(1) if match.group(1) is not None else match.group(2)
        return match.group(0) if _HARMLESS_QUOTED.fullmatch(inner) else "(…)"

    return _QUOTED.sub(replace, text)


def _syntax_message(error: MarkedYAMLError) -> str:
    problem = _without_quotes(error.problem or "invalid YAML") + _at(error.problem_mark)
    if error.context and error.context_mark is not None and error.context_mark is not error.problem_mark:
        return f"{_without_quotes(error.context)}{_at(error.context_mark)}: {problem}"
    return problem


def _position(text: str, index: int) -> str:
    line = text.count("\n", 0, index) + 1
    column = index - (text.rfind("\n", 0, index) + 1) + 1
    return f"line {line}, column {column}"


def _check_expansion(root: Node) -> None:
    """Refuse alias cycles, and alias use that expands past :data:`MAX_EXPANDED_NODES` or :data:`MAX_DEPTH`.

    Walks the node graph once (iteratively: an alias chain can be deeper than Python's stack), remembering the
    expanded size and depth of every node, so shared subtrees cost nothing to measure however often they recur.
    """
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in size:
            continue
        children: list[Node] = []
        if isinstance(node, SequenceNode):
            children = list(node.value)
        elif isinstance(node, MappingNode):
            children = [part for pair in node.value for part in pair]
        if children_done:
            on_path.discard(key)
            size[key] = 1 + sum(size[id(child)] for child in children)
            depth[key] = 1 + max((depth[id(child)] for child in children), default=0)
            if size[key] > MAX_EXPANDED_NODES:
                raise _Refused(
                    "yaml_too_complex",
                    f"aliases expand the document past {MAX_EXPANDED_NODES} nodes (the node{_at(node.start_mark)})",
                )
            if depth[key] > MAX_DEPTH:
                raise _Refused(
                    "yaml_too_complex",
                    f"aliases nest the document more than {MAX_DEPTH} levels deep (the node{_at(node.start_mark)})",
                )
            continue
        if key in on_path:
            raise _Refused(
                "yaml_too_complex", f"an alias refers to a node that contains it (the node{_at(node.start_mark)})"
            )
        on_path.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in children if id(child) not in size)


def _node_kind(node: Node | None) -> str:
    if node is None:
        return "an empty document"
    if isinstance(node, SequenceNode):
        return "a list"
    if isinstance(node, ScalarNode):
        return "a null" if node.tag == "tag:yaml.org,2002:null" else "a scalar"
    return "something else"


def _load(text: str) -> Any:
    loader = _PodLoader(text)
    try:
        loader.get_event()  # type: ignore[no-untyped-call]  # the stream start
        node = None if loader.check_event(StreamEndEvent) else loader.compose_document()
        if not loader.check_event(StreamEndEvent):
            raise _Refused(
                "yaml_multiple_documents",
                f"a second YAML document{_at(_next_mark(loader))}; a pod file holds exactly one",
            )
        if not isinstance(node, MappingNode):
            raise _Refused("yaml_not_mapping", f"the top level must be a mapping, not {_node_kind(node)}")
        _check_expansion(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def load_yaml(data: bytes, *, source: str) -> dict[str, Any]:
    """Parse a pod file (UTF-8 YAML 1.1, one document whose top level is a mapping with string keys).

    Raises:
        PodFileError: with ``where`` = ``source`` and one of these codes: ``yaml_too_large`` (more than
            :data:`MAX_YAML_BYTES`), ``yaml_invalid`` (not UTF-8, a syntax error, a value that cannot be
            constructed, an unknown tag), ``yaml_duplicate_key``, ``yaml_too_complex`` (more than
            :data:`MAX_ALIASES` aliases, a recursive alias, expansion or nesting beyond the limits),
            ``yaml_multiple_documents``, ``yaml_not_mapping``.
    """
    if len(data) > MAX_YAML_BYTES:
        raise PodFileError(
            f"the file is larger than {MAX_YAML_BYTES} bytes (1 MiB)", where=source, code="yaml_too_large"
        )
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise PodFileError(f"not valid UTF-8 at line {line}", where=source, code="yaml_invalid") from None

    try:
        document = _load(text)
    except _Refused as refused:
        raise PodFileError(refused.message, where=source, code=refused.code) from None
    except MarkedYAMLError as exc:
        raise PodFileError(_syntax_message(exc), where=source, code="yaml_invalid") from None
    except ReaderError as exc:
        what = f"U+{exc.character:04X}" if isinstance(exc.character, int) else "a byte"
        raise PodFileError(
            f"a character YAML does not allow ({what}) at {_position(text, exc.position)}",
            where=source,
            code="yaml_invalid",
        ) from None
    assert isinstance(document, dict)
    for key in document:
        if not isinstance(key, str):
            raise PodFileError(f"top-level key {_quote(str(key))} is not a string", where=source, code="yaml_invalid")
    return document


__all__ = ["MAX_ALIASES", "MAX_DEPTH", "MAX_EXPANDED_NODES", "MAX_YAML_BYTES", "load_yaml"]
