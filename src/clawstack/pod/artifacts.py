"""Where a compiled pod lives on disk, writing it, and reading its templates back as ``GET /v1/templates`` does.

::

    <pod>/.claw-runs/                 0700  the supervisor's state (ledger, secrets, results) and, from claw up:
        pod.json                      0600  the pod's declared name (x-claw.pod) and backend
        templates/<service>.json      0600  one per per-run template
        pod.lock                            the pod lock
    <pod>/.claw-runtime/              0700  rotated by claw up
        proxy/proxy.json              0600  the proxy's configuration, credentials and operator token included
        proxy/context/<service>.json  0600  each template's proxy context (credential names only)
        proxy/tools/<service>.json    0600  tool descriptors
        proxy/state/ proxy/journal/   0700  the proxy's identities and trace journal
        sock/                         0700  the proxy's sockets (under /tmp when the pod path is too long)
    <pod>/.claw-revocations/          0700  the proxy's revocation ledger; never rotated
    <pod>/.claw-homes/<inst>/<home>/  0700  task homes (clawstack.runs.homes); claw up and claw down leave them
    <pod>/.claw-runs/build.compose.yml 0600 under compose: the project claw up builds per-run images from
    <pod>/compose.generated.yml       0600  under the compose backend
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from clawstack.common.digest import spec_digest
from clawstack.common.errors import ClawError
from clawstack.common.files import ensure_private_dir, read_private, write_private
from clawstack.common.ids import new_secret
from clawstack.common.strictjson import loads as strict_loads
from clawstack.pod.compile import CompiledPod
from clawstack.pod.errors import PodError

OPERATOR_TOKEN_ENV: Final = "CLAW_PROXY_OPERATOR_TOKEN"  # noqa: S105 (a variable name)
MAX_TEMPLATE_BYTES: Final = 4 * 1024 * 1024
MAX_SOCKET_DIR_BYTES: Final = 80

# Under compose, where the proxy container sees what claw up wrote (see :func:`proxy_config`).
CONTAINER_PROXY_DIR: Final = "/claw/proxy"  # .claw-runtime/proxy, read-only
CONTAINER_STATE_DIR: Final = "/claw/state"  # .claw-runtime/proxy/state
CONTAINER_JOURNAL_DIR: Final = "/claw/journal"  # .claw-runtime/proxy/journal, when the journal is on
CONTAINER_REVOCATION_DIR: Final = "/claw/revocations"  # .claw-revocations
CONTAINER_SOCKET_DIR: Final = "/claw/sock"  # PodPaths.sockets
CONTAINER_AUTH_DIR: Final = "/claw/auth"  # PodPaths.auth: the plan sign-in store, the proxy's alone
PROXY_WORKER_PORT: Final = 8080


@dataclass(frozen=True, slots=True)
class PodPaths:
    """Every path of a pod's compiled state."""

    pod: Path

    @property
    def runs(self) -> Path:
        return self.pod / ".claw-runs"

    @property
    def templates(self) -> Path:
        return self.runs / "templates"

    @property
    def manifest(self) -> Path:
        return self.runs / "pod.json"

    @property
    def lock(self) -> Path:
        return self.runs / "pod.lock"

    @property
    def runtime(self) -> Path:
        return self.pod / ".claw-runtime"

    @property
    def proxy(self) -> Path:
        return self.runtime / "proxy"

    @property
    def proxy_config(self) -> Path:
        return self.proxy / "proxy.json"

    @property
    def proxy_state(self) -> Path:
        return self.proxy / "state"

    @property
    def proxy_journal(self) -> Path:
        return self.proxy / "journal"

    @property
    def build_file(self) -> Path:
        """The private Compose project ``claw up`` builds per-run images from (compose backend)."""
        return self.runs / "build.compose.yml"

    @property
    def contexts(self) -> Path:
        return self.proxy / "context"

    @property
    def revocations(self) -> Path:
        return self.pod / ".claw-revocations"

    @property
    def auth(self) -> Path:
        """The plan sign-in store (``.claw-auth/subscriptions``, owner-only): mounted by the proxy, never a worker."""
        return self.pod / ".claw-auth" / "subscriptions"

    @property
    def homes(self) -> Path:
        return self.pod / ".claw-homes"

    @property
    def compose_file(self) -> Path:
        return self.pod / "compose.generated.yml"

    @property
    def sockets(self) -> Path:
        """The proxy's socket directory: in the pod when its path is short enough, else a private /tmp one."""
        local = self.runtime / "sock"
        if len(os.fsencode(local)) <= MAX_SOCKET_DIR_BYTES:
            return local
        digest = hashlib.sha256(os.fsencode(self.pod)).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"claw-{os.geteuid()}-{digest}"

    @property
    def operator_socket(self) -> Path:
        return self.sockets / "operator.sock"

    @property
    def worker_socket(self) -> Path:
        """The proxy's worker socket, alone in its directory: a local sandbox binds that directory (read-only), so
        a restarted proxy's new socket is what a running worker reaches."""
        return self.sockets / "worker" / "proxy.sock"


def _json(value: Any) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def existing_operator_token(paths: PodPaths) -> str | None:
    try:
        config = json.loads(read_private(paths.proxy_config, max_bytes=MAX_TEMPLATE_BYTES))
        token = config["env"][OPERATOR_TOKEN_ENV]
    except (OSError, ClawError, ValueError, KeyError, TypeError):
        return None
    return token if isinstance(token, str) and len(token) >= 32 else None


def proxy_config(compiled: CompiledPod, paths: PodPaths, operator_token: str) -> dict[str, Any]:
    """The configuration ``claw proxy serve`` starts with for this pod.

    Under the local backend it names host paths; under compose it names the proxy container's own paths (see
    :data:`CONTAINER_PROXY_DIR` and its siblings), and the revocation directory comes from the container's
    ``CLAW_REVOCATION_DIR``.
    """
    spec = compiled.spec
    if spec.backend == "compose":
        proxy_dir, state, journal = CONTAINER_PROXY_DIR, CONTAINER_STATE_DIR, CONTAINER_JOURNAL_DIR
        listeners: dict[str, Any] = {
            "worker": {
                "host": "0.0.0.0",  # noqa: S104 (the container's runs network; the host guard keeps it there)
                "port": PROXY_WORKER_PORT,
                "unix_socket": f"{CONTAINER_SOCKET_DIR}/{paths.worker_socket.relative_to(paths.sockets)}",
            },
            "operator": {"unix_socket": f"{CONTAINER_SOCKET_DIR}/{paths.operator_socket.name}"},
        }
    else:
        proxy_dir, state, journal = str(paths.proxy), str(paths.proxy_state), str(paths.proxy_journal)
        listeners = {
            "worker": {"unix_socket": str(paths.worker_socket)},
            "operator": {"unix_socket": str(paths.operator_socket)},
        }
    config: dict[str, Any] = {
        **listeners,
        "operator_token_env": OPERATOR_TOKEN_ENV,
        "state_dir": state,
        **({} if spec.backend == "compose" else {"revocation_dir": str(paths.revocations)}),
        "env": {**compiled.credentials, OPERATOR_TOKEN_ENV: operator_token},
        "upstreams": {
            prefix: {"base_url": up.base_url, **({"api_key_env": up.api_key_env} if up.api_key_env else {})}
            for prefix, up in sorted(spec.upstreams.items())
        },
        "tools": {
            decl.name: {"base_url": decl.endpoint, "descriptor_file": f"{proxy_dir}/tools/{decl.name}.json"}
            for decl in spec.tool_services
        },
    }
    if spec.journal:
        config["journal"] = {"directory": journal}
    config["data_policy"] = spec.data_policy.to_config()
    config["auth_dir"] = CONTAINER_AUTH_DIR if spec.backend == "compose" else str(paths.auth)
    return config


def proxy_config_bytes(compiled: CompiledPod, paths: PodPaths, operator_token: str) -> bytes:
    """``proxy.json`` exactly as :func:`write_pod` writes it."""
    return _json(proxy_config(compiled, paths, operator_token))


def write_pod(compiled: CompiledPod, paths: PodPaths, *, operator_token: str | None = None) -> str:
    """Write the compiled pod; return the operator token in use. Templates no longer in the pod are removed."""
    token = operator_token or existing_operator_token(paths) or new_secret(32)
    for directory in (paths.runs, paths.templates, paths.runtime, paths.proxy, paths.contexts, paths.proxy / "tools"):
        ensure_private_dir(directory)
    ensure_private_dir(paths.revocations)
    ensure_private_dir(paths.auth.parent)
    ensure_private_dir(paths.auth)
    ensure_private_dir(paths.sockets)
    if compiled.spec.backend == "compose":
        # Bind-mount sources must exist, owned by the operator: Docker would create a missing one as root.
        ensure_private_dir(paths.proxy_state)
        if compiled.spec.journal:
            ensure_private_dir(paths.proxy_journal)
    for service, descriptor in compiled.descriptors.items():
        write_private(paths.proxy / "tools" / f"{service}.json", descriptor)
    for template in compiled.templates:
        write_private(paths.contexts / f"{template.name}.json", _json(template.context))
    write_private(paths.proxy_config, proxy_config_bytes(compiled, paths, token))
    write_private(paths.manifest, _json({"pod": compiled.spec.name, "backend": compiled.spec.backend}))
    keep = {f"{t.name}.json" for t in compiled.templates}
    for template in compiled.templates:
        write_private(paths.templates / f"{template.name}.json", _json(template.document))
    for stale in paths.templates.glob("*.json"):
        if stale.name not in keep:
            stale.unlink()
            (paths.contexts / stale.name).unlink(missing_ok=True)
    return token


def read_pod_manifest(paths: PodPaths) -> dict[str, str]:
    """The compiled pod's ``{"pod": <x-claw.pod>, "backend": …}``, or a PodError (``pod_uncompiled``)."""
    try:
        manifest = strict_loads(read_private(paths.manifest, max_bytes=4096), max_depth=2)
    except (OSError, ClawError) as exc:
        raise PodError("the pod is not compiled (no .claw-runs/pod.json); run claw up", code="pod_uncompiled") from exc
    if not isinstance(manifest, dict) or not all(isinstance(manifest.get(k), str) for k in ("pod", "backend")):
        raise PodError("the compiled pod manifest .claw-runs/pod.json is malformed; run claw up", code="pod_uncompiled")
    return {"pod": manifest["pod"], "backend": manifest["backend"]}


def _verified(paths: PodPaths, file: Path) -> dict[str, Any] | None:
    try:
        document = strict_loads(read_private(file, max_bytes=MAX_TEMPLATE_BYTES), max_depth=16)
        context = strict_loads(read_private(paths.contexts / file.name, max_bytes=MAX_TEMPLATE_BYTES), max_depth=16)
    except (OSError, ClawError):  # unreadable, unsafe (mode, owner, link) or not strict JSON: it does not verify
        return None
    if not isinstance(document, dict) or not isinstance(context, dict):
        return None
    body = {k: v for k, v in document.items() if k != "id"}
    if (
        document.get("name") != file.stem
        or document.get("id") != spec_digest(body)
        or document.get("context_digest") != spec_digest(context)
    ):
        return None
    return document


def load_template(paths: PodPaths, name: str) -> dict[str, Any]:
    """A compiled template that verifies against its own id and context digest, or a PodError."""
    file = paths.templates / f"{name}.json"
    if not file.exists():
        raise PodError(f"the template {name!r} is not compiled for this pod", code="template_unknown")
    document = _verified(paths, file)
    if document is None:
        raise PodError(f"the template {name!r} does not verify; run claw up again", code="template_invalid")
    return document


def list_templates(paths: PodPaths) -> dict[str, Any]:
    """The spec's ``GET /v1/templates`` body: verified templates, and the names of any that do not verify."""
    templates, invalid = [], []
    files = sorted(paths.templates.glob("*.json")) if paths.templates.is_dir() else []
    for file in files:
        document = _verified(paths, file)
        if document is None:
            invalid.append(file.stem)
            continue
        templates.append(
            {
                "name": document["name"],
                "id": document["id"],
                "context_digest": document["context_digest"],
                "models": [
                    {k: m[k] for k in ("slot", "ref", "requested") if k in m} for m in document.get("models", [])
                ],
                "profile": document["profile"],
                "content_targets": document.get("content_targets", []),
                "data_policy": document.get("data_policy", {}),
            }
        )
    return {"templates": templates, "invalid": invalid}


__all__ = [
    "CONTAINER_JOURNAL_DIR",
    "CONTAINER_PROXY_DIR",
    "CONTAINER_REVOCATION_DIR",
    "CONTAINER_SOCKET_DIR",
    "CONTAINER_STATE_DIR",
    "OPERATOR_TOKEN_ENV",
    "PROXY_WORKER_PORT",
    "PodPaths",
    "existing_operator_token",
    "list_templates",
    "load_template",
    "proxy_config",
    "proxy_config_bytes",
    "read_pod_manifest",
    "write_pod",
]
