"""Managed tool descriptors, names and the catalog: every rejection with its code and field, the function-name
mapping and the managed namespace, what the model is offered, and properties that nothing malformed is accepted."""

from __future__ import annotations

import asyncio
import copy
import json
import math
import re
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clawstack.proxy import tool_dispatch, tools
from clawstack.proxy.errors import ToolError
from clawstack.proxy.tool_dispatch import ToolDispatcher, ToolOutcome
from clawstack.proxy.tools import (
    SERVICE_NAME,
    TOOL_NAME,
    ServiceDescriptor,
    ToolCatalog,
    ToolService,
    ToolSpec,
    function_name_for,
    parse_descriptor,
    qualified_name_for,
)

SENTINEL = "sk-live-SENTINEL-VALUE"
SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}


def _tool(name: str = "get_ticket", path: str | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "description": f"The {name} tool.",
        "parameters": copy.deepcopy(SCHEMA),
        "http": {"method": "POST", "path": path or f"/tools/{name}"},
    }


def _document() -> dict[str, Any]:
    return {
        "version": 2,
        "auth": {"type": "bearer", "env": "TICKET_API_TOKEN"},
        "tools": [_tool("get_ticket"), _tool("close_ticket")],
    }


def _catalog() -> ToolCatalog:
    def service(name: str, tool_names: list[str], env: str | None) -> ToolService:
        document: dict[str, Any] = {"version": 2, "tools": [_tool(tool) for tool in tool_names]}
        if env is not None:
            document["auth"] = {"type": "bearer", "env": env}
        return ToolService(
            parse_descriptor(name, document), base_url=f"http://{name}:8080", bearer=None if env is None else SENTINEL
        )

    return ToolCatalog(
        [
            service("ticket-api", ["get_ticket", "close_ticket", "list-tickets"], "TICKET_API_TOKEN"),
            service("wiki", ["search"], None),
            service("a", ["b"], None),
        ]
    )


# ------------------------------------------------------------------------------------------------ parsing


def test_a_valid_descriptor_parses_from_bytes_and_from_a_mapping() -> None:
    for data in (json.dumps(_document()).encode(), _document()):
        descriptor = parse_descriptor("ticket-api", data)
        assert descriptor.service == "ticket-api"
        assert descriptor.auth_env == "TICKET_API_TOKEN"
        assert [spec.qualified for spec in descriptor.tools] == ["ticket-api.get_ticket", "ticket-api.close_ticket"]
        spec = descriptor.tools[0]
        assert (spec.service, spec.name, spec.function_name) == ("ticket-api", "get_ticket", "ticket-api__get_ticket")
        assert (spec.method, spec.path, spec.description) == ("POST", "/tools/get_ticket", "The get_ticket tool.")
        assert spec.parameters == SCHEMA


def test_auth_may_be_absent() -> None:
    document = _document()
    del document["auth"]
    assert parse_descriptor("wiki", document).auth_env is None


def test_the_descriptor_is_copied_not_shared() -> None:
    document = _document()
    descriptor = parse_descriptor("ticket-api", document)
    document["tools"][0]["parameters"]["type"] = "string"
    assert descriptor.tools[0].parameters["type"] == "object"


@pytest.mark.parametrize("path", ["/", "/tools/get", "/v1/tickets:get", "/a/b-c_d.json", "/~me/x@y", "/a/"])
def test_plain_paths_are_accepted(path: str) -> None:
    document = _document()
    document["tools"][0]["http"]["path"] = path
    assert parse_descriptor("ticket-api", document).tools[0].path == path


def _set(*keys: str | int, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(document: dict[str, Any]) -> None:
        target: Any = document
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value

    return mutate


def _delete(*keys: str | int) -> Callable[[dict[str, Any]], None]:
    def mutate(document: dict[str, Any]) -> None:
        target: Any = document
        for key in keys[:-1]:
            target = target[key]
        del target[keys[-1]]

    return mutate


def _append_tool(tool: Any) -> Callable[[dict[str, Any]], None]:
    return lambda document: document["tools"].append(tool)


REJECTED: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    # (case id, mutation of a valid descriptor, text the message must contain to name the field)
    ("extra top-level key", _set("service", value=SENTINEL), "has an unknown field 'service'"),
    ("no version", _delete("version"), "lacks the field 'version'"),
    ("version 1", _set("version", value=1), "field 'version'"),
    ("version as string", _set("version", value="2"), "field 'version'"),
    ("version as float", _set("version", value=2.0), "field 'version'"),
    ("version as boolean", _set("version", value=True), "field 'version'"),
    ("auth null", _set("auth", value=None), "field 'auth' must be an object"),
    ("auth as string", _set("auth", value=SENTINEL), "field 'auth' must be an object"),
    ("auth without env", _delete("auth", "env"), "field 'auth' lacks the field 'env'"),
    ("auth without type", _delete("auth", "type"), "field 'auth' lacks the field 'type'"),
    ("auth type basic", _set("auth", "type", value="basic"), "field 'auth.type'"),
    ("auth carries a token", _set("auth", "token", value=SENTINEL), "field 'auth' has an unknown field 'token'"),
    ("auth env lowercase", _set("auth", "env", value="ticket_token"), "field 'auth.env'"),
    ("auth env leading digit", _set("auth", "env", value="1TOKEN"), "field 'auth.env'"),
    ("auth env with dash", _set("auth", "env", value="TICKET-TOKEN"), "field 'auth.env'"),
    ("auth env empty", _set("auth", "env", value=""), "field 'auth.env'"),
    ("auth env a value", _set("auth", "env", value=SENTINEL), "field 'auth.env'"),
    ("auth env number", _set("auth", "env", value=5), "field 'auth.env'"),
    ("no tools", _delete("tools"), "lacks the field 'tools'"),
    ("empty tools", _set("tools", value=[]), "field 'tools' must be a non-empty array"),
    ("tools an object", _set("tools", value={"get_ticket": {}}), "field 'tools' must be a non-empty array"),
    ("129 tools", _set("tools", value=[_tool(f"t{n}") for n in range(129)]), "field 'tools' holds more than 128"),
    ("tool a string", _set("tools", 0, value="get_ticket"), "field 'tools[0]' must be an object"),
    ("tool extra key", _set("tools", 1, "auth", value=SENTINEL), "field 'tools[1]' has an unknown field 'auth'"),
    ("tool without name", _delete("tools", 0, "name"), "field 'tools[0]' lacks the field 'name'"),
    ("tool without description", _delete("tools", 0, "description"), "lacks the field 'description'"),
    ("tool without parameters", _delete("tools", 0, "parameters"), "lacks the field 'parameters'"),
    ("tool without http", _delete("tools", 0, "http"), "field 'tools[0]' lacks the field 'http'"),
    ("name uppercase", _set("tools", 0, "name", value="GetTicket"), "field 'tools[0].name' must match"),
    ("name leading underscore", _set("tools", 0, "name", value="_x"), "field 'tools[0].name' must match"),
    ("name with dot", _set("tools", 0, "name", value="get.ticket"), "field 'tools[0].name' must match"),
    ("name with space", _set("tools", 0, "name", value="get ticket"), "field 'tools[0].name' must match"),
    ("name empty", _set("tools", 0, "name", value=""), "field 'tools[0].name' must match"),
    ("name 49 chars", _set("tools", 0, "name", value="a" * 49), "field 'tools[0].name' must match"),
    ("name a number", _set("tools", 0, "name", value=7), "field 'tools[0].name' must match"),
    ("duplicate name", _set("tools", 1, "name", value="get_ticket"), "field 'tools[1].name' repeats"),
    ("description empty", _set("tools", 0, "description", value=""), "field 'tools[0].description'"),
    ("description blank", _set("tools", 0, "description", value=" \n"), "field 'tools[0].description'"),
    ("description a list", _set("tools", 0, "description", value=["x"]), "field 'tools[0].description'"),
    ("parameters a list", _set("tools", 0, "parameters", value=[]), "field 'tools[0].parameters' must be"),
    ("parameters a string", _set("tools", 0, "parameters", value="object"), "field 'tools[0].parameters' must"),
    ("parameters untyped", _set("tools", 0, "parameters", value={}), "field 'tools[0].parameters.type'"),
    ("parameters a string schema", _set("tools", 0, "parameters", "type", value="string"), "parameters.type'"),
    ("properties a list", _set("tools", 0, "parameters", "properties", value=[]), "parameters.properties'"),
    ("required a string", _set("tools", 0, "parameters", "required", value="id"), "parameters.required'"),
    ("required of numbers", _set("tools", 0, "parameters", "required", value=[1]), "parameters.required'"),
    ("http a string", _set("tools", 0, "http", value="POST /x"), "field 'tools[0].http' must be an object"),
    ("http extra key", _set("tools", 0, "http", "headers", value={}), "field 'tools[0].http' has an unknown"),
    ("http without path", _delete("tools", 0, "http", "path"), "field 'tools[0].http' lacks the field 'path'"),
    ("http without method", _delete("tools", 0, "http", "method"), "field 'tools[0].http' lacks the field"),
    ("method GET", _set("tools", 0, "http", "method", value="GET"), "field 'tools[0].http.method'"),
    ("method lowercase", _set("tools", 0, "http", "method", value="post"), "field 'tools[0].http.method'"),
    ("path relative", _set("tools", 0, "http", "path", value="tools/x"), "field 'tools[0].http.path'"),
    ("path empty", _set("tools", 0, "http", "path", value=""), "field 'tools[0].http.path'"),
    ("path a number", _set("tools", 0, "http", "path", value=1), "field 'tools[0].http.path'"),
    ("path traversal", _set("tools", 0, "http", "path", value="/a/../admin"), "field 'tools[0].http.path'"),
    ("path ends in ..", _set("tools", 0, "http", "path", value="/a/.."), "field 'tools[0].http.path'"),
    ("path dot segment", _set("tools", 0, "http", "path", value="/a/./b"), "field 'tools[0].http.path'"),
    ("path ends in .", _set("tools", 0, "http", "path", value="/a/."), "field 'tools[0].http.path'"),
    ("path network", _set("tools", 0, "http", "path", value="//evil.example/x"), "field 'tools[0].http.path'"),
    ("path double slash", _set("tools", 0, "http", "path", value="/a//b"), "field 'tools[0].http.path'"),
    ("path absolute URL", _set("tools", 0, "http", "path", value="http://evil/x"), "field 'tools[0].http.path'"),
    ("path query", _set("tools", 0, "http", "path", value="/x?admin=1"), "field 'tools[0].http.path'"),
    ("path fragment", _set("tools", 0, "http", "path", value="/x#y"), "field 'tools[0].http.path'"),
    ("path encoded dots", _set("tools", 0, "http", "path", value="/%2e%2e/x"), "field 'tools[0].http.path'"),
    ("path backslash", _set("tools", 0, "http", "path", value="/a\\..\\b"), "field 'tools[0].http.path'"),
    ("path space", _set("tools", 0, "http", "path", value="/a b"), "field 'tools[0].http.path'"),
    ("path newline", _set("tools", 0, "http", "path", value="/a\nHost: x"), "field 'tools[0].http.path'"),
    ("path too long", _set("tools", 0, "http", "path", value="/" + "a" * 1024), "field 'tools[0].http.path'"),
    ("path non-ASCII", _set("tools", 0, "http", "path", value="/tickét"), "field 'tools[0].http.path'"),
]


@pytest.mark.parametrize(("mutate", "field"), [pytest.param(m, f, id=i) for i, m, f in REJECTED])
def test_each_malformed_descriptor_is_refused_naming_service_and_field(
    mutate: Callable[[dict[str, Any]], None], field: str
) -> None:
    document = _document()
    mutate(document)
    for data in (document, json.dumps(document).encode()):
        with pytest.raises(ToolError) as info:
            parse_descriptor("ticket-api", data)
        error = info.value
        assert error.code == "tool_descriptor_invalid"
        assert "'ticket-api'" in error.message
        assert field in error.message
        assert SENTINEL not in error.message


RAW_REJECTED = [
    (b"", "json_syntax"),
    (b"{", "json_syntax"),
    (b"[]", "the descriptor must be an object"),
    (b"null", "the descriptor must be an object"),
    (b'{"version": 2, "version": 2, "tools": []}', "json_duplicate_key"),
    (b'{"version": 2, "tools": [], "x": "\xff"}', "json_invalid_utf8"),
    (b'{"version": 2, "tools": ["\\ud800"]}', "json_lone_surrogate"),
    (b'{"version": 9007199254740993}', "json_integer_range"),
    (b'{"version": NaN}', "json_non_finite"),
    (b'{"a":' * 40 + b"1" + b"}" * 40, "json_too_deep"),
    (b'{"version": 2, "tools": ["' + b"x" * (1024 * 1024) + b'"]}', "json_too_large"),
]


@pytest.mark.parametrize(("data", "reason"), RAW_REJECTED)
def test_bytes_that_are_not_strict_json_are_refused(data: bytes, reason: str) -> None:
    with pytest.raises(ToolError) as info:
        parse_descriptor("ticket-api", data)
    assert info.value.code == "tool_descriptor_invalid"
    assert "'ticket-api'" in info.value.message
    assert reason in info.value.message


@pytest.mark.parametrize(
    "data",
    [
        {"version": 2, "tools": [{**_tool(), "parameters": {"type": "object", "maximum": math.nan}}]},
        {"version": 2, "tools": [{**_tool(), "parameters": {"type": "object", "enum": {1, 2}}}]},
        {"version": 2, "tools": [{**_tool(), "description": "\ud800"}]},
        {"version": 2, "tools": [{**_tool(), "parameters": {"type": "object", "default": 2**60}}]},
        '{"version": 2}',
        ["version", 2],
    ],
    ids=["nan", "set", "lone surrogate", "huge integer", "a str", "a list"],
)
def test_mappings_that_are_not_plain_json_are_refused(data: Any) -> None:
    with pytest.raises(ToolError) as info:
        parse_descriptor("ticket-api", data)
    assert info.value.code == "tool_descriptor_invalid"


def test_a_function_name_over_64_characters_is_refused() -> None:
    document = {"version": 2, "tools": [_tool("get_ticket"), _tool("t" * 40)]}
    with pytest.raises(
        ToolError, match=r"field 'tools\[1\]\.name' makes the function name s{30}__t{40} longer than 64"
    ):
        parse_descriptor("s" * 30, document)


@pytest.mark.parametrize("service", ["Ticket", "ticket_api", "", "-x", "a" * 49, "tick et", "tïcket"])
def test_a_bad_service_name_is_refused(service: str) -> None:
    with pytest.raises(ToolError) as info:
        parse_descriptor(service, _document())
    assert info.value.code == "tool_descriptor_invalid"
    assert "service name must match" in info.value.message


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
KEYS = ["version", "auth", "type", "env", "tools", "name", "description", "parameters", "http", "method", "path"]


def _assert_well_formed(descriptor: ServiceDescriptor) -> None:
    assert descriptor.tools
    assert len({spec.name for spec in descriptor.tools}) == len(descriptor.tools)
    for spec in descriptor.tools:
        assert re.fullmatch(TOOL_NAME, spec.name)
        assert len(spec.function_name) <= 64
        assert spec.parameters["type"] == "object"
        assert spec.path.startswith("/")
        for bad in ("..", "//", "?", "#", "%", "\\", " "):
            assert bad not in spec.path
        assert spec.path.isascii()
        assert spec.path.isprintable()


def _check_parse(data: bytes | dict[str, Any], field: str = "") -> None:
    """Parse ``data``: a refusal must carry the code (and name ``field``); an acceptance must be well formed."""
    try:
        descriptor = parse_descriptor("ticket-api", data)
    except ToolError as error:
        refusal = error
    else:
        _assert_well_formed(descriptor)
        return
    assert refusal.code == "tool_descriptor_invalid"
    assert field in refusal.message


@settings(max_examples=300)
@given(st.binary(max_size=200) | JSON.map(lambda v: json.dumps(v).encode()))
def test_arbitrary_input_is_refused_with_the_code_or_well_formed(data: bytes) -> None:
    _check_parse(data)


@settings(max_examples=300)
@given(
    st.lists(st.tuples(st.sampled_from(KEYS), JSON), min_size=1, max_size=3),
    st.integers(min_value=0, max_value=3),
)
def test_a_valid_descriptor_with_fields_replaced_is_refused_or_still_well_formed(
    replacements: list[tuple[str, Any]], depth: int
) -> None:
    document = _document()
    targets: list[dict[str, Any]] = [document, document["auth"], document["tools"][0], document["tools"][0]["http"]]
    for key, value in replacements:
        targets[depth][key] = value
    _check_parse(document)


@settings(max_examples=300)
@given(st.text(max_size=40))
def test_only_plain_paths_are_accepted(path: str) -> None:
    document = _document()
    document["tools"][0]["http"]["path"] = path
    _check_parse(document, "tools[0].http.path")


# ------------------------------------------------------------------------------------------------ names


@settings(max_examples=300)
@given(st.from_regex(f"\\A{SERVICE_NAME}\\Z"), st.from_regex(f"\\A{TOOL_NAME}\\Z"))
def test_function_names_map_back_to_exactly_one_tool(service: str, tool: str) -> None:
    function_name = function_name_for(service, tool)
    if len(function_name) > 64:
        with pytest.raises(ValueError, match="longer than 64"):
            ToolSpec(service=service, name=tool, description="d", parameters=SCHEMA, method="POST", path="/x")
        return
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", function_name)
    assert qualified_name_for(function_name) == f"{service}.{tool}"
    spec = ToolSpec(service=service, name=tool, description="d", parameters=SCHEMA, method="POST", path="/x")
    descriptor = ServiceDescriptor(service=service, auth_env=None, tools=(spec,))
    catalog = ToolCatalog([ToolService(descriptor, base_url="http://svc")])
    assert catalog.by_function_name(function_name) is spec
    assert catalog.get(spec.qualified) is spec
    assert catalog.is_managed_name(function_name)


def test_function_name_mapping_and_lookups() -> None:
    catalog = _catalog()
    spec = catalog.get("ticket-api.list-tickets")
    assert spec is not None
    assert spec.function_name == "ticket-api__list-tickets"
    assert catalog.by_function_name("ticket-api__list-tickets") is spec
    assert catalog.by_function_name("ticket-api.list-tickets") is None
    assert catalog.get("ticket-api__list-tickets") is None
    assert catalog.get("ticket-api.nope") is None
    assert len(catalog) == 5
    assert qualified_name_for("get_weather") is None


@pytest.mark.parametrize(
    ("function_name", "managed"),
    [
        ("ticket-api__get_ticket", True),  # known and (maybe) allowed
        ("ticket-api__close_ticket", True),  # known, whatever the allowlist says
        ("ticket-api__delete_everything", True),  # invented, but in a known service's namespace
        ("ticket-api__", True),
        ("wiki__search", True),
        ("a__b", True),
        ("a__b__c", True),
        ("unknown-api__get_ticket", False),
        ("get_weather", False),
        ("ticket-api_get_ticket", False),
        ("ticket-api.get_ticket", False),
        ("ticket-api", False),
        ("__get_ticket", False),
        ("", False),
        ("Ticket-api__get_ticket", False),
    ],
)
def test_the_managed_namespace_covers_every_name_of_a_known_service(function_name: str, managed: bool) -> None:
    assert _catalog().is_managed_name(function_name) is managed


def test_openai_tools_offers_only_the_allowlist_sorted_by_qualified_name() -> None:
    catalog = _catalog()
    allowlist = ["wiki.search", "ticket-api.get_ticket", "ticket-api.nope", "elsewhere.x", "wiki.search"]
    offered = catalog.openai_tools(allowlist)
    assert offered == [
        {
            "type": "function",
            "function": {"name": "ticket-api__get_ticket", "description": "The get_ticket tool.", "parameters": SCHEMA},
        },
        {
            "type": "function",
            "function": {"name": "wiki__search", "description": "The search tool.", "parameters": SCHEMA},
        },
    ]
    assert catalog.openai_tools([]) == []
    assert catalog.openai_tools(["ticket-api__get_ticket"]) == []
    assert [t["function"]["name"] for t in catalog.openai_tools(iter(["wiki.search", "a.b"]))] == [
        "a__b",
        "wiki__search",
    ]


def test_openai_tools_are_fresh_copies() -> None:
    catalog = _catalog()
    offered = catalog.openai_tools(["ticket-api.get_ticket"])
    offered[0]["function"]["parameters"]["properties"]["id"]["type"] = "string"
    offered[0]["function"]["name"] = "changed"
    assert catalog.openai_tools(["ticket-api.get_ticket"])[0]["function"]["parameters"] == SCHEMA


def test_unknown_lists_entries_naming_no_tool_in_order_once() -> None:
    names = ["wiki.nope", "ticket-api.get_ticket", "other.x", "wiki.nope", "wiki__search", "wiki.search"]
    assert _catalog().unknown(names) == ["wiki.nope", "other.x", "wiki__search"]
    assert _catalog().unknown([]) == []


def test_a_hand_built_descriptor_cannot_smuggle_in_another_services_tool_or_a_duplicate() -> None:
    spec = ToolSpec(service="wiki", name="search", description="d", parameters=SCHEMA, method="POST", path="/x")
    with pytest.raises(ValueError, match="does not belong"):
        ToolCatalog([ToolService(ServiceDescriptor("ticket-api", None, (spec,)), "http://a")])
    with pytest.raises(ValueError, match="does not belong"):
        ToolCatalog([ToolService(ServiceDescriptor("wiki", None, (spec, spec)), "http://a")])


def test_a_service_configured_twice_is_refused() -> None:
    descriptor = parse_descriptor("wiki", {"version": 2, "tools": [_tool("search")]})
    with pytest.raises(ValueError, match="configured twice"):
        ToolCatalog([ToolService(descriptor, "http://a"), ToolService(descriptor, "http://b")])


# ------------------------------------------------------------------------------------------------ specs, services


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"service": "Bad"}, "service name must match"),
        ({"name": "Bad"}, "tool name must match"),
        ({"service": "s" * 40, "name": "t" * 40}, "longer than 64"),
        ({"method": "GET"}, "POST"),
        ({"path": "/../x"}, "plain absolute path"),
    ],
)
def test_a_spec_keeps_its_invariants_when_built_directly(changes: dict[str, Any], message: str) -> None:
    fields: dict[str, Any] = {
        "service": "svc",
        "name": "tool",
        "description": "d",
        "parameters": SCHEMA,
        "method": "POST",
        "path": "/x",
    }
    with pytest.raises(ValueError, match=message):
        ToolSpec(**{**fields, **changes})


def test_a_spec_is_frozen_and_hashable() -> None:
    spec = ToolSpec(service="svc", name="tool", description="d", parameters=SCHEMA, method="POST", path="/x")
    assert (spec.qualified, spec.function_name) == ("svc.tool", "svc__tool")
    assert spec in {spec}
    with pytest.raises(AttributeError):
        spec.qualified = "other.tool"  # type: ignore[misc]


def _descriptor(auth_env: str | None) -> ServiceDescriptor:
    document: dict[str, Any] = {"version": 2, "tools": [_tool()]}
    if auth_env is not None:
        document["auth"] = {"type": "bearer", "env": auth_env}
    return parse_descriptor("ticket-api", document)


def test_a_service_bearer_is_required_exactly_when_auth_is_declared() -> None:
    assert ToolService(_descriptor("TOKEN"), "http://svc", SENTINEL).bearer == SENTINEL
    assert ToolService(_descriptor(None), "http://svc").bearer is None
    with pytest.raises(ValueError, match="TOKEN") as info:
        ToolService(_descriptor("TOKEN"), "http://svc", None)
    assert "missing or blank" in str(info.value)
    with pytest.raises(ValueError, match="declares no auth"):
        ToolService(_descriptor(None), "http://svc", SENTINEL)


@pytest.mark.parametrize("bearer", ["", "   ", f"{SENTINEL}\r\nX-Evil: 1", f"{SENTINEL} x", f"{SENTINEL}\x00", "tøken"])
def test_a_blank_or_unsendable_bearer_is_refused_without_showing_it(bearer: str) -> None:
    with pytest.raises(ValueError, match=r"missing or blank|a header cannot carry") as info:
        ToolService(_descriptor("TOKEN"), "http://svc", bearer)
    assert SENTINEL not in str(info.value)


def test_the_bearer_never_appears_in_repr() -> None:
    service = ToolService(_descriptor("TOKEN"), "http://svc", SENTINEL)
    assert SENTINEL not in repr(service)
    assert SENTINEL not in repr(ToolCatalog([service]).service("ticket-api"))


@pytest.mark.parametrize(
    ("base_url", "expected"),
    [
        ("http://svc:8080", "http://svc:8080"),
        ("http://svc:8080/", "http://svc:8080"),
        ("https://svc.internal/api/", "https://svc.internal/api"),
        ("http://127.0.0.1:9000/v1", "http://127.0.0.1:9000/v1"),
    ],
)
def test_base_urls_are_normalised(base_url: str, expected: str) -> None:
    assert ToolService(_descriptor(None), base_url).base_url == expected


@pytest.mark.parametrize(
    "base_url",
    ["svc:8080", "/tools", "ftp://svc", "http://", "http://user:pw@svc", "http://svc?x=1", "http://svc/#f", "", "::"],
)
def test_bad_base_urls_are_refused(base_url: str) -> None:
    with pytest.raises(ValueError, match="base URL"):
        ToolService(_descriptor(None), base_url)


# ------------------------------------------------------------------------------------------------ outcomes


def test_a_refused_call_has_an_outcome_the_model_can_read() -> None:
    outcome = ToolOutcome.refused("ticket-api.close_ticket")
    assert (outcome.ok, outcome.error_code, outcome.http_status) == (False, "tool_not_allowed", None)
    assert json.loads(outcome.content) == {
        "error": "tool_not_allowed",
        "message": "the ticket-api.close_ticket tool is not available to this run",
    }
    long = ToolOutcome.refused("x" * 5000)
    assert long.qualified == "x" * 5000
    assert len(long.content) < 300


NOT_AN_OBJECT = JSON.filter(lambda v: not isinstance(v, dict)).map(json.dumps)


@settings(max_examples=50, deadline=None)
@given(NOT_AN_OBJECT | st.text(max_size=30).filter(lambda t: not t.strip().startswith("{")))
def test_arguments_that_are_not_a_json_object_are_refused_without_a_request(arguments: str) -> None:
    spec = ToolSpec(service="svc", name="tool", description="d", parameters=SCHEMA, method="POST", path="/x")
    # Port 9 (discard) on a documentation address: reaching it at all would fail the assertion below.
    service = ToolService(ServiceDescriptor("svc", None, (spec,)), base_url="http://192.0.2.1:9")

    async def dispatch() -> ToolOutcome:
        async with ToolDispatcher(ToolCatalog([service]), timeout_s=5.0) as dispatcher:
            return await dispatcher.dispatch(spec, arguments)

    outcome = asyncio.run(dispatch())
    assert outcome.error_code == "tool_arguments_invalid"
    assert json.loads(outcome.content)["error"] == "tool_arguments_invalid"


# ------------------------------------------------------------------------------------------------ exports


def test_public_names_are_pinned() -> None:
    assert sorted(tools.__all__) == sorted(
        [
            "DESCRIPTOR_INVALID",
            "ENV_NAME",
            "FUNCTION_SEPARATOR",
            "MAX_DESCRIPTOR_BYTES",
            "MAX_FUNCTION_NAME",
            "MAX_TOOLS_PER_SERVICE",
            "SERVICE_NAME",
            "TOOL_NAME",
            "ServiceDescriptor",
            "ToolCatalog",
            "ToolService",
            "ToolSpec",
            "function_name_for",
            "parse_descriptor",
            "qualified_name_for",
        ]
    )
    assert sorted(tool_dispatch.__all__) == [
        "MAX_ARGUMENT_BYTES",
        "MAX_DETAIL_CHARS",
        "ToolDispatcher",
        "ToolErrorCode",
        "ToolOutcome",
    ]
    for module in (tools, tool_dispatch):
        for name in module.__all__:
            assert hasattr(module, name)
