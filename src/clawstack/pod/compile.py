"""Compiling a validated pod into run templates, the proxy's private context, and (under compose) a Compose file.

Everything is built in memory first; :mod:`clawstack.pod.artifacts` writes it only when the whole pod compiled.

A template's ``id`` is the spec digest of its whole document (runner pin, contract, grant, limits, network, model
chain, profile, content, data policy and ``context_digest``); ``context_digest`` is the digest of the template's
proxy context with every credential replaced by its variable name. So rotating only a credential keeps the id, and
changing an endpoint, a tool, a model or a policy changes it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from clawstack.common.digest import sha256_digest, spec_digest
from clawstack.models.descriptors import DescriptorError, ServiceDescriptor, parse_descriptor
from clawstack.models.policy import PLAN_POLICY_ENDPOINT
from clawstack.models.refs import PLAN_PREFIXES, PROVIDER_BASE_URLS
from clawstack.pod.errors import BackendError, ValidationError
from clawstack.pod.hermes import hermes_installation, hermes_pin
from clawstack.pod.imagebuild import WORKER_IMAGE
from clawstack.pod.images import ImageInfo, inspect_image
from clawstack.pod.netguard import runs_network
from clawstack.pod.podfile import POD_FILE, PodSpec, Template
from clawstack.worker.container import wrapper_digest

TEMPLATE_SCHEMA: Final = 1
LOCAL_RUNNERS: Final = {"clawstack/oneshot": "oneshot", "clawstack/hermes": "hermes"}
STATELESS_TYPES: Final = frozenset({"oneshot"})
TASK_HOME_TYPES: Final = frozenset({"hermes"})
HERMES_MODULE: Final = "clawstack.worker.hermes"

ImageInspector = Callable[[str], ImageInfo]


@dataclass(frozen=True, slots=True)
class CompiledTemplate:
    name: str
    document: Mapping[str, Any]  # the template file, ``id`` included
    context: Mapping[str, Any]  # the template's proxy context, credentials redacted

    @property
    def id(self) -> str:
        return str(self.document["id"])


@dataclass(frozen=True, slots=True)
class CompiledPod:
    spec: PodSpec
    templates: tuple[CompiledTemplate, ...]
    descriptors: Mapping[str, bytes]  # tool service -> descriptor bytes, for the proxy
    credentials: Mapping[str, str]  # every cllama-env value, by name: the proxy's private env
    network: Mapping[str, Any]

    @property
    def digest(self) -> str:
        """A digest of everything compiled, credentials included (so a rotation is a change to apply)."""
        return spec_digest(
            {
                "templates": [t.document for t in self.templates],
                "descriptors": {k: sha256_digest(v) for k, v in self.descriptors.items()},
                "credentials": {k: sha256_digest(v.encode()) for k, v in self.credentials.items()},
            }
        )


def module_files(modules: tuple[str, ...]) -> list[tuple[str, Path]]:
    files = []
    for name in sorted(modules):
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise BackendError(f"the runner module {name} is not installed")
        files.append((name, Path(spec.origin)))
    return files


def runner_digest(modules: tuple[str, ...]) -> str:
    """A digest of exactly what a built-in runner executes: the interpreter's version and every module file."""
    hasher = hashlib.sha256(f"python {sys.version}\n".encode())
    for name, path in module_files(modules):
        hasher.update(f"{name}\n".encode())
        hasher.update(hashlib.sha256(path.read_bytes()).hexdigest().encode())
    return "sha256:" + hasher.hexdigest()


def _runner_modules(runner_type: str) -> tuple[str, ...]:
    module = HERMES_MODULE if runner_type == "hermes" else "clawstack.worker.oneshot"
    return tuple(importlib.import_module(module).RUNNER_MODULES)


def installed_runner_digest(runner_type: str) -> str | None:
    """The digest of the built-in runner ``runner_type`` as installed now (``None`` when it is not installed):
    what a local template's ``runner.digest`` pinned at ``claw up``, checked again before each worker starts. The
    task-home runner's digest covers the Hermes installation it runs too (:func:`clawstack.pod.hermes.hermes_pin`)."""
    try:
        digest = runner_digest(_runner_modules(runner_type))
    except (ImportError, OSError):
        return None
    if runner_type != "hermes":
        return digest
    pin = hermes_pin()
    return None if pin is None else spec_digest({"wrapper": digest, "hermes": pin})


def _local_runner(template: Template, where: str) -> dict[str, Any]:
    if template.build is not None or template.image not in LOCAL_RUNNERS:
        raise BackendError(
            "under the local backend a per-run service's image names a built-in runner: clawstack/oneshot "
            "(stateless) or clawstack/hermes (task home); to run an image of your own, set x-claw.backend: compose",
            where=where,
        )
    runner_type = LOCAL_RUNNERS[template.image]
    _check_profile(template, runner_type, where)
    if runner_type == "hermes":
        try:
            hermes_installation()
        except BackendError as exc:
            raise BackendError(exc.message, where=where, code=exc.code) from exc
    digest = installed_runner_digest(runner_type)
    if digest is None:
        raise BackendError(f"the {template.image} runner is not installed on this host", where=where)
    return {"image": template.image, "type": runner_type, "digest": digest}


def template_image(spec: PodSpec, template: Template) -> str:
    """The image a compose template runs: its ``image:``, else the name ``docker compose build`` gives a built
    service (``<pod>-<service>``)."""
    return template.image if template.image is not None else f"{spec.name}-{template.name}"


def _compose_runner(spec: PodSpec, template: Template, where: str, inspector: ImageInspector) -> dict[str, Any]:
    image = template_image(spec, template)
    try:
        info = inspector(image)
    except BackendError as exc:
        if exc.code != "image_not_found" or template.build is None:
            raise
        raise BackendError(
            f"the image {image} of this build: service is not built yet; claw up builds it (claw up --check "
            "never builds)",
            where=where,
            code="image_not_found",
        ) from exc
    if info.volumes:
        raise BackendError(
            f"the image {image} declares VOLUME {', '.join(info.volumes)}; a per-run worker has no "
            "persistent storage: rebuild it without VOLUME",
            where=where,
        )
    if info.claw_type is None:
        raise BackendError(
            f"the image {image} does not say its runner type; set CLAW_TYPE (oneshot or hermes)",
            where=where,
        )
    if info.claw_type == "picoclaw":
        raise BackendError(
            f"the image {image} is a PicoClaw runner (CLAW_TYPE picoclaw), which clawstack does not run: "
            f"build the worker FROM {WORKER_IMAGE} (CLAW_TYPE oneshot), whose one-shot runner honours the same "
            "contract",
            where=where,
            code="runner_unsupported",
        )
    _check_profile(template, info.claw_type, where)
    runner: dict[str, Any] = {"image": image, "image_id": info.image_id, "type": info.claw_type}
    if info.claw_type == "oneshot":
        runner["wrapper"] = wrapper_digest()
    if info.claw_type == "hermes":
        # A task-home run's forwarder and meter run clawstack's own worker image, pinned with the template.
        try:
            runner["helper_image_id"] = inspector(WORKER_IMAGE).image_id
        except BackendError as exc:
            raise BackendError(
                f"a task-home template needs {WORKER_IMAGE} for its runs' forwarder and meter: run claw images build",
                where=where,
                code=exc.code,
            ) from exc
    return runner


def _check_profile(template: Template, runner_type: str, where: str) -> None:
    if template.profile == "stateless" and runner_type not in STATELESS_TYPES:
        raise BackendError(
            f"the stateless profile supports the one-shot runner only, not {runner_type}; add x-claw.run.home "
            "for a task-home template, or use a one-shot runner",
            where=where,
        )
    if template.profile == "task_home" and runner_type not in TASK_HOME_TYPES:
        raise BackendError(
            f"the task-home profile supports the Hermes runner only, not {runner_type}; use a Hermes runner "
            "or remove x-claw.run.home",
            where=where,
        )


def _expand_grant(template: Template, descriptors: Mapping[str, ServiceDescriptor], where: str) -> list[str]:
    granted: set[str] = set()
    for item in template.tools:
        service, _, tool = item.partition(".")
        names = {spec.qualified for spec in descriptors[service].tools}
        if tool:
            if item not in names:
                raise ValidationError(f"{item!r} is not a tool of {service}", where=f"{where}.x-claw.tools")
            granted.add(item)
        else:
            granted |= names
    return sorted(granted)


def entry_endpoint(spec: PodSpec, prefix: str) -> str:
    """The endpoint a chain entry's provider is reached at, as the data policy names it."""
    if prefix in spec.upstreams:
        return spec.upstreams[prefix].base_url
    if prefix in PLAN_PREFIXES:
        return PLAN_POLICY_ENDPOINT
    return PROVIDER_BASE_URLS[prefix]


def _check_data_policy(spec: PodSpec, template: Template, where: str) -> None:
    """Under a constrained policy every chain entry needs evidence for its provider at its endpoint."""
    problems = []
    for m in template.models:
        endpoint = entry_endpoint(spec, m.prefix)
        lacking = spec.data_policy.missing(m.prefix, endpoint)
        if lacking:
            problems.append(f"{m.slot} {m.ref} (provider {m.prefix} at {endpoint}) lacks {', '.join(lacking)}")
    if problems:
        raise ValidationError(
            "the data policy admits no chain entry without evidence for its provider and endpoint: "
            + "; ".join(problems)
            + ". Attest what the provider guarantees in x-claw.data-policy.attestations, use a regional route, "
            "or set x-claw.data-policy: permissive",
            where=f"{where}.x-claw.models",
            code="data_policy_violation",
        )


def compile_pod(spec: PodSpec, *, inspector: ImageInspector = inspect_image) -> CompiledPod:
    """Compile every template; raise a :class:`~clawstack.pod.errors.PodError` on the first problem."""
    descriptors: dict[str, ServiceDescriptor] = {}
    for decl in spec.tool_services:
        try:
            descriptors[decl.name] = parse_descriptor(decl.name, decl.descriptor)
        except DescriptorError as exc:
            raise ValidationError(exc.message, where=f"{POD_FILE}: services.{decl.name}.x-claw.describe") from exc
    endpoints = {decl.name: decl.endpoint for decl in spec.tool_services}
    network = (
        {"name": runs_network(spec.name).name, "internal": True}
        if spec.backend == "compose"
        else {"name": "sandbox", "mode": "proxy-only"}
    )
    templates = []
    credentials: dict[str, str] = {}
    for template in spec.templates:
        where = f"{POD_FILE}: services.{template.name}"
        runner = (
            _compose_runner(spec, template, where, inspector)
            if spec.backend == "compose"
            else _local_runner(template, where)
        )
        _check_data_policy(spec, template, where)
        tools = _expand_grant(template, descriptors, where)
        services_used = sorted({name.split(".", 1)[0] for name in tools})
        for service in services_used:
            auth_env = descriptors[service].auth_env
            if auth_env is not None and not template.cllama_env.get(auth_env, "").strip():
                raise ValidationError(
                    f"the tool service {service} needs {auth_env}: declare it in x-claw.cllama-env (or "
                    "cllama-defaults.env) with a value",
                    where=f"{where}.x-claw.cllama-env",
                )
        credentials.update(template.cllama_env)
        models = [
            {
                "slot": m.slot,
                "ref": m.ref,
                **({"reasoning_effort": m.reasoning_effort} if m.reasoning_effort else {}),
                **({"provider_preferences": dict(m.provider_preferences)} if m.provider_preferences else {}),
                **({"requested": m.requested} if m.requested else {}),
                **({"needs_signin": True} if m.needs_signin else {}),
            }
            for m in template.models
        ]
        context = {
            "template": template.name,
            "models": models,
            "tools": {
                service: {
                    "endpoint": endpoints[service],
                    "descriptor_sha256": sha256_digest(
                        next(d.descriptor for d in spec.tool_services if d.name == service)
                    ),
                    "auth_env": descriptors[service].auth_env,
                }
                for service in services_used
            },
            "upstreams": {
                prefix: {"base_url": up.base_url, "api_key_env": up.api_key_env}
                for prefix, up in sorted(spec.upstreams.items())
                if any(m.ref.startswith(prefix + "/") for m in template.models)
            },
            "credentials": sorted(template.cllama_env),  # names only: a rotation keeps the digest
            "journal": spec.journal,  # whether the proxy keeps a trace of this template's calls
            "data_policy": spec.data_policy.to_config(),
        }
        document: dict[str, Any] = {
            "schema": TEMPLATE_SCHEMA,
            "name": template.name,
            "pod": spec.name,
            "backend": spec.backend,
            "runner": runner,
            "profile": template.profile,
            "contract": {
                "file": template.contract_file,
                "sha256": sha256_digest(template.contract_text.encode()),
                "text": template.contract_text,
            },
            "tools": tools,
            "limits": {
                "max_runtime_seconds": template.limits.max_runtime_s,
                "max_authority_seconds": template.limits.max_authority_s,
                "max_task_bytes": template.limits.max_task_bytes,
                "max_result_bytes": template.limits.max_result_bytes,
                "memory_bytes": template.limits.memory_bytes,
                "pids": template.limits.pids,
            },
            "network": network,
            "models": models,
            "home": None
            if template.home is None
            else {"mount": template.home.mount, "max_bytes": template.home.max_bytes},
            "content": [
                {"source": c.source, "target": c.target, "device": c.device, "inode": c.inode} for c in template.content
            ],
            "content_targets": [c.target for c in template.content],
            "data_policy": spec.data_policy.listing(),
            "context_digest": spec_digest(context),
        }
        document["id"] = spec_digest(document)
        templates.append(CompiledTemplate(name=template.name, document=document, context=context))
    return CompiledPod(
        spec=spec,
        templates=tuple(templates),
        descriptors={decl.name: decl.descriptor for decl in spec.tool_services},
        credentials=credentials,
        network=network,
    )


__all__ = [
    "CompiledPod",
    "CompiledTemplate",
    "compile_pod",
    "installed_runner_digest",
    "runner_digest",
    "template_image",
]
