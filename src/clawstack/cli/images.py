"""``claw images build``: the compose backend's images, built locally from shipped Dockerfiles; never pulled."""

from __future__ import annotations

import json
from typing import cast

import click

from clawstack.pod.errors import BackendError
from clawstack.pod.imagebuild import IMAGE_NAMES, ImageName, build_images


@click.group()
def images() -> None:
    """The images of the compose backend: clawstack/base, clawstack/proxy and clawstack/worker."""


@images.command()
@click.option(
    "--only",
    "only",
    multiple=True,
    type=click.Choice(IMAGE_NAMES),
    help="Build only this image (repeatable); the base is always brought up to date too.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as a JSON array.")
def build(only: tuple[str, ...], as_json: bool) -> None:
    """Build the images, or find them up to date, and print one line per image with its ID.

    clawstack/base is made FROM scratch from this host's Python interpreter (no shell); clawstack/proxy and
    clawstack/worker add clawstack and its runtime dependencies as installed here. Nothing is pulled or
    downloaded. An image whose tag already carries the digest of its build context is not rebuilt.
    """
    try:
        built = build_images(
            only=cast(tuple[ImageName, ...], only) or None,
            progress=None if as_json else lambda line: click.echo(f"{line}...", err=True),
        )
    except BackendError as exc:
        raise click.ClickException(f"{exc.code}: {exc.message}") from exc
    if as_json:
        click.echo(json.dumps([image.to_dict() for image in built], indent=2))
        return
    for image in built:
        click.echo(image.line())
