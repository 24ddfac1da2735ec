"""``claw runs doctor`` reports model family drift: the family now resolves elsewhere than the compiled templates
say, measured against the shipped table or the pod's own ``x-claw.model-families``."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml
from click.testing import CliRunner

from clawstack.cli import cli
from clawstack.pod.artifacts import PodPaths
from clawstack.pod.drift import family_drift
from clawstack.pod.up import up

PODS = Path(__file__).resolve().parents[2] / "pods"


def make(tmp_path: Path, models: dict[str, str]) -> Path:
    pod = tmp_path / "pod"
    shutil.copytree(PODS / "base", pod)
    document = yaml.safe_load((pod / "claw-pod.yml").read_text())
    document["x-claw"]["cllama-defaults"]["env"]["OPENAI_API_KEY"] = "sk-o"
    document["services"]["worker"]["x-claw"]["models"] = models
    (pod / "claw-pod.yml").write_text(yaml.safe_dump(document))
    up(pod, detach=False, environ={})
    return pod


def set_families(pod: Path, families: dict[str, str]) -> None:
    document = yaml.safe_load((pod / "claw-pod.yml").read_text())
    document["x-claw"]["model-families"] = families
    (pod / "claw-pod.yml").write_text(yaml.safe_dump(document))


def test_no_drift_then_a_pod_override_drifts_and_doctor_says_so(tmp_path: Path) -> None:
    pod = make(tmp_path, {"primary": "openai/@terra", "fallback": "openai/gpt-4o"})
    assert family_drift(PodPaths(pod)) == (1, [])
    doctor = CliRunner().invoke(cli, ["runs", "doctor", "--pod", str(pod)])
    assert "model families: 1 chain entry from a family, no drift" in doctor.output, doctor.output
    set_families(pod, {"openai/@terra": "openai/gpt-6.2-terra"})
    in_use, drifted = family_drift(PodPaths(pod))
    assert in_use == 1
    assert [d.describe() for d in drifted] == [
        "worker primary openai/@terra now resolves to openai/gpt-6.2-terra; compiled openai/gpt-6.1-terra"
    ]
    doctor = CliRunner().invoke(cli, ["runs", "doctor", "--pod", str(pod)])
    assert doctor.exit_code != 0
    assert "model families: 1 drifted (run claw up to recompile" in doctor.output
    up(pod, detach=False, environ={})  # recompiling resolves anew
    assert family_drift(PodPaths(pod)) == (1, [])


def test_an_exact_model_never_drifts(tmp_path: Path) -> None:
    pod = make(tmp_path, {"primary": "openai/gpt-6.1-terra"})
    set_families(pod, {"openai/@terra": "openai/gpt-6.2-terra"})
    assert family_drift(PodPaths(pod)) == (0, [])
