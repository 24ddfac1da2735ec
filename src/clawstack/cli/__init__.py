"""The ``claw`` command tree. Commands are thin: parse, call a subsystem, print."""

from __future__ import annotations

import click

from clawstack import __version__
from clawstack.cli.connect import connect
from clawstack.cli.demo import demo
from clawstack.cli.fake_llm import fake_llm
from clawstack.cli.gateway import gateway
from clawstack.cli.pod import down_command, up_command
from clawstack.cli.proxy import proxy
from clawstack.cli.runs import runs


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="claw")
def cli() -> None:
    """clawstack: delegate agent work safely."""


cli.add_command(connect)
cli.add_command(demo)
cli.add_command(fake_llm)
cli.add_command(gateway)
cli.add_command(proxy)
cli.add_command(runs)
cli.add_command(up_command)
cli.add_command(down_command)


def main() -> None:
    """Console-script entry point."""
    cli()


__all__ = ["cli", "main"]
