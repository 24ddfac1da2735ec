"""Model families: ``openai/@terra`` resolves at ``claw up`` from the shipped, versioned table (or the pod's
``x-claw.model-families``); the chain entry keeps ``requested``; it is part of the template id; an exact model's
entry has no ``requested``; a family never leaves its provider."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from clawstack.models.families import FAMILY_TABLE_VERSION, SHIPPED_FAMILIES, FamilyTable
from clawstack.pod.artifacts import PodPaths, list_templates
from clawstack.pod.compile import compile_pod
from clawstack.pod.errors import PodError
from clawstack.pod.podfile import load_pod
from clawstack.pod.up import up

PODS = Path(__file__).resolve().parents[2] / "pods"
KEYS = {"OPENAI_API_KEY": "sk-o", "AI_GATEWAY_API_KEY": "sk-v", "TICKET_API_TOKEN": "t"}


def pod(tmp_path: Path, models: dict[str, str], families: dict[str, Any] | None = None) -> Path:
    directory = tmp_path / "pod"
    if not directory.exists():
        shutil.copytree(PODS / "base", directory)
    document = yaml.safe_load((PODS / "base" / "claw-pod.yml").read_text())
    document["x-claw"]["cllama-defaults"]["env"] = dict(KEYS)
    if families is not None:
        document["x-claw"]["model-families"] = families
    document["services"]["worker"]["x-claw"]["models"] = models
    (directory / "claw-pod.yml").write_text(yaml.safe_dump(document))
    return directory


def compiled(directory: Path) -> dict[str, Any]:
    return compile_pod(load_pod(directory, environ={})).templates[0].document


def test_a_family_resolves_and_records_what_was_requested(tmp_path: Path) -> None:
    document = compiled(pod(tmp_path, {"primary": "openai/@terra", "fallback": "openai/gpt-4.1-nano"}))
    assert document["models"] == [
        {"slot": "primary", "ref": SHIPPED_FAMILIES["openai/@terra"], "requested": "openai/@terra"},
        {"slot": "fallback", "ref": "openai/gpt-4.1-nano"},  # an exact model has no requested
    ]
    up(tmp_path / "pod", detach=False, environ={})
    listed = list_templates(PodPaths(tmp_path / "pod"))["templates"][0]
    assert listed["models"][0] == {"slot": "primary", "ref": "openai/gpt-6.1-terra", "requested": "openai/@terra"}


def test_a_vercel_family_and_the_plan_family(tmp_path: Path) -> None:
    document = compiled(pod(tmp_path, {"primary": "chatgpt/@terra", "fallback": "vercel/openai/@nano"}))
    assert [m["ref"] for m in document["models"]] == ["chatgpt/gpt-6.1-terra", "vercel/openai/gpt-4.1-nano"]
    assert document["models"][0]["needs_signin"] is True


def test_a_pod_override_decides_and_changes_the_template_id(tmp_path: Path) -> None:
    shipped = compiled(pod(tmp_path, {"primary": "openai/@terra"}))
    overridden = compiled(pod(tmp_path, {"primary": "openai/@terra"}, {"openai/@terra": "openai/gpt-6.2-terra"}))
    assert overridden["models"][0] == {"slot": "primary", "ref": "openai/gpt-6.2-terra", "requested": "openai/@terra"}
    assert overridden["id"] != shipped["id"]
    exact = compiled(pod(tmp_path, {"primary": "openai/gpt-6.1-terra"}))
    # The same exact model, written exactly or through a family, is a different template: requested is in the id.
    assert exact["id"] != shipped["id"]
    added = compiled(pod(tmp_path, {"primary": "openai/@mine"}, {"openai/@mine": "openai/gpt-4o"}))
    assert added["models"][0]["ref"] == "openai/gpt-4o"


@pytest.mark.parametrize(
    ("models", "families", "message"),
    [
        ({"primary": "openai/@nope"}, None, f"unknown model family 'openai/@nope' (table {FAMILY_TABLE_VERSION};"),
        ({"primary": "openai/gpt@5"}, None, "a family is provider/@name"),
        ({"primary": "chatgpt/@terra"}, {"chatgpt/@terra": "openai/gpt-6.1-terra"}, "must resolve within chatgpt/"),
        ({"primary": "openai/@terra"}, {"openai/@terra": "openai/@luna"}, "must resolve to an exact"),
        ({"primary": "openai/@terra"}, {"terra": "openai/gpt-4o"}, "is not a family reference"),
        ({"primary": "openai/@terra"}, {"openai/@terra": 5}, "must resolve to an exact"),
    ],
)
def test_bad_families_are_refused(tmp_path: Path, models: dict[str, str], families: Any, message: str) -> None:
    with pytest.raises(PodError) as info:
        compiled(pod(tmp_path, models, families))
    assert message in info.value.message


def test_the_table_is_keyed_by_provider() -> None:
    table = FamilyTable.with_overrides({"openai/@terra": "openai/gpt-7-terra"})
    assert table.resolve("openai/@terra") == "openai/gpt-7-terra"
    assert table.source("openai/@terra") == "pod"
    assert table.source("openai/@luna") == "shipped"
    for family, target in SHIPPED_FAMILIES.items():
        assert target.rsplit("/", 1)[0] == family.rsplit("/", 1)[0], family
