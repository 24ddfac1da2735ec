"""The docs of clawstack.llm run and match the code: their Python examples execute against the real fake, their
script and directive examples parse, and every directive and script key is documented."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from clawstack.llm.fake import Behaviour, parse_directives, parse_script
from clawstack.llm.fake.directives import DIRECTIVE_NAMES
from clawstack.llm.fake.script import _StepModel

DOCS = Path(__file__).resolve().parents[3] / "docs"


def _blocks(name: str, language: str) -> list[str]:
    text = (DOCS / name).read_text()
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.DOTALL)


@pytest.mark.parametrize("name", ["llm-client.md", "fake-llm.md"])
async def test_python_examples_run(name: str) -> None:
    blocks = _blocks(name, "python")
    assert blocks
    for block in blocks:
        namespace: dict[str, Any] = {}
        exec(f"async def example():\n{textwrap.indent(block, '    ')}", namespace)
        await namespace["example"]()


def test_script_example_parses() -> None:
    (block,) = _blocks("fake-llm.md", "json")
    assert len(parse_script(block).steps) == 9


def test_directive_example_parses() -> None:
    (block,) = _blocks("fake-llm.md", "text")
    assert isinstance(parse_directives(block), Behaviour)


def test_every_directive_and_script_key_is_documented() -> None:
    text = (DOCS / "fake-llm.md").read_text()
    for name in DIRECTIVE_NAMES:
        assert f"`@fake {name}" in text, name
    for key in _StepModel.model_fields:
        assert f"`{key}`" in text, key


def test_fake_docs_say_it_is_not_a_language_model() -> None:
    assert "it is not a language model." in (DOCS / "fake-llm.md").read_text()
