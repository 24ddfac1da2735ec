"""The site directory of the proxy and worker images: the runtime dependency closure and what gets copied."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clawstack.pod.errors import BackendError
from clawstack.pod.imagebuild_site import (
    SITE_MTIME,
    DistributionFinder,
    canonical_name,
    distribution_files,
    evaluate_marker,
    marker_environment,
    parse_requirement,
    populate_site,
    runtime_closure,
)

DEV_ONLY = ["pytest", "pytest-asyncio", "hypothesis", "ruff", "mypy", "types-pyyaml", "iniconfig", "pluggy"]
ENV = {
    **marker_environment(),
    "python_version": "3.11",
    "python_full_version": "3.11.7",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
}


def test_the_closure_of_this_environment_is_clawstack_and_its_runtime_dependencies() -> None:
    names = [canonical_name(d.metadata["Name"]) for d in runtime_closure()]
    assert names == sorted(names)
    for needed in ["clawstack", "aiohttp", "pydantic", "pydantic-core", "pyyaml", "click", "mcp", "docker"]:
        assert needed in names
    for dev in DEV_ONLY:
        assert dev not in names


def test_clawstack_files_come_from_its_package_directory_without_byte_code() -> None:
    files = distribution_files(importlib.metadata.distribution("clawstack"))
    paths = {path.as_posix() for path in files}
    assert "clawstack/__main__.py" in paths
    assert "clawstack/worker/oneshot.py" in paths
    assert "clawstack/pod/dockerfiles/worker.Dockerfile" in paths
    assert "clawstack-0.1.0.dist-info/METADATA" in paths
    assert not [p for p in paths if "__pycache__" in p or p.endswith((".pyc", ".pth")) or "direct_url" in p]
    assert not [p for p in paths if p.startswith(("..", "/"))]


def write_distribution(root: Path, name: str, requires: list[str], files: dict[str, str] | None = None) -> None:
    info = root / f"{name}-1.0.dist-info"
    info.mkdir()
    lines = ["Metadata-Version: 2.1", f"Name: {name}", "Version: 1.0", *[f"Requires-Dist: {r}" for r in requires]]
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    record = [f"{info.name}/METADATA,,", f"{info.name}/RECORD,,"]
    for path, text in (files or {}).items():
        target = root / path
        if not path.startswith(".."):
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        record.append(f"{path},,")
    (info / "RECORD").write_text("\n".join(record) + "\n")


def finder(root: Path) -> DistributionFinder:
    def find(name: str) -> importlib.metadata.Distribution:
        for distribution in importlib.metadata.distributions(path=[str(root)]):
            if canonical_name(distribution.metadata["Name"]) == canonical_name(name):
                return distribution
        raise importlib.metadata.PackageNotFoundError(name)

    return find


def test_the_walk_follows_base_requirements_markers_and_requested_extras(tmp_path: Path) -> None:
    write_distribution(
        tmp_path,
        "root",
        [
            "Alpha>=1",
            "beta[X]; python_version >= '3.8'",
            "gamma; python_version < '3'",
            "devtool; extra == 'dev'",
            "win; sys_platform == 'win32'",
        ],
    )
    write_distribution(tmp_path, "Alpha", ["root"])  # a cycle back to the root
    write_distribution(tmp_path, "beta", ["eps; extra == 'x'", "zeta; extra == 'y'"])
    write_distribution(tmp_path, "eps", [])
    closure = runtime_closure("root", find=finder(tmp_path), environment=ENV)
    assert [canonical_name(d.metadata["Name"]) for d in closure] == ["alpha", "beta", "eps", "root"]


def test_a_missing_runtime_dependency_is_an_error(tmp_path: Path) -> None:
    write_distribution(tmp_path, "root", ["absent"])
    with pytest.raises(BackendError) as info:
        runtime_closure("root", find=finder(tmp_path), environment=ENV)
    assert info.value.code == "dependency_missing"
    assert "absent, needed by root," in info.value.message


def test_populate_copies_the_record_inside_the_site_only(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    files = {
        "pkg/__init__.py": "x = 1\n",
        "pkg/__pycache__/__init__.cpython-311.pyc": "",
        "pkg/native.so": "elf",
        "extra.pth": "import os\n",
        "../../../bin/tool": "",
        "pkg-1.0.dist-info/direct_url.json": "{}",
    }
    write_distribution(source, "pkg", [], files)
    (source / "pkg" / "native.so").chmod(0o755)
    distribution = next(iter(importlib.metadata.distributions(path=[str(source)])))
    site = tmp_path / "site"
    copied = [path.as_posix() for path in populate_site(site, [distribution])]
    assert set(copied) == {"pkg-1.0.dist-info/METADATA", "pkg-1.0.dist-info/RECORD", "pkg/__init__.py", "pkg/native.so"}
    assert (site / "pkg" / "native.so").stat().st_mode & 0o777 == 0o755
    assert (site / "pkg" / "__init__.py").stat().st_mode & 0o777 == 0o644
    assert {int((site / p).stat().st_mtime) for p in copied} == {SITE_MTIME}


@pytest.mark.parametrize(
    ("text", "name", "extras", "marker"),
    [
        ("PyYAML>=6,<7", "pyyaml", set(), None),
        ("uvicorn[standard, Cli_X] >=0.30 ; extra == 'x'", "uvicorn", {"standard", "cli-x"}, "extra == 'x'"),
        ("typing_extensions", "typing-extensions", set(), None),
        ("foo @ https://example.invalid/foo.whl ; os_name == 'nt'", "foo", set(), "os_name == 'nt'"),
    ],
)
def test_requirements_parse(text: str, name: str, extras: set[str], marker: str | None) -> None:
    requirement = parse_requirement(text)
    assert (requirement.name, set(requirement.extras), requirement.marker) == (name, extras, marker)


@pytest.mark.parametrize("text", ["", ">=1", "[x]", "foo[bad extra]", "-foo"])
def test_malformed_requirements_are_refused(text: str) -> None:
    with pytest.raises(BackendError) as info:
        parse_requirement(text)
    assert info.value.code == "requirement_invalid"


@pytest.mark.parametrize(
    ("marker", "extras", "expected"),
    [
        ('python_version >= "3.8"', (), True),
        ('python_version < "3.10"', (), False),
        ('python_version == "3.11"', (), True),
        ('python_version == "3.*"', (), True),
        ('python_version != "3.*"', (), False),
        ('python_full_version >= "3.11.7"', (), True),
        ('python_full_version < "3.11.0rc1"', (), False),
        ('python_full_version > "3.11.7rc1"', (), True),
        ('python_version ~= "3.9"', (), True),
        ('python_full_version ~= "3.10.1"', (), False),
        ("sys_platform == 'win32' or sys_platform == 'linux'", (), True),
        ("sys_platform == 'linux' and (os_name == 'nt' or implementation_name == 'cpython')", (), True),
        ("'linux' in sys_platform", (), True),
        ("platform_machine not in 'arm64 aarch64'", (), True),
        ("platform_python_implementation === 'CPython'", (), True),
        ('extra == "dev"', (), False),
        ('extra == "Dev_Tools"', ("dev-tools",), True),
        ('"dev" == extra', ("dev",), True),
        ('extra != "dev"', (), True),
        ('python_version >= "3" and extra == "x"', ("x",), True),
    ],
)
def test_markers_evaluate(marker: str, extras: tuple[str, ...], expected: bool) -> None:
    assert evaluate_marker(marker, ENV, extras) is expected


@pytest.mark.parametrize(
    "marker",
    [
        "",
        "python_version",
        "python_version >=",
        "python_version >= '3' and",
        "(python_version >= '3'",
        "python_version >= '3')",
        "python_version >= 3",
        "unknown_var == 'x'",
        "python_version not '3'",
        "extra < 'x'",
        "extra == sys_platform",
        "sys_platform < 'linux'",
        "python_version ~= '3'",
        "python_version >= '3' python_version",
        "python_version >= '3",
    ],
)
def test_malformed_markers_are_refused(marker: str) -> None:
    with pytest.raises(BackendError) as info:
        evaluate_marker(marker, ENV)
    assert info.value.code == "requirement_invalid"


@given(st.text(alphabet=st.sampled_from(list("()'\" =<>!~.*abcdeinorstuvxy_0123456789")), max_size=40))
def test_any_marker_text_evaluates_or_is_refused_as_invalid(marker: str) -> None:
    outcome: object
    try:
        outcome = evaluate_marker(marker, ENV)
    except BackendError as error:
        outcome = error.code
    assert outcome in (True, False, "requirement_invalid")
