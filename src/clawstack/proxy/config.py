"""The proxy's configuration: listeners, directories, credentials, upstreams, tool services and routing limits.

The file is JSON or YAML (by extension), validated strictly: unknown keys are refused with the key's path. It is
trusted configuration: it may hold credentials in ``env`` (the pod's ``cllama-env``), so ``claw up`` writes it
0600 inside a 0700 directory. Credentials are named by environment-variable names everywhere else and resolved
from ``env`` first, then from the proxy's own process environment; never from a request.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from clawstack.common.strictjson import StrictJSONError
from clawstack.common.strictjson import loads as strict_loads
from clawstack.models.policy import DataPolicy, PolicyError, parse_policy
from clawstack.models.refs import CredentialClass
from clawstack.proxy.errors import ConfigError
from clawstack.proxy.plan.chatgpt import BACKEND_URL, ISSUER

ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
MAX_CONFIG_BYTES = 4 * 1024 * 1024


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Listener(_Strict):
    """Where one API listens: loopback TCP, a Unix socket, or both."""

    host: str = "127.0.0.1"
    port: int | None = Field(default=None, ge=0, le=65535)
    unix_socket: str | None = None

    @model_validator(mode="after")
    def _somewhere(self) -> Listener:
        if self.port is None and self.unix_socket is None:
            raise ValueError("set port, unix_socket, or both")
        return self


class Upstream(_Strict):
    """An OpenAI-compatible upstream for one provider prefix."""

    base_url: str
    api_key_env: str | None = None
    credential_class: CredentialClass = "api_key"

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", value):
            raise ValueError("must be an http(s) URL without query or fragment")
        return value.rstrip("/")

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not ENV_NAME.fullmatch(value):
            raise ValueError("must be an environment variable name")
        return value


class ToolServiceConfig(_Strict):
    """A tool service: its base URL and its v2 descriptor (inline or from a file beside the config)."""

    base_url: str
    descriptor: dict[str, Any] | None = None
    descriptor_file: str | None = None

    @model_validator(mode="after")
    def _one_descriptor(self) -> ToolServiceConfig:
        if (self.descriptor is None) == (self.descriptor_file is None):
            raise ValueError("set exactly one of descriptor and descriptor_file")
        return self


class Journal(_Strict):
    """The opt-in trace journal."""

    directory: str
    capture_content: bool = False


class Routing(_Strict):
    """Limits of chain routing and tool loops."""

    first_byte_timeout_s: float = Field(default=60.0, gt=0, le=3600)
    request_timeout_s: float = Field(default=600.0, gt=0, le=86400)
    retry_after_cap_s: float = Field(default=60.0, ge=0, le=3600)
    dead_key_recheck_s: float = Field(default=600.0, ge=0, le=86400)
    max_tool_rounds: int = Field(default=8, ge=1, le=64)
    tool_timeout_s: float = Field(default=30.0, gt=0, le=600)
    max_request_bytes: int = Field(default=4 * 1024 * 1024, ge=1024, le=64 * 1024 * 1024)


class PlanRoute(_Strict):
    """A plan route (``chatgpt/<model>``): the issuer it signs in with and the plan backend it calls.

    ``ca_file`` is an extra CA bundle that only this route's TLS (sign-in, refresh, backend) trusts, instead of
    the system's CAs; it exists for tests with a synthetic identity provider.
    """

    issuer: str = ISSUER
    base_url: str = BACKEND_URL
    ca_file: str | None = None
    limit_rest_s: float = Field(default=900.0, ge=1, le=86400)

    @field_validator("issuer", "base_url")
    @classmethod
    def _https_url(cls, value: str) -> str:
        if not re.fullmatch(r"https://[^\s/?#]+(/[^\s?#]*)?", value):
            raise ValueError("must be an https URL without query or fragment")
        return value.rstrip("/")


class ProxyConfig(_Strict):
    """The whole configuration of ``claw proxy serve``."""

    worker: Listener
    operator: Listener
    operator_token_env: str = "CLAW_PROXY_OPERATOR_TOKEN"  # noqa: S105 (a variable name, not a token)
    state_dir: str
    revocation_dir: str | None = None
    revocation_max_bytes: int = Field(default=16 * 1024 * 1024, ge=4096, le=1024 * 1024 * 1024)
    journal: Journal | None = None
    env: dict[str, str] = Field(default_factory=dict)
    upstreams: dict[str, Upstream] = Field(default_factory=dict)
    tools: dict[str, ToolServiceConfig] = Field(default_factory=dict)
    routing: Routing = Field(default_factory=Routing)
    auth_dir: str | None = None  # the plan sign-in store, <pod>/.claw-auth/subscriptions
    plan_routes: dict[Literal["chatgpt"], PlanRoute] = Field(default_factory=dict)
    data_policy: dict[str, Any] | Literal["permissive"] | None = None  # None: the default (US/EU, no training,
    # no retention); see clawstack.models.policy

    @field_validator("data_policy")
    @classmethod
    def _policy(cls, value: dict[str, Any] | str | None) -> dict[str, Any] | str | None:
        try:
            parse_policy(value)
        except PolicyError as exc:
            raise ValueError(str(exc)) from None
        return value

    @property
    def policy(self) -> DataPolicy:
        """The data policy this proxy enforces."""
        return parse_policy(self.data_policy)

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not ENV_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an environment variable name")
        return value

    @field_validator("upstreams")
    @classmethod
    def _prefixes(cls, value: dict[str, Upstream]) -> dict[str, Upstream]:
        for prefix in value:
            if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,31}", prefix):
                raise ValueError(f"{prefix!r} is not a provider prefix ([a-z0-9-], up to 32)")
        return value

    def resolve_env(self, name: str, environ: Mapping[str, str] | None = None) -> str | None:
        """A credential by variable name: the config's ``env`` first, then the process environment."""
        if name in self.env:
            return self.env[name] or None
        source = os.environ if environ is None else environ
        return source.get(name) or None


def _error_path(error: Mapping[str, Any]) -> str:
    return ".".join(str(part) for part in error.get("loc", ())) or "(top level)"


def parse_config(data: Mapping[str, Any], *, base_dir: Path, environ: Mapping[str, str] | None = None) -> ProxyConfig:
    """Validate a parsed config. Relative paths are resolved against ``base_dir``."""
    merged = dict(data)
    source = os.environ if environ is None else environ
    if merged.get("revocation_dir") is None and source.get("CLAW_REVOCATION_DIR"):
        merged["revocation_dir"] = source["CLAW_REVOCATION_DIR"]
    try:
        config = ProxyConfig.model_validate(merged)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ConfigError(f"proxy config: {_error_path(first)}: {first['msg']}") from exc
    if config.revocation_dir is None:
        raise ConfigError("proxy config: revocation_dir is required (or set CLAW_REVOCATION_DIR)")

    def absolute(path: str) -> str:
        return str(base_dir / path) if not os.path.isabs(path) else path

    updates: dict[str, Any] = {
        "state_dir": absolute(config.state_dir),
        "revocation_dir": absolute(config.revocation_dir),
    }
    if config.journal is not None:
        updates["journal"] = config.journal.model_copy(update={"directory": absolute(config.journal.directory)})
    if config.worker.unix_socket:
        updates["worker"] = config.worker.model_copy(update={"unix_socket": absolute(config.worker.unix_socket)})
    if config.operator.unix_socket:
        updates["operator"] = config.operator.model_copy(update={"unix_socket": absolute(config.operator.unix_socket)})
    tools = {}
    for name, service in config.tools.items():
        if service.descriptor_file is not None:
            service = service.model_copy(update={"descriptor_file": absolute(service.descriptor_file)})
        tools[name] = service
    updates["tools"] = tools
    if config.auth_dir is not None:
        updates["auth_dir"] = absolute(config.auth_dir)
    updates["plan_routes"] = {
        name: route if route.ca_file is None else route.model_copy(update={"ca_file": absolute(route.ca_file)})
        for name, route in config.plan_routes.items()
    }
    return config.model_copy(update=updates)


def load_config(path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None) -> ProxyConfig:
    """Read and validate a config file (``.yml``/``.yaml`` as YAML, anything else as strict JSON)."""
    file = Path(path)
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise ConfigError(f"proxy config: cannot read {file.name}: {exc.strerror}") from exc
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"proxy config: {file.name} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        if file.suffix in (".yml", ".yaml"):
            data = yaml.safe_load(raw)
        else:
            data = strict_loads(raw, max_bytes=MAX_CONFIG_BYTES)
    except StrictJSONError as exc:
        raise ConfigError(f"proxy config: {file.name} is not valid JSON: {exc.message}") from exc
    except yaml.YAMLError as exc:
        # The YAML error text quotes the offending line, which may hold a credential: report the position only.
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"proxy config: {file.name} is not valid YAML{where}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"proxy config: {file.name} must hold an object")
    return parse_config(data, base_dir=file.parent.resolve(), environ=environ)


__all__ = [
    "Journal",
    "Listener",
    "PlanRoute",
    "ProxyConfig",
    "Routing",
    "ToolServiceConfig",
    "Upstream",
    "load_config",
    "parse_config",
]
