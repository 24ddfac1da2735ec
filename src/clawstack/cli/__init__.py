"""The ``claw`` command tree. Commands are thin: parse, call a subsystem, print.

Each top-level command's module is imported only when that command runs (or ``--help`` lists it), so that
``claw gateway serve`` does not import the supervisor, the proxy or ClawConnect before it listens.
"""

from __future__ import annotations

import importlib

import click

#: Top-level command name -> ``module:attribute`` of its click command.
_COMMANDS = {
    "compose": "clawstack.cli.pod:compose_command",
    "connect": "clawstack.cli.connect:connect",
    "demo": "clawstack.cli.demo:demo",
    "down": "clawstack.cli.pod:down_command",
    "fake-llm": "clawstack.cli.fake_llm:fake_llm",
    "gateway": "clawstack.cli.gateway:gateway",
    "images": "clawstack.cli.images:images",
    "proxy": "clawstack.cli.proxy:proxy",
    "runs": "clawstack.cli.runs:runs",
    "up": "clawstack.cli.pod:up_command",
}


class _LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attribute = target.split(":")
        command = getattr(importlib.import_module(module_name), attribute)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="clawstack", prog_name="claw")
def cli() -> None:
    """clawstack: delegate agent work safely."""


def main() -> None:
    """Console-script entry point."""
    cli()


__all__ = ["cli", "main"]
