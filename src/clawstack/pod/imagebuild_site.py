"""The site directory of the proxy and worker images: clawstack and exactly its runtime dependency closure.

:func:`runtime_closure` walks the ``Requires-Dist`` metadata of the installed ``clawstack`` distribution: base
requirements only (no extras of clawstack itself, so no pytest, mypy, ruff or hypothesis), each requirement's
environment marker evaluated for this interpreter, the extras a requirement asks of its dependency followed.
:func:`populate_site` copies each distribution's files from its ``RECORD`` into a site directory, and for a
top-level package ``RECORD`` does not carry (an editable install, such as a clawstack checkout) the package
directory itself; ``__pycache__``, byte code, ``.pth`` files, ``direct_url.json`` (a host path) and files that
``RECORD`` places outside the site directory (console scripts) are left out. Everything comes from what is
installed here: nothing is downloaded.

Failures raise :class:`~clawstack.pod.errors.BackendError`:

``dependency_missing``   a runtime requirement is not installed in this environment
``requirement_invalid``  a distribution's ``Requires-Dist`` entry or marker cannot be parsed or evaluated
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import sys
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Final

from clawstack.pod.errors import BackendError

__all__ = [
    "DistributionFinder",
    "Requirement",
    "canonical_name",
    "evaluate_marker",
    "marker_environment",
    "parse_requirement",
    "populate_site",
    "runtime_closure",
]

DistributionFinder = Callable[[str], importlib.metadata.Distribution]
"""Finds an installed distribution by name; raises ``importlib.metadata.PackageNotFoundError`` when absent."""

SITE_MTIME: Final = 0
"""The modification time of every file and directory :func:`populate_site` writes."""

_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_REQUIREMENT = re.compile(
    rf"\s*(?P<name>{_NAME})\s*(?:\[(?P<extras>[^\]]*)\])?(?P<spec>[^;]*?)\s*(?:;(?P<marker>.*))?", re.DOTALL
)
_TOKEN = re.compile(
    r"""\s*(?:(?P<string>'[^']*'|"[^"]*")|(?P<op>===|==|!=|<=|>=|~=|<|>|\(|\))|(?P<word>[A-Za-z_][A-Za-z0-9_.]*))"""
)
_MARKER_VARIABLES: Final = frozenset(
    {
        "extra",
        "implementation_name",
        "implementation_version",
        "os_name",
        "platform_machine",
        "platform_python_implementation",
        "platform_release",
        "platform_system",
        "platform_version",
        "python_full_version",
        "python_version",
        "sys_platform",
    }
)
_VERSION = re.compile(r"(?P<release>\d+(?:\.\d+)*)(?P<rest>.*)")


def _invalid(message: str) -> BackendError:
    return BackendError(message, code="requirement_invalid")


def canonical_name(name: str) -> str:
    """The PEP 503 normalised form of a distribution or extra name: ``PyYAML`` -> ``pyyaml``."""
    return re.sub(r"[-_.]+", "-", name).lower()


class Requirement:
    """One ``Requires-Dist`` entry: the distribution's name, the extras it asks for, and its marker (or None)."""

    __slots__ = ("extras", "marker", "name")

    def __init__(self, name: str, extras: frozenset[str], marker: str | None) -> None:
        self.name = name
        self.extras = extras
        self.marker = marker

    def __repr__(self) -> str:
        return f"Requirement({self.name!r}, extras={sorted(self.extras)!r}, marker={self.marker!r})"


def parse_requirement(text: str) -> Requirement:
    """Parse a PEP 508 requirement far enough to walk it: name, extras, marker; the version part is ignored."""
    match = _REQUIREMENT.fullmatch(text)
    if match is None:
        raise _invalid(f"cannot parse the requirement {text!r}")
    extras: set[str] = set()
    for extra in (match.group("extras") or "").split(","):
        extra = extra.strip()
        if extra and not re.fullmatch(_NAME, extra):
            raise _invalid(f"cannot parse the extra {extra!r} of the requirement {text!r}")
        if extra:
            extras.add(canonical_name(extra))
    marker = (match.group("marker") or "").strip() or None
    return Requirement(canonical_name(match.group("name")), frozenset(extras), marker)


def marker_environment() -> dict[str, str]:
    """The values of the PEP 508 marker variables for this interpreter (an image runs the same one)."""
    implementation = sys.implementation
    info = implementation.version
    implementation_version = f"{info.major}.{info.minor}.{info.micro}"
    if info.releaselevel != "final":
        implementation_version += info.releaselevel[0] + str(info.serial)
    return {
        "implementation_name": implementation.name,
        "implementation_version": implementation_version,
        "os_name": os.name,
        "platform_machine": platform.machine(),
        "platform_python_implementation": platform.python_implementation(),
        "platform_release": platform.release(),
        "platform_system": platform.system(),
        "platform_version": platform.version(),
        "python_full_version": platform.python_version(),
        "python_version": ".".join(platform.python_version_tuple()[:2]),
        "sys_platform": sys.platform,
    }


def evaluate_marker(marker: str, environment: Mapping[str, str], extras: Collection[str] = ()) -> bool:
    """Whether the PEP 508 ``marker`` holds in ``environment`` when ``extras`` (canonical names) are requested."""
    tokens = _tokenize(marker)
    position, value = _parse_or(tokens, 0, environment, frozenset(extras), marker)
    if position != len(tokens):
        raise _invalid(f"unexpected {tokens[position][1]!r} in the marker {marker!r}")
    return value


def _tokenize(marker: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    position = 0
    while position < len(marker):
        if marker[position:].strip() == "":
            break
        match = _TOKEN.match(marker, position)
        if match is None:
            raise _invalid(f"cannot parse the marker {marker!r} at {marker[position:].strip()[:20]!r}")
        kind = match.lastgroup
        assert kind is not None
        tokens.append((kind, match.group(kind)))
        position = match.end()
    return tokens


_Tokens = list[tuple[str, str]]


def _parse_or(tokens: _Tokens, at: int, env: Mapping[str, str], extras: frozenset[str], text: str) -> tuple[int, bool]:
    at, value = _parse_and(tokens, at, env, extras, text)
    while at < len(tokens) and tokens[at] == ("word", "or"):
        at, right = _parse_and(tokens, at + 1, env, extras, text)
        value = value or right
    return at, value


def _parse_and(tokens: _Tokens, at: int, env: Mapping[str, str], extras: frozenset[str], text: str) -> tuple[int, bool]:
    at, value = _parse_atom(tokens, at, env, extras, text)
    while at < len(tokens) and tokens[at] == ("word", "and"):
        at, right = _parse_atom(tokens, at + 1, env, extras, text)
        value = value and right
    return at, value


def _parse_atom(
    tokens: _Tokens, at: int, env: Mapping[str, str], extras: frozenset[str], text: str
) -> tuple[int, bool]:
    if at < len(tokens) and tokens[at] == ("op", "("):
        at, value = _parse_or(tokens, at + 1, env, extras, text)
        if at >= len(tokens) or tokens[at] != ("op", ")"):
            raise _invalid(f"unbalanced parentheses in the marker {text!r}")
        return at + 1, value
    at, left = _operand(tokens, at, text)
    if at < len(tokens) and tokens[at] == ("word", "not"):
        if at + 1 >= len(tokens) or tokens[at + 1] != ("word", "in"):
            raise _invalid(f"expected 'not in' in the marker {text!r}")
        op, at = "not in", at + 2
    elif at < len(tokens) and (
        (tokens[at][0] == "op" and tokens[at][1] not in ("(", ")")) or tokens[at] == ("word", "in")
    ):
        op, at = tokens[at][1], at + 1
    else:
        raise _invalid(f"expected a comparison in the marker {text!r}")
    at, right = _operand(tokens, at, text)
    return at, _compare(left, op, right, env, extras, text)


def _operand(tokens: _Tokens, at: int, text: str) -> tuple[int, tuple[str, str]]:
    if at >= len(tokens):
        raise _invalid(f"the marker {text!r} ends too early")
    kind, value = tokens[at]
    if kind == "string":
        return at + 1, ("string", value[1:-1])
    if kind == "word" and value in _MARKER_VARIABLES:
        return at + 1, ("variable", value)
    raise _invalid(f"{value!r} is not a marker variable or a quoted string, in the marker {text!r}")


def _compare(
    left: tuple[str, str],
    op: str,
    right: tuple[str, str],
    env: Mapping[str, str],
    extras: frozenset[str],
    text: str,
) -> bool:
    if ("variable", "extra") in (left, right):
        other = right if left == ("variable", "extra") else left
        if other[0] != "string" or op not in ("==", "!="):
            raise _invalid(f"extra can only be compared with == or != to a quoted name, in the marker {text!r}")
        return (canonical_name(other[1]) in extras) == (op == "==")
    lhs, rhs = (env.get(value, "") if kind == "variable" else value for kind, value in (left, right))
    if op == "in":
        return lhs in rhs
    if op == "not in":
        return lhs not in rhs
    if op == "===":
        return lhs == rhs
    return _compare_versions(lhs, op, rhs, text)


def _compare_versions(lhs: str, op: str, rhs: str, text: str) -> bool:
    if op in ("==", "!=") and rhs.endswith(".*"):
        prefix = rhs[:-2].split(".")
        equal = lhs.split(".")[: len(prefix)] == prefix
        return equal == (op == "==")
    left, right = _version_key(lhs), _version_key(rhs)
    if left is None or right is None:
        if op in ("==", "!="):
            return (lhs == rhs) == (op == "==")
        raise _invalid(f"cannot order {lhs!r} and {rhs!r} as versions, in the marker {text!r}")
    if op == "~=":
        release = rhs.split(".")
        if len(release) < 2:
            raise _invalid(f"~= needs at least two version parts, in the marker {text!r}")
        return left >= right and lhs.split(".")[: len(release) - 1] == release[:-1]
    comparisons = {
        "==": left == right,
        "!=": left != right,
        "<": left < right,
        "<=": left <= right,
        ">": left > right,
        ">=": left >= right,
    }
    return comparisons[op]


def _version_key(value: str) -> tuple[tuple[int, ...], int, str] | None:
    match = _VERSION.fullmatch(value.strip())
    if match is None:
        return None
    release = tuple(int(part) for part in match.group("release").split("."))
    while len(release) > 1 and release[-1] == 0:
        release = release[:-1]
    rest = match.group("rest")
    # A pre-release (3.13.0rc1) sorts before its final release; anything else after the release sorts after it.
    rank = 1 if not rest else 0 if re.match(r"[.-]?(a|b|c|rc|alpha|beta|pre|preview|dev)", rest) else 2
    return release, rank, rest


def runtime_closure(
    root: str = "clawstack",
    *,
    find: DistributionFinder = importlib.metadata.distribution,
    environment: Mapping[str, str] | None = None,
) -> list[importlib.metadata.Distribution]:
    """``root`` and every distribution it needs at run time, sorted by canonical name (see the module docstring).

    ``find`` looks distributions up (default: this environment's); ``environment`` holds the marker variables
    (default: :func:`marker_environment`). Raises ``dependency_missing`` or ``requirement_invalid``.
    """
    env = marker_environment() if environment is None else environment
    found: dict[str, importlib.metadata.Distribution] = {}
    walked_extras: dict[str, frozenset[str]] = {}
    pending: list[tuple[str, frozenset[str], str | None]] = [(canonical_name(root), frozenset(), None)]
    while pending:
        name, extras, needed_by = pending.pop()
        previous = walked_extras.get(name)
        if previous is not None and extras <= previous:
            continue
        walked_extras[name] = (previous or frozenset()) | extras
        distribution = found.get(name)
        if distribution is None:
            try:
                distribution = find(name)
            except importlib.metadata.PackageNotFoundError as error:
                why = f", needed by {needed_by}," if needed_by else ""
                raise BackendError(
                    f"the distribution {name}{why} is not installed here; the image's site directory is made "
                    "from this environment, so install clawstack with its dependencies first",
                    code="dependency_missing",
                ) from error
            found[name] = distribution
        for line in distribution.requires or ():
            requirement = parse_requirement(line)
            if requirement.marker is None or evaluate_marker(requirement.marker, env, walked_extras[name]):
                pending.append((requirement.name, requirement.extras, name))
    return [found[name] for name in sorted(found)]


def _record_files(distribution: importlib.metadata.Distribution, site: Path) -> dict[Path, Path]:
    files: dict[Path, Path] = {}
    for entry in distribution.files or ():
        relative = Path(entry)
        if relative.is_absolute() or ".." in relative.parts or "__pycache__" in relative.parts:
            continue
        name = relative.name
        if name.endswith((".pyc", ".pth")) or name.startswith("__editable__") or name == "direct_url.json":
            continue
        source = site / relative
        if source.is_file():
            files[relative] = source
    return files


def _top_level_names(distribution: importlib.metadata.Distribution) -> list[str]:
    text = distribution.read_text("top_level.txt") or ""
    return [name.strip() for name in text.splitlines() if name.strip()]


def _package_files(name: str) -> dict[Path, Path]:
    spec = importlib.util.find_spec(name)
    if spec is None:
        return {}
    files: dict[Path, Path] = {}
    if spec.submodule_search_locations:
        package = Path(next(iter(spec.submodule_search_locations)))
        for directory, subdirectories, filenames in os.walk(package):
            subdirectories[:] = sorted(d for d in subdirectories if d != "__pycache__")
            for filename in filenames:
                source = Path(directory) / filename
                if not filename.endswith(".pyc") and source.is_file():
                    files[Path(name) / source.relative_to(package)] = source
    elif spec.origin and Path(spec.origin).is_file():
        files[Path(Path(spec.origin).name)] = Path(spec.origin)
    return files


def distribution_files(distribution: importlib.metadata.Distribution) -> dict[Path, Path]:
    """What :func:`populate_site` copies for ``distribution``: path in the site directory -> host file."""
    site = Path(str(distribution.locate_file("")))
    files = _record_files(distribution, site)
    for name in _top_level_names(distribution):
        carried = any(path.parts[0] == name or path.name in (f"{name}.py",) for path in files)
        if not carried:
            files.update(_package_files(name))
    return files


def populate_site(site: Path, distributions: Collection[importlib.metadata.Distribution]) -> list[Path]:
    """Copy ``distributions`` into the new directory ``site`` (modes normalised, mtimes fixed); returns the files.

    Returned paths are relative to ``site``, sorted; the caller lays out the host directory ``site``.
    """
    copied: dict[Path, Path] = {}
    for distribution in distributions:
        copied.update(distribution_files(distribution))
    site.mkdir(mode=0o755)
    directories: set[Path] = set()
    for relative, source in sorted(copied.items()):
        target = site / relative
        for parent in reversed(relative.parents[:-1]):
            if parent not in directories:
                (site / parent).mkdir(mode=0o755, exist_ok=True)
                directories.add(parent)
        shutil.copyfile(source, target)
        target.chmod(0o755 if source.stat().st_mode & 0o111 else 0o644)
        os.utime(target, (SITE_MTIME, SITE_MTIME))
    for directory in sorted(directories, key=lambda path: len(path.parts), reverse=True):
        os.utime(site / directory, (SITE_MTIME, SITE_MTIME))
    os.utime(site, (SITE_MTIME, SITE_MTIME))
    return sorted(copied)
