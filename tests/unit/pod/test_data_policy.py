"""The pod's data policy (``x-claw.data-policy``): the spec's default (US/EU processing, no training, no
retention) is enforced at ``claw up``; attestations cover one provider at one endpoint; ``permissive`` is explicit;
the template listing shows what the proxy enforces, with attestations by provider only."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from clawstack.pod.artifacts import PodPaths, list_templates
from clawstack.pod.compile import compile_pod
from clawstack.pod.errors import PodError
from clawstack.pod.podfile import load_pod
from clawstack.pod.up import up

PODS = Path(__file__).resolve().parents[2] / "pods"
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "pod"
ALL = ["processing:us", "training:none", "retention:none"]
KEYS = {"OPENAI_API_KEY": "sk-o", "OPENROUTER_API_KEY": "sk-r", "TICKET_API_TOKEN": "t"}


def pod(tmp_path: Path, models: dict[str, str], policy: Any = None, upstreams: Any = None) -> Path:
    directory = tmp_path / "pod"
    if not directory.exists():
        shutil.copytree(PODS / "base", directory)
    document = yaml.safe_load((PODS / "base" / "claw-pod.yml").read_text())
    del document["x-claw"]["data-policy"]
    if policy is not None:
        document["x-claw"]["data-policy"] = policy
    if upstreams is not None:
        document["x-claw"]["upstreams"].update(upstreams)
    document["x-claw"]["cllama-defaults"]["env"] = dict(KEYS)
    document["services"]["worker"]["x-claw"]["models"] = models
    (directory / "claw-pod.yml").write_text(yaml.safe_dump(document))
    return directory


def refused(directory: Path) -> PodError:
    with pytest.raises(PodError) as info:
        compile_pod(load_pod(directory, environ={}))
    return info.value


def attest(provider: str, endpoint: str, guarantees: list[str] = ALL) -> dict[str, Any]:
    return {"provider": provider, "endpoint": endpoint, "guarantees": guarantees}


def test_the_default_refuses_an_unattested_entry_naming_each_one(tmp_path: Path) -> None:
    error = refused(pod(tmp_path, {"primary": "local/m", "fallback": "openai/gpt-5.6-terra"}))
    assert error.code == "data_policy_violation"
    assert "primary local/m (provider local at http://127.0.0.1:9/v1) lacks processing:us|eu, training:none, " in (
        error.message
    )
    assert "fallback openai/gpt-5.6-terra (provider openai at https://api.openai.com/v1) lacks" in error.message
    assert "x-claw.data-policy: permissive" in error.message


def test_an_attestation_covers_its_provider_at_its_endpoint_only(tmp_path: Path) -> None:
    models = {"primary": "chatgpt/gpt-5.6-terra", "fallback": "openai/gpt-5.6-terra"}
    openai_only = {"attestations": [attest("openai", "https://api.openai.com/v1")]}
    error = refused(pod(tmp_path, models, openai_only))
    assert "primary chatgpt/gpt-5.6-terra (provider chatgpt at https://api.openai.com/v1) lacks" in error.message
    assert "fallback" not in error.message  # the openai attestation covers openai
    elsewhere = {"attestations": [attest("openai", "https://api.openai.com/v2"), attest("chatgpt", "https://x/v1")]}
    assert "fallback openai" in refused(pod(tmp_path, models, elsewhere)).message
    both = {
        "attestations": [attest("openai", "https://api.openai.com/v1"), attest("chatgpt", "https://api.openai.com/v1/")]
    }
    template = compile_pod(load_pod(pod(tmp_path, models, both), environ={})).templates[0]
    assert template.document["data_policy"] == {
        "mode": "constrained",
        "regions": ["us", "eu"],
        "training": "none",
        "retention": "none",
        "local_retention": "metadata",
        "attested_providers": ["chatgpt", "openai"],
    }


def test_every_required_guarantee_needs_evidence(tmp_path: Path) -> None:
    endpoint = "http://127.0.0.1:9/v1"
    for guarantees, lacking in (
        (["processing:us", "training:none"], "lacks retention:none"),
        (["processing:us", "retention:none"], "lacks training:none"),
        (["processing:ap", "training:none", "retention:none"], "lacks processing:us|eu"),
        (["processing:us", "processing:ap", "training:none", "retention:none"], "lacks processing:us|eu"),
    ):
        error = refused(
            pod(tmp_path, {"primary": "local/m"}, {"attestations": [attest("local", endpoint, guarantees)]})
        )
        assert error.message.split("lacks ", 1)[1].startswith(lacking.removeprefix("lacks ")), guarantees
    eu_only = {"regions": ["eu"], "attestations": [attest("local", endpoint)]}
    assert "lacks processing:eu" in refused(pod(tmp_path, {"primary": "local/m"}, eu_only)).message
    relaxed = {
        "training": "allowed",
        "retention": "allowed",
        "attestations": [attest("local", endpoint, ["processing:eu"])],
    }
    compile_pod(load_pod(pod(tmp_path, {"primary": "local/m"}, relaxed), environ={}))


def test_an_openrouter_only_pin_is_not_evidence_of_region(tmp_path: Path) -> None:
    directory = pod(tmp_path, {"primary": "openrouter/google/gemini-3.8-flash"})
    document = yaml.safe_load((directory / "claw-pod.yml").read_text())
    document["services"]["worker"]["x-claw"]["provider-preferences"] = {"primary": {"only": ["google-vertex/eu"]}}
    (directory / "claw-pod.yml").write_text(yaml.safe_dump(document))
    error = refused(directory)
    # The proxy enforces OpenRouter's zero-retention and no-data-collection controls itself: only region is missing.
    assert error.message.count("lacks processing:us|eu.") == 1
    assert "training" not in error.message.split("lacks")[1]
    regional = pod(
        tmp_path, {"primary": "openrouter/google/gemini-3.8-flash"}, upstreams={"openrouter": {"region": "eu"}}
    )
    template = compile_pod(load_pod(regional, environ={})).templates[0]
    assert template.context["upstreams"]["openrouter"]["base_url"] == "https://eu.openrouter.ai/api/v1"
    attested = pod(
        tmp_path,
        {"primary": "openrouter/google/gemini-3.8-flash"},
        {"attestations": [attest("openrouter", "https://openrouter.ai/api/v1", ["processing:eu"])]},
    )
    compile_pod(load_pod(attested, environ={}))


def test_a_regional_route_is_evidence_of_region_only(tmp_path: Path) -> None:
    error = refused(pod(tmp_path, {"primary": "openai/gpt-5.6-terra"}, upstreams={"openai": {"region": "eu"}}))
    assert "(provider openai at https://eu.api.openai.com/v1) lacks training:none, retention:none." in error.message
    policy = {"attestations": [attest("openai", "https://eu.api.openai.com/v1", ["training:none", "retention:none"])]}
    compile_pod(
        load_pod(pod(tmp_path, {"primary": "openai/gpt-5.6-terra"}, policy, {"openai": {"region": "eu"}}), environ={})
    )
    bad = refused(pod(tmp_path, {"primary": "openai/gpt-5.6-terra"}, upstreams={"openai": {"region": "ap"}}))
    assert bad.message.endswith("openai has no regional route 'ap' (known: eu, us)")


def test_permissive_is_explicit_and_listed(tmp_path: Path) -> None:
    directory = pod(tmp_path, {"primary": "local/m", "fallback": "openai/gpt-5.6-terra"}, "permissive")
    result = up(directory, detach=False, environ={})
    listing = list_templates(PodPaths(directory))["templates"][0]
    assert listing["data_policy"]["mode"] == "permissive"
    assert result.compiled.templates[0].context["data_policy"] == "permissive"


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ({"regions": []}, "regions: must name at least one region"),
        ({"regions": "us"}, "regions: must be a list"),
        ({"training": "no"}, "training: must be none or allowed"),
        ({"local-retention": "none"}, "local-retention: 'none' is not supported"),
        ({"local-retention": "content"}, "local-retention: 'content' is not supported"),
        ({"zdr": True}, "unknown key 'zdr'"),
        ({"attestations": [{"provider": "openai", "endpoint": "https://x/v1"}]}, "must have exactly provider"),
        ({"attestations": [attest("openai", "https://x/v1", ["eu"])]}, "guarantees: must list"),
        ("strict", "must be permissive or a mapping"),
    ],
)
def test_a_malformed_policy_is_refused_naming_the_key(tmp_path: Path, policy: Any, message: str) -> None:
    error = refused(pod(tmp_path, {"primary": "local/m"}, policy))
    assert error.message.startswith("claw-pod.yml: x-claw.data-policy: ")
    assert message in error.message


def test_the_policy_is_part_of_the_template_id(tmp_path: Path) -> None:
    endpoint = "http://127.0.0.1:9/v1"
    one = compile_pod(
        load_pod(pod(tmp_path, {"primary": "local/m"}, {"attestations": [attest("local", endpoint)]}), environ={})
    )
    two = compile_pod(load_pod(pod(tmp_path, {"primary": "local/m"}, "permissive"), environ={}))
    assert one.templates[0].id != two.templates[0].id


def test_the_example_pod_compiles_under_the_default_policy_and_tells_its_proxy(tmp_path: Path) -> None:
    shutil.copytree(EXAMPLE, tmp_path / "example")
    spec = load_pod(tmp_path / "example", environ={"CLAW_FAKE_LLM_URL": "http://127.0.0.1:1/v1"})
    assert spec.data_policy.constrained
    compiled = compile_pod(spec)
    assert {t.document["data_policy"]["attested_providers"][0] for t in compiled.templates} == {"local"}
    from clawstack.pod.artifacts import proxy_config

    config = proxy_config(compiled, PodPaths(tmp_path / "example"), "o" * 40)
    assert config["data_policy"]["attestations"][0]["endpoint"] == "http://127.0.0.1:1/v1"
