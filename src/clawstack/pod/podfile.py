"""Reading and validating a pod: ``claw-pod.yml`` with its ``x-claw`` extensions, ``.env``, and the files it names.

:func:`load_pod` returns a :class:`PodSpec` or raises a :class:`~clawstack.pod.errors.PodError` whose message names
the place (``claw-pod.yml: services.worker.x-claw.run.max-runtime``) and says what to change. It reads; it never
writes. Every rule of the per-run template specification that can be checked without a backend is checked here;
the backend (runner or image) is resolved by :mod:`clawstack.pod.compile`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from clawstack.models.families import SHIPPED_TABLE, FamilyError, FamilyTable
from clawstack.models.policy import DEFAULT_POLICY, REGIONAL_ROUTES, DataPolicy, PolicyError, parse_policy
from clawstack.models.refs import BUILTIN_PREFIXES, PROVIDER_KEY_ENV
from clawstack.pod.chain import ModelSlot, parse_models
from clawstack.pod.errors import PodFileError, ValidationError
from clawstack.pod.interpolate import UnsetVariable, build_environment, interpolate, read_dotenv
from clawstack.pod.values import bounded, mapping, parse_duration_s, parse_size
from clawstack.pod.yamlload import load_yaml

POD_FILE: Final = "claw-pod.yml"
MAX_POD_FILE_BYTES: Final = 1024 * 1024
MAX_CONTRACT_BYTES: Final = 256 * 1024
NAME: Final = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
ENV_NAME: Final = re.compile(r"[A-Z_][A-Z0-9_]*")
TOP_LEVEL: Final = frozenset({"version", "name", "services", "networks", "volumes", "configs", "secrets"})
POD_X_CLAW: Final = frozenset(
    {"pod", "backend", "cllama-defaults", "models-defaults", "model-families", "upstreams", "journal", "data-policy"}
)
PER_RUN_X_CLAW: Final = frozenset(
    {"agent", "lifecycle", "tools", "cllama", "cllama-env", "models", "reasoning-effort", "provider-preferences", "run"}
)
REJECTED_PER_RUN_X_CLAW: Final = ("count", "handles", "invoke", "memory", "surfaces", "skills", "persona", "claw-api")
RUN_KEYS: Final = frozenset(
    {"max-runtime", "max-authority", "max-task-bytes", "max-result-bytes", "memory", "pids", "home", "content"}
)

Backend = Literal["local", "compose"]


@dataclass(frozen=True, slots=True)
class Limits:
    max_runtime_s: int = 1800
    max_authority_s: int = 7200
    max_task_bytes: int = 32768
    max_result_bytes: int = 262144
    memory_bytes: int = 1024**3
    pids: int = 256


@dataclass(frozen=True, slots=True)
class Home:
    mount: str = "/home/task"
    max_bytes: int = 1024**3


PRIVATE_STATE: Final = (".claw-runtime", ".claw-auth", ".claw-runs", ".claw-homes", ".claw-revocations", ".env")
"""The pod's private state (the proxy's configuration and every key, the sign-in store, the ledger and secrets,
every task home, the revocation ledger, the credentials file): no content source may be, contain or lie in it."""


@dataclass(frozen=True, slots=True)
class Content:
    """A read-only reference mount, resolved once at ``claw up`` and pinned by its device and inode: a spawn
    refuses a source that is not that very file or directory any more (a link swapped in, a replaced tree)."""

    source: str  # relative to the pod directory, resolved inside it
    target: str
    device: int
    inode: int


@dataclass(frozen=True, slots=True)
class Template:
    """A ``lifecycle: per-run`` service, validated."""

    name: str
    image: str | None
    build: Any
    contract_file: str
    contract_text: str
    tools: tuple[str, ...]  # the grant as written: service names or service.tool names
    cllama_env: Mapping[str, str]  # merged with cllama-defaults.env; values are credentials
    models: tuple[ModelSlot, ...]
    limits: Limits
    home: Home | None
    content: tuple[Content, ...]

    @property
    def profile(self) -> Literal["stateless", "task_home"]:
        return "task_home" if self.home is not None else "stateless"


@dataclass(frozen=True, slots=True)
class ToolServiceDecl:
    """A long-lived service that publishes a v2 tool descriptor for the proxy to dispatch to."""

    name: str
    describe: str  # the descriptor file, relative to the pod directory
    descriptor: bytes
    endpoint: str


@dataclass(frozen=True, slots=True)
class Upstream:
    base_url: str
    api_key_env: str | None


@dataclass(frozen=True, slots=True)
class PodSpec:
    directory: Path
    name: str
    backend: Backend
    document: Mapping[str, Any]  # the interpolated pod file
    templates: tuple[Template, ...]
    tool_services: tuple[ToolServiceDecl, ...]
    upstreams: Mapping[str, Upstream]
    journal: bool
    data_policy: DataPolicy = DEFAULT_POLICY
    families: FamilyTable = SHIPPED_TABLE
    warnings: tuple[str, ...] = field(default=())  # unset variables interpolated as blank strings


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValidationError("must be a non-empty string", where=where)
    return value


def _inside(pod_dir: Path, relative: str, where: str) -> Path:
    """Resolve ``relative`` inside the pod directory, following symlinks; refuse an escape."""
    if os.path.isabs(relative):
        raise ValidationError(f"{relative!r} must be a path relative to the pod directory", where=where)
    resolved = (pod_dir / relative).resolve()
    if resolved != pod_dir and pod_dir not in resolved.parents:
        raise ValidationError(f"{relative!r} leaves the pod directory", where=where)
    return resolved


def load_pod(directory: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None) -> PodSpec:
    """Read, interpolate and validate the pod in ``directory``."""
    pod_dir = Path(directory).resolve()
    pod_file = pod_dir / POD_FILE
    try:
        raw = pod_file.read_bytes()
    except FileNotFoundError as exc:
        raise PodFileError(f"no {POD_FILE} in {pod_dir}", code="pod_file_missing") from exc
    except OSError as exc:
        raise PodFileError(f"cannot read {POD_FILE}: {exc.strerror}") from exc
    if len(raw) > MAX_POD_FILE_BYTES:
        raise PodFileError(f"{POD_FILE} is larger than {MAX_POD_FILE_BYTES} bytes")
    document = load_yaml(raw, source=POD_FILE)
    process_env = os.environ if environ is None else environ
    unset: list[UnsetVariable] = []
    dotenv = read_dotenv(pod_dir / ".env", environ=process_env, warnings=unset)
    document = interpolate(document, build_environment(dotenv, process_env), source=POD_FILE, warnings=unset)
    return _validate(pod_dir, document, tuple(str(item) for item in unset))


def _validate(pod_dir: Path, document: dict[str, Any], unset: tuple[str, ...]) -> PodSpec:
    for key in document:
        if key not in TOP_LEVEL and not key.startswith("x-"):
            raise ValidationError(f"unknown top-level key {key!r}", where=POD_FILE)
    pod_x = mapping(document.get("x-claw"), f"{POD_FILE}: x-claw")
    for key in pod_x:
        if key not in POD_X_CLAW:
            raise ValidationError(f"unknown key {key!r}", where=f"{POD_FILE}: x-claw")
    name = pod_x.get("pod", pod_dir.name)
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValidationError("must be [a-z0-9][a-z0-9_-]{0,62}", where=f"{POD_FILE}: x-claw.pod")
    backend = pod_x.get("backend", "local")
    if backend not in ("local", "compose"):
        raise ValidationError(
            f"{backend!r} is not a backend: use local or compose", where=f"{POD_FILE}: x-claw.backend"
        )
    journal = pod_x.get("journal", False)
    if not isinstance(journal, bool):
        raise ValidationError("must be true or false", where=f"{POD_FILE}: x-claw.journal")
    defaults = mapping(pod_x.get("cllama-defaults"), f"{POD_FILE}: x-claw.cllama-defaults")
    for key in defaults:
        if key not in ("proxy", "env"):
            raise ValidationError(f"unknown key {key!r}", where=f"{POD_FILE}: x-claw.cllama-defaults")
    _check_cllama(defaults.get("proxy", ["passthrough"]), f"{POD_FILE}: x-claw.cllama-defaults.proxy")
    default_env = _env_map(defaults.get("env"), f"{POD_FILE}: x-claw.cllama-defaults.env")
    models_defaults = mapping(pod_x.get("models-defaults"), f"{POD_FILE}: x-claw.models-defaults")
    upstreams = _upstreams(mapping(pod_x.get("upstreams"), f"{POD_FILE}: x-claw.upstreams"))
    try:
        families = FamilyTable.with_overrides(
            mapping(pod_x.get("model-families"), f"{POD_FILE}: x-claw.model-families")
        )
    except FamilyError as exc:
        raise ValidationError(str(exc), where=f"{POD_FILE}: x-claw.model-families") from None
    try:
        data_policy = parse_policy(pod_x.get("data-policy"), dashed=True)
    except PolicyError as exc:
        raise ValidationError(str(exc), where=f"{POD_FILE}: x-claw.data-policy") from None

    services = mapping(document.get("services"), f"{POD_FILE}: services")
    if not services:
        raise ValidationError("a pod needs at least one service", where=f"{POD_FILE}: services")
    per_run: dict[str, dict[str, Any]] = {}
    tool_services: list[ToolServiceDecl] = []
    for service_name, service in services.items():
        where = f"{POD_FILE}: services.{service_name}"
        if not isinstance(service_name, str) or not NAME.fullmatch(service_name):
            raise ValidationError("service names are [a-z0-9][a-z0-9_-]{0,62}", where=where)
        service = mapping(service, where)
        x_claw = mapping(service.get("x-claw"), f"{where}.x-claw")
        lifecycle = x_claw.get("lifecycle", "service")
        if lifecycle not in ("service", "per-run"):
            raise ValidationError(f"{lifecycle!r} is not a lifecycle: use service or per-run", where=f"{where}.x-claw")
        if lifecycle == "per-run":
            per_run[service_name] = service
            continue
        for key in ("reasoning-effort", "provider-preferences", "run"):
            if key in x_claw:
                raise ValidationError(f"only a lifecycle: per-run service takes {key}", where=f"{where}.x-claw.{key}")
        if "describe" in x_claw:
            tool_services.append(_tool_service(pod_dir, service_name, service, x_claw, backend, where))
    if not per_run:
        raise ValidationError("no service declares x-claw.lifecycle: per-run", where=f"{POD_FILE}: services")
    for service_name, service in services.items():
        master = mapping(service, "").get("x-claw", {}) or {}
        if isinstance(master, dict) and master.get("master") in per_run:
            raise ValidationError(
                f"points at the per-run template {master['master']!r}; a per-run template cannot be a master",
                where=f"{POD_FILE}: services.{service_name}.x-claw.master",
            )
    tools_by_service = {decl.name: decl for decl in tool_services}
    templates = tuple(
        _template(pod_dir, name_, service, default_env, models_defaults, upstreams, families, tools_by_service)
        for name_, service in per_run.items()
    )
    _check_shared_env(templates)
    return PodSpec(
        directory=pod_dir,
        name=name,
        backend=backend,
        document=document,
        templates=templates,
        tool_services=tuple(tool_services),
        upstreams=upstreams,
        data_policy=data_policy,
        families=families,
        journal=journal,
        warnings=unset,
    )


def _check_cllama(value: Any, where: str) -> None:
    values = value if isinstance(value, list) else [value]
    if not values or any(item != "passthrough" for item in values):
        raise ValidationError("the only proxy mode is passthrough", where=where)


def _env_map(value: Any, where: str) -> dict[str, str]:
    env = mapping(value, where)
    out: dict[str, str] = {}
    for key, item in env.items():
        if not isinstance(key, str) or not ENV_NAME.fullmatch(key):
            raise ValidationError(f"{key!r} is not an environment variable name", where=where)
        if item is None or isinstance(item, dict | list):
            raise ValidationError(f"{key} must have a string value", where=where)
        out[key] = str(item)
    return out


def _upstreams(raw: dict[str, Any]) -> dict[str, Upstream]:
    out = {}
    for prefix, value in raw.items():
        where = f"{POD_FILE}: x-claw.upstreams.{prefix}"
        if not isinstance(prefix, str) or not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,31}", prefix):
            raise ValidationError("upstream prefixes are [a-z0-9-], up to 32 characters", where=where)
        item = mapping(value, where)
        if prefix in BUILTIN_PREFIXES:
            out[prefix] = _regional_route(prefix, item, where)
            continue
        for key in item:
            if key not in ("base-url", "api-key-env"):
                raise ValidationError(f"unknown key {key!r}", where=where)
        base_url = _string(item.get("base-url"), f"{where}.base-url").rstrip("/")
        if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", base_url):
            raise ValidationError("must be an http(s) URL without query or fragment", where=f"{where}.base-url")
        key_env = item.get("api-key-env")
        if key_env is not None and (not isinstance(key_env, str) or not ENV_NAME.fullmatch(key_env)):
            raise ValidationError("must be an environment variable name", where=f"{where}.api-key-env")
        out[prefix] = Upstream(base_url=base_url, api_key_env=key_env)
    return out


def _regional_route(prefix: str, item: dict[str, Any], where: str) -> Upstream:
    """A built-in provider takes only ``region``: one of its regional routes (see
    :data:`~clawstack.models.policy.REGIONAL_ROUTES`), which is evidence for the data policy of where it
    processes."""
    routes = {region: url for url, region in REGIONAL_ROUTES.get(prefix, {}).items()}
    if set(item) != {"region"}:
        raise ValidationError(
            f"{prefix!r} is a built-in provider: it takes only region"
            + (f" ({', '.join(sorted(routes))})" if routes else " and has no regional route")
            + "; declare a self-hosted upstream under another prefix",
            where=where,
        )
    if item["region"] not in routes:
        known = ", ".join(sorted(routes)) or "none"
        raise ValidationError(f"{prefix} has no regional route {item['region']!r} (known: {known})", where=where)
    return Upstream(base_url=routes[item["region"]], api_key_env=PROVIDER_KEY_ENV[prefix])


def _tool_service(
    pod_dir: Path, name: str, service: dict[str, Any], x_claw: dict[str, Any], backend: str, where: str
) -> ToolServiceDecl:
    describe = _string(x_claw.get("describe"), f"{where}.x-claw.describe")
    path = _inside(pod_dir, describe, f"{where}.x-claw.describe")
    try:
        descriptor = path.read_bytes()
    except OSError as exc:
        raise ValidationError(
            f"cannot read the tool descriptor {describe!r}", where=f"{where}.x-claw.describe"
        ) from exc
    endpoint = x_claw.get("endpoint")
    if endpoint is None and backend == "compose":
        exposed = service.get("expose") or []
        if not exposed:
            raise ValidationError("a tool service needs x-claw.endpoint or an expose port", where=where)
        endpoint = f"http://{name}:{str(exposed[0]).split('/')[0]}"
    endpoint = _string(endpoint, f"{where}.x-claw.endpoint").rstrip("/")
    if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", endpoint):
        raise ValidationError("must be an http(s) URL", where=f"{where}.x-claw.endpoint")
    return ToolServiceDecl(name=name, describe=describe, descriptor=descriptor, endpoint=endpoint)


def _template(
    pod_dir: Path,
    name: str,
    service: dict[str, Any],
    default_env: dict[str, str],
    models_defaults: dict[str, Any],
    upstreams: Mapping[str, Upstream],
    families: FamilyTable,
    tools_by_service: Mapping[str, ToolServiceDecl],
) -> Template:
    where = f"{POD_FILE}: services.{name}"
    if "environment" in service:
        raise ValidationError(
            "a per-run worker takes no Compose environment; give the proxy its credentials in x-claw.cllama-env",
            where=f"{where}.environment",
        )
    extra = sorted(key for key in service if key not in ("image", "build", "x-claw"))
    if extra:
        raise ValidationError(
            f"a per-run service may declare only image or build as Compose keys; remove {', '.join(extra)}",
            where=where,
        )
    if "image" not in service and "build" not in service:
        # Both may be given: claw up then builds the image and tags it with image:.
        raise ValidationError("a per-run service declares image, build or both", where=where)
    x_claw = mapping(service.get("x-claw"), f"{where}.x-claw")
    for key in REJECTED_PER_RUN_X_CLAW:
        if key in x_claw:
            raise ValidationError(f"{key} is not allowed on a per-run service", where=f"{where}.x-claw.{key}")
    if "master" in x_claw:
        raise ValidationError("master is not allowed on a per-run service", where=f"{where}.x-claw.master")
    for key in x_claw:
        if key not in PER_RUN_X_CLAW:
            raise ValidationError(f"unknown key {key!r}", where=f"{where}.x-claw")
    _check_cllama(x_claw.get("cllama", "passthrough"), f"{where}.x-claw.cllama")

    agent = _string(x_claw.get("agent"), f"{where}.x-claw.agent")
    agent_path = _inside(pod_dir, agent, f"{where}.x-claw.agent")
    try:
        contract_bytes = agent_path.read_bytes()
    except OSError as exc:
        raise ValidationError(f"cannot read the agent contract {agent!r}", where=f"{where}.x-claw.agent") from exc
    if len(contract_bytes) > MAX_CONTRACT_BYTES:
        raise ValidationError(
            f"the agent contract is larger than {MAX_CONTRACT_BYTES} bytes", where=f"{where}.x-claw.agent"
        )
    try:
        contract_text = contract_bytes.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValidationError("the agent contract is not UTF-8", where=f"{where}.x-claw.agent") from exc

    env = {**default_env, **_env_map(x_claw.get("cllama-env"), f"{where}.x-claw.cllama-env")}
    tools = _grant(x_claw.get("tools"), tools_by_service, f"{where}.x-claw.tools")
    run = mapping(x_claw.get("run"), f"{where}.x-claw.run")
    for key in run:
        if key not in RUN_KEYS:
            raise ValidationError(f"unknown key {key!r}", where=f"{where}.x-claw.run")
    limits = _limits(run, f"{where}.x-claw.run")
    home = _home(run.get("home"), f"{where}.x-claw.run.home") if "home" in run else None
    content = _content(pod_dir, run.get("content"), f"{where}.x-claw.run.content")
    if content and home is None:
        raise ValidationError("content mounts need a task home (x-claw.run.home)", where=f"{where}.x-claw.run.content")
    if home is not None:
        _check_mounts(home, content, f"{where}.x-claw.run")

    models = parse_models(x_claw, models_defaults, upstreams, env, families, where)
    if home is not None and any(m.reasoning_effort or m.provider_preferences for m in models):
        key = "reasoning-effort" if any(m.reasoning_effort for m in models) else "provider-preferences"
        raise ValidationError(
            f"the Hermes task-home profile does not support {key} yet; remove it from this template",
            where=f"{where}.x-claw.{key}",
        )
    return Template(
        name=name,
        image=service.get("image"),
        build=service.get("build"),
        contract_file=agent,
        contract_text=contract_text,
        tools=tools,
        cllama_env=env,
        models=models,
        limits=limits,
        home=home,
        content=content,
    )


def _grant(value: Any, tools_by_service: Mapping[str, ToolServiceDecl], where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValidationError("must be a list of tool services or service.tool names", where=where)
    for item in value:
        service = item.split(".", 1)[0]
        if service not in tools_by_service:
            raise ValidationError(
                f"{item!r} names no tool service of this pod (a service with x-claw.describe)", where=where
            )
    if len(set(value)) != len(value):
        raise ValidationError("names repeat", where=where)
    return tuple(value)


def _limits(run: dict[str, Any], where: str) -> Limits:
    base = Limits()
    runtime = parse_duration_s(run["max-runtime"], where=f"{where}.max-runtime") if "max-runtime" in run else None
    authority = (
        parse_duration_s(run["max-authority"], where=f"{where}.max-authority") if "max-authority" in run else None
    )
    limits = Limits(
        max_runtime_s=bounded(runtime or base.max_runtime_s, 1, 86400, where=f"{where}.max-runtime", unit="s"),
        max_authority_s=bounded(
            authority or base.max_authority_s, 1, 7 * 86400, where=f"{where}.max-authority", unit="s"
        ),
        max_task_bytes=bounded(
            _int(run.get("max-task-bytes", base.max_task_bytes), f"{where}.max-task-bytes"),
            1,
            49152,
            where=f"{where}.max-task-bytes",
        ),
        max_result_bytes=bounded(
            _int(run.get("max-result-bytes", base.max_result_bytes), f"{where}.max-result-bytes"),
            1,
            16 * 1024**2,
            where=f"{where}.max-result-bytes",
        ),
        memory_bytes=bounded(
            parse_size(run["memory"], where=f"{where}.memory") if "memory" in run else base.memory_bytes,
            64 * 1024**2,
            64 * 1024**3,
            where=f"{where}.memory",
            unit=" bytes",
        ),
        pids=bounded(_int(run.get("pids", base.pids), f"{where}.pids"), 16, 32768, where=f"{where}.pids"),
    )
    if limits.max_authority_s < limits.max_runtime_s:
        raise ValidationError("must be at least max-runtime, or no run could finish", where=f"{where}.max-authority")
    return limits


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError("must be a whole number", where=where)
    return value


def _home(value: Any, where: str) -> Home:
    home = mapping(value, where)
    for key in home:
        if key not in ("mount", "max-bytes"):
            raise ValidationError(f"unknown key {key!r}", where=where)
    defaults = Home()
    mount = home.get("mount", defaults.mount)
    if not isinstance(mount, str) or not mount.startswith("/") or mount == "/" or ".." in mount.split("/"):
        raise ValidationError("must be an absolute path in the worker, not /", where=f"{where}.mount")
    max_bytes = home.get("max-bytes", defaults.max_bytes)
    size = parse_size(max_bytes, where=f"{where}.max-bytes")
    return Home(mount=mount.rstrip("/"), max_bytes=bounded(size, 1024**2, 1024**4, where=f"{where}.max-bytes"))


RESERVED_PATHS: Final = (
    "/tmp",  # noqa: S108 - a path inside the worker, not one this process uses
    "/proc",
    "/dev",
    "/run",
    "/opt/claw",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
)
"""What a worker's sandbox or container provides itself: a home or a content mount may not cover any of it."""


def _within(path: str, other: str) -> bool:
    return path == other or path.startswith(other.rstrip("/") + "/") or other.startswith(path.rstrip("/") + "/")


def _check_mounts(home: Home, content: tuple[Content, ...], where: str) -> None:
    """The home and each content target are apart from one another and from the paths the worker's sandbox
    provides (a mount over one would hide it, or be hidden)."""
    if home.mount == "" or any(_within(home.mount, reserved) for reserved in RESERVED_PATHS):
        raise ValidationError(
            f"{home.mount or '/'!r} is a path the worker's sandbox provides", where=f"{where}.home.mount"
        )
    for index, item in enumerate(content):
        target_where = f"{where}.content[{index}].target"
        if _within(item.target, home.mount):
            raise ValidationError("a content target may not be the home or inside it (or hold it)", where=target_where)
        if any(_within(item.target, reserved) for reserved in RESERVED_PATHS):
            raise ValidationError(f"{item.target!r} is a path the worker's sandbox provides", where=target_where)


def _content(pod_dir: Path, value: Any, where: str) -> tuple[Content, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ValidationError("must be a list of {source, target}", where=where)
    out = []
    targets = set()
    for index, item in enumerate(value):
        item_where = f"{where}[{index}]"
        entry = mapping(item, item_where)
        if set(entry) != {"source", "target"}:
            raise ValidationError("each entry has exactly source and target", where=item_where)
        source = _string(entry["source"], f"{item_where}.source")
        resolved = _inside(pod_dir, source, f"{item_where}.source")
        try:
            pinned = os.stat(resolved)
        except FileNotFoundError:
            raise ValidationError(f"{source!r} does not exist", where=f"{item_where}.source") from None
        except OSError as exc:
            raise ValidationError(f"{source!r} cannot be read ({exc.strerror})", where=f"{item_where}.source") from None
        _check_not_private(pod_dir, source, resolved, f"{item_where}.source")
        target = _string(entry["target"], f"{item_where}.target")
        if not target.startswith("/") or target == "/" or ".." in target.split("/"):
            raise ValidationError("must be an absolute path in the worker, not /", where=f"{item_where}.target")
        if target in targets:
            raise ValidationError("targets repeat", where=f"{item_where}.target")
        targets.add(target)
        out.append(
            Content(
                source=str(resolved.relative_to(pod_dir)),
                target=target.rstrip("/"),
                device=pinned.st_dev,
                inode=pinned.st_ino,
            )
        )
    return tuple(out)


def _check_not_private(pod_dir: Path, source: str, resolved: Path, where: str) -> None:
    """Refuse the pod directory itself and any source that is, contains or lies in the pod's private state."""
    if resolved == pod_dir:
        raise ValidationError(
            f"{source!r} is the pod directory, which holds its private state; name a directory inside it",
            where=where,
            code="content_private",
        )
    for name in PRIVATE_STATE:
        # As named and as resolved: a private file that is a link to somewhere else exposes where it leads.
        for private in dict.fromkeys((pod_dir / name, (pod_dir / name).resolve())):
            if resolved == private or private in resolved.parents or resolved in private.parents:
                raise ValidationError(
                    f"{source!r} exposes the pod's private state ({name}); name a directory apart from it",
                    where=where,
                    code="content_private",
                )


def _check_shared_env(templates: tuple[Template, ...]) -> None:
    """The proxy holds one value per credential name; two templates may not disagree about it."""
    seen: dict[str, tuple[str, str]] = {}
    for template in templates:
        for key, value in template.cllama_env.items():
            if key in seen and seen[key][1] != value:
                raise ValidationError(
                    f"{key} has different values in {seen[key][0]} and {template.name}; the proxy holds one per name",
                    where=f"{POD_FILE}: services.{template.name}.x-claw.cllama-env",
                )
            seen.setdefault(key, (template.name, value))


__all__ = [
    "POD_FILE",
    "PRIVATE_STATE",
    "Content",
    "Home",
    "Limits",
    "ModelSlot",
    "PodSpec",
    "Template",
    "ToolServiceDecl",
    "Upstream",
    "load_pod",
]
