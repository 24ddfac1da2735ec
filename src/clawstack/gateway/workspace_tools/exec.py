"""The ``exec`` tool: ``/bin/sh -c COMMAND`` in a :class:`clawstack.sandbox.Sandbox` with no network, a read-only
root, the workspace (bound at its own path) the only writable place besides a private ``/tmp``, a clean
environment, a time limit that kills the whole sandbox, pids and memory limits on the whole sandbox
(:class:`clawstack.sandbox.Containment`) and a bound on the output, answering with OpenClaw's result texts. When
the gateway runs as root, the sandbox runs as an unprivileged uid of its own (``exec_uid``), to which the
workspace is handed over. OpenClaw's arguments for background runs, terminals, approvals and other hosts are
refused."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import re
import secrets
import stat
from collections.abc import Callable
from typing import Any, Final

from clawstack.gateway.tools import Tool, ToolError
from clawstack.gateway.workspace_tools.workspace import Workspace, WorkspaceToolLimits, guarded, refuse_unknown
from clawstack.sandbox import (
    Containment,
    LimitReached,
    Sandbox,
    SandboxError,
    SandboxSpec,
    bind_fd,
    default_env,
    dev,
    proc,
    system_mounts,
    tmpfs,
)

__all__ = ["EXEC_HOST_PATHS", "exec_tool"]

EXEC_HOST_PATHS: Final = ("/etc/alternatives", "/etc/ld.so.cache", "/etc/passwd", "/etc/group", "/etc/localtime")
"""Host paths ``exec`` binds read-only besides ``/usr`` and the top-level system directories (no other ``/etc``)."""
_RETENTION_NOTE: Final = "[earlier output was discarded at the retention cap and cannot be recovered]\n\n"
_TIMEOUT_GUIDANCE: Final = (
    "The command was terminated, but external side effects may already have completed. Verify the resulting state "
    "before retrying. Do not automatically rerun non-idempotent commands. Use a higher timeout only when the command "
    "is known to be safe to retry."
)
_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MAX_ARGUMENT_BYTES: Final = 128 * 1024 - 1  # one argv string: Linux's MAX_ARG_STRLEN, less the NUL
_MAX_ENV: Final = 100
_MAX_ENV_VALUE: Final = 4096
_RELEASE_S: Final = 5.0

log = logging.getLogger(__name__)


def exec_tool(sandbox: Sandbox, limits: WorkspaceToolLimits) -> Tool:
    """``exec`` as a gateway tool, running its commands in ``sandbox``."""
    description = _EXEC_DESCRIPTION.format(
        kb=limits.exec_output_bytes // 1024,
        default=_seconds(limits.exec_default_timeout_s),
        most=_seconds(limits.exec_max_timeout_s),
    )
    return Tool("exec", description, _EXEC_SCHEMA, guarded("exec", _Exec(sandbox, limits).run))


class _Exec:
    def __init__(self, sandbox: Sandbox, limits: WorkspaceToolLimits) -> None:
        self.sandbox = sandbox
        self.limits = limits
        self._reported = False

    async def run(self, arguments: dict[str, Any], workspace: Workspace) -> str:
        refuse_unknown("exec", arguments, {*_EXEC_ACCEPTED, *_EXEC_REFUSED})
        for key, check in _EXEC_REFUSED.items():
            if key in arguments and (message := check(arguments[key])) is not None:
                raise ToolError(f"exec: {message}")
        command = arguments.get("command")
        if not isinstance(command, str) or not command.strip():
            raise ToolError("exec: command must be a non-empty string")
        if "\0" in command or len(command.encode("utf-8", "surrogatepass")) > _MAX_ARGUMENT_BYTES:
            raise ToolError(f"exec: command must be free of NUL and at most {_MAX_ARGUMENT_BYTES} bytes")
        title = arguments.get("title")
        if title is not None and (not isinstance(title, str) or len(title) > 120):
            raise ToolError("exec: title must be a string of at most 120 characters")
        timeout_s = self._timeout(arguments.get("timeoutSeconds"))
        env = default_env(workspace.root) | _env(arguments.get("env"))
        workdir = arguments.get("workdir", "")
        if not isinstance(workdir, str) or (workdir and not workdir.strip()):
            raise ToolError("exec: workdir must be a path (omit it or give an empty string for the workspace)")
        workdir = workspace.path("exec", arguments, "workdir") if workdir else "."
        parts = await asyncio.to_thread(workspace.dir.directory, workdir)  # the workspace itself must exist too
        cwd = os.path.join(workspace.root, *parts)
        uid = self.limits.exec_uid if os.geteuid() == 0 else None
        if uid is not None:
            await asyncio.to_thread(hand_over, workspace.root, uid)
        # Bound by descriptor: the sandbox's uid need not reach the workspace by its path.
        root = os.open(workspace.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            spec = SandboxSpec(
                env=env,
                mounts=(
                    *system_mounts(EXEC_HOST_PATHS),
                    proc(),
                    dev(),
                    tmpfs("/tmp", self.limits.exec_tmp_bytes),  # noqa: S108 - the sandbox's own
                    bind_fd(root, workspace.root),
                ),
                chdir=cwd,
            )
            containment = await asyncio.to_thread(
                Containment.create,
                f"claw-exec-{secrets.token_hex(8)}",
                memory_bytes=self.limits.exec_memory_bytes,
                pids=self.limits.exec_pids,
                sandbox_uid=uid,
            )
            self._report(containment)
            try:
                result = await self.sandbox.run(
                    spec,
                    ["/bin/sh", "-c", command],
                    timeout_s=timeout_s,
                    output_limit_bytes=self.limits.exec_output_bytes,
                    limits=self.limits.exec_rlimits,
                    stderr="merge",
                    keep="tail",
                    containment=containment,
                    uid=uid,
                )
            finally:
                # Shielded: a second cancellation must not leave the cgroups behind.
                await asyncio.shield(asyncio.to_thread(containment.release, _RELEASE_S))
        except SandboxError as exc:
            raise ToolError(f"exec could not run the command ({exc.code}): {exc.message}") from None
        finally:
            os.close(root)
        output = _decode_tail(result.stdout, result.stdout_truncated).strip()
        note = _RETENTION_NOTE if result.stdout_truncated else ""
        if result.limit_reached is not None:
            reason = self._limit_message(result.limit_reached)
            raise ToolError(note + (f"{output}\n\n{reason}" if output else reason))
        if result.timed_out:
            reason = f"Command timed out after {_seconds(timeout_s)} seconds.\n\n{_TIMEOUT_GUIDANCE}"
            raise ToolError(note + (f"{output}\n\n{reason}" if output else reason))
        code = result.exit_code
        if code in (126, 127):
            reason = "Command not found" if code == 127 else "Command not executable (permission denied)"
            raise ToolError(note + (f"{output}\n\n{reason}" if output else reason))
        shown = output or "(no output)"
        return note + (shown if code == 0 else f"{shown}\n\n(Command exited with code {code})")

    def _limit_message(self, reached: LimitReached) -> str:
        if reached == "pids":
            what, hint = f"process limit ({self.limits.exec_pids} processes)", "Run fewer processes at once."
        else:
            what, hint = f"memory limit ({_mib(self.limits.exec_memory_bytes)} MiB)", "Use less memory."
        return f"Command stopped: the sandbox's {what} was reached, and every process of the command was killed. {hint}"

    def _report(self, containment: Containment) -> None:
        """Log once how the limits are held, and loudly if one is not."""
        if self._reported:
            return
        self._reported = True
        enforcement = containment.enforcement
        log.info("exec: memory limit held by %s, pids limit by %s", enforcement.memory, enforcement.pids)
        if containment.cgroups is None:
            log.warning(
                "exec: no usable cgroup here; memory is bounded per process only (RLIMIT_AS) and processes %s",
                "not at all (the sandbox has no uid of its own)" if enforcement.pids is None else "by RLIMIT_NPROC",
            )

    def _timeout(self, value: Any) -> float:
        if value is None:
            return self.limits.exec_default_timeout_s
        most = self.limits.exec_max_timeout_s
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ToolError("exec: timeoutSeconds must be a number of seconds")
        if value <= 0 or value > most:
            raise ToolError(
                f"exec: timeoutSeconds must be above 0 and at most {_seconds(most)} here "
                "(a command cannot run without a time limit)"
            )
        return float(value)


def _env(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > _MAX_ENV:
        raise ToolError(f"exec: env must be an object of at most {_MAX_ENV} string values")
    for key, item in value.items():
        if _ENV_NAME.fullmatch(key) is None or not isinstance(item, str) or "\0" in item or len(item) > _MAX_ENV_VALUE:
            raise ToolError(
                "exec: env names are [A-Za-z_][A-Za-z0-9_]* and values strings without NUL "
                f"of at most {_MAX_ENV_VALUE} characters"
            )
    return dict(value)


def _refuse_unless(allowed: tuple[object, ...], message: str) -> Callable[[Any], str | None]:
    """A check that passes only the values ``allowed`` (``False`` is not ``0``)."""

    def check(value: Any) -> str | None:
        return None if any(type(value) is type(item) and value == item for item in allowed) else message

    return check


_EXEC_ACCEPTED: Final = ("command", "workdir", "env", "timeoutSeconds", "title")
_EXEC_REFUSED: Final[dict[str, Callable[[Any], str | None]]] = {
    "yieldMs": lambda _: "yieldMs is not supported: commands run to completion here, with no process tool to poll",
    "background": _refuse_unless((False,), "background is not supported: commands run to completion here"),
    "pty": _refuse_unless((False,), "pty is not supported: commands run without a terminal"),
    "elevated": _refuse_unless((False,), "elevated is not supported: commands always run in the sandbox"),
    "host": _refuse_unless(("auto", "sandbox"), "host must be auto or sandbox: commands always run in the sandbox"),
    "ask": _refuse_unless(("off",), "ask is not supported: there are no exec approvals here"),
    "node": lambda _: "node is not supported: commands run in the gateway's sandbox, not on a node",
}


def hand_over(root: str, uid: int) -> None:
    """Give the workspace to the sandbox's ``uid`` (and gid): everything in it that this process's uid owns is
    chowned to it, so that the unprivileged sandbox can write where the other tools wrote. The walk holds
    directory descriptors and never follows a symlink (a symlink itself is chowned, never its target), and a
    file with more than one link is left alone: it may be linked from outside the workspace."""
    own = os.geteuid()

    def give(name: str, dir_fd: int) -> None:
        with contextlib.suppress(FileNotFoundError):  # removed meanwhile
            found = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if found.st_uid != own or (not stat.S_ISDIR(found.st_mode) and found.st_nlink > 1):
                return
            os.chown(name, uid, uid, dir_fd=dir_fd, follow_symlinks=False)

    for top, (_, dirs, files, dir_fd) in enumerate(os.fwalk(root, follow_symlinks=False)):
        if top == 0 and os.fstat(dir_fd).st_uid == own:
            os.chown(dir_fd, uid, uid)
        for name in (*dirs, *files):
            give(name, dir_fd)


def _mib(value: int) -> str:
    return f"{value / 1024**2:g}"


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _decode_tail(data: bytes, truncated: bool) -> str:
    """The output as text; a tail cut inside a character starts at the next whole one."""
    if truncated:
        skip = 0
        while skip < min(3, len(data)) and data[skip] & 0xC0 == 0x80:
            skip += 1
        data = data[skip:]
    return data.decode("utf-8", "replace")


# --- description and schema ---------------------------------------------------------------------------------------

_EXEC_DESCRIPTION: Final = (
    "Run a shell command (/bin/sh -c) in the workspace, in a sandbox: no network, a read-only system, the workspace "
    "the only writable place besides /tmp. Returns stdout+stderr (the last {kb}KB). Timeout {default}s by default, "
    "at most {most}s."
)
_EXEC_SCHEMA: Final = {
    "type": "object",
    "properties": {
        "title": {
            "type": "string",
            "maxLength": 120,
            "description": "Every call: short purpose; never claim success. No secrets.",
        },
        "command": {"type": "string", "description": "Shell command."},
        "workdir": {"type": "string", "description": "Omit/empty string: the workspace; whitespace-only invalid."},
        "env": {
            "type": "object",
            "additionalProperties": {"type": "string"},
            "description": "Literal overrides; no expansion. Omit to inherit.",
        },
        "timeoutSeconds": {"type": "number", "description": "Process lifetime in seconds."},
    },
    "required": ["command"],
}
