"""bubblewrap's command line, the mounts, resource limits, and the rule that the spec module needs only the
standard library (the local backend's monitor loads it by path)."""

from __future__ import annotations

import ast
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from clawstack.sandbox import (
    SANDBOX_HOSTNAME,
    SYSTEM_DIRS,
    Mount,
    ResourceLimits,
    SandboxSpec,
    bind,
    bwrap_argv,
    dev,
    directory,
    fd_file,
    proc,
    ro_bind,
    symlink,
    system_mounts,
    tmpfs,
)
from clawstack.sandbox import spec as spec_module

COMMAND = ["/bin/sh", "-c", "echo --share-net"]


def argv_for(spec: SandboxSpec, command: list[str] = COMMAND) -> list[str]:
    return bwrap_argv("/usr/bin/bwrap", spec, command)


def head(argv: list[str]) -> list[str]:
    return argv[: argv.index("--")]


def pairs(argv: list[str], flag: str, width: int = 1) -> list[tuple[str, ...]]:
    options = head(argv)
    return [tuple(options[index + 1 : index + 1 + width]) for index, item in enumerate(options) if item == flag]


def spec(**changes: object) -> SandboxSpec:
    values: dict[str, object] = {
        "env": {"PATH": "/usr/bin:/bin", "HOME": "/ws"},
        "mounts": (ro_bind("/usr"), proc(), dev(), tmpfs("/tmp", 1 << 20), bind("/srv/ws", "/ws")),
        "chdir": "/ws",
    }
    values.update(changes)
    return SandboxSpec(**values)  # type: ignore[arg-type]


# --- what every sandbox gets ------------------------------------------------------------------------------------


def test_every_sandbox_unshares_every_namespace_including_the_network() -> None:
    for candidate in (spec(), SandboxSpec(env={}, mounts=())):
        argv = argv_for(candidate)
        options = head(argv)
        assert argv[0] == "/usr/bin/bwrap"
        for flag in ("--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session"):
            assert flag in options
        assert "--share-net" not in options  # the command's own text is no option
        assert pairs(argv, "--cap-drop") == [("ALL",)]
        assert pairs(argv, "--hostname") == [(SANDBOX_HOSTNAME,)]


def test_the_environment_is_cleared_and_only_the_spec_variables_are_set() -> None:
    argv = argv_for(spec(env={"ZED": "1", "ALPHA": "two words"}))
    options = head(argv)
    assert options.index("--clearenv") < options.index("--setenv")
    assert pairs(argv, "--setenv", 2) == [("ALPHA", "two words"), ("ZED", "1")]


def test_mounts_keep_their_order_and_the_root_goes_read_only_after_them() -> None:
    argv = argv_for(spec())
    options = head(argv)
    order = [options.index(flag) for flag in ("--ro-bind", "--proc", "--dev", "--tmpfs", "--bind")]
    assert order == sorted(order)
    assert pairs(argv, "--remount-ro") == [("/dev",), ("/",)]
    assert options.index("--remount-ro", options.index("--bind")) > options.index("--bind")
    assert pairs(argv, "--bind", 2) == [("/srv/ws", "/ws")]
    tmp = options.index("--tmpfs")
    assert options[tmp - 2 : tmp + 2] == ["--size", str(1 << 20), "--tmpfs", "/tmp"]
    assert pairs(argv, "--chdir") == [("/ws",)]


def test_the_command_follows_the_separator_untouched() -> None:
    argv = argv_for(spec())
    assert argv[argv.index("--") + 1 :] == COMMAND
    assert argv.count("--") == 1


def test_a_status_descriptor_is_passed_on() -> None:
    assert pairs(argv_for(spec(status_fd=9)), "--json-status-fd") == [("9",)]
    assert "--json-status-fd" not in argv_for(spec())


def test_each_mount_renders_as_bubblewrap_expects() -> None:
    assert ro_bind("/usr").argv() == ["--ro-bind", "/usr", "/usr"]
    assert ro_bind("/a", "/b").argv() == ["--ro-bind", "/a", "/b"]
    assert bind(Path("/a")).argv() == ["--bind", "/a", "/a"]
    assert symlink("usr/lib", "/lib").argv() == ["--symlink", "usr/lib", "/lib"]
    assert proc().argv() == ["--proc", "/proc"]
    assert dev().argv() == ["--dev", "/dev", "--remount-ro", "/dev"]
    assert tmpfs("/tmp").argv() == ["--tmpfs", "/tmp"]
    assert directory("/tmp/x", "0700").argv() == ["--perms", "0700", "--dir", "/tmp/x"]
    assert fd_file(7, "/tmp/x/c.json").argv() == ["--perms", "0600", "--file", "7", "/tmp/x/c.json"]


@pytest.mark.parametrize(
    "make",
    [
        lambda: Mount("ro-bind", "relative", "/usr"),
        lambda: Mount("bind", "/ws", ""),
        lambda: Mount("overlay", "/x", "/y"),  # type: ignore[arg-type]
        lambda: Mount("tmpfs", "/tmp", size=0),
        lambda: Mount("dir", "/tmp/x", perms="777"),
        lambda: ro_bind("/usr\0/x"),
        lambda: SandboxSpec(env={"BAD=NAME": "x"}, mounts=()),
        lambda: SandboxSpec(env={"OK": "nul\0"}, mounts=()),
        lambda: SandboxSpec(env={}, mounts=(), chdir="relative"),
        lambda: bwrap_argv("bwrap", SandboxSpec(env={}, mounts=()), []),
        lambda: bwrap_argv("bwrap", SandboxSpec(env={}, mounts=()), ["a\0b"]),
        lambda: ResourceLimits(open_files=-1),
        lambda: ResourceLimits(processes=True),  # type: ignore[arg-type]
    ],
)
def test_malformed_specs_are_refused(make: object) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the message varies; the type is the contract
        make()  # type: ignore[operator]


def test_system_mounts_mirror_the_host() -> None:
    mounts = system_mounts()
    assert mounts[0] == ro_bind("/usr")
    for name in SYSTEM_DIRS:
        path = Path("/", name)
        found = [mount for mount in mounts if mount.dest == str(path)]
        if path.is_symlink():
            assert found == [symlink(os.readlink(path), str(path))]
        elif path.is_dir():
            assert found == [ro_bind(str(path))]
        else:
            assert found == []
    assert all(not mount.dest.startswith(("/etc", "/root", "/home", "/work")) for mount in mounts)


def test_extra_system_paths_are_bound_read_only_when_they_exist(tmp_path: Path) -> None:
    mounts = system_mounts([str(tmp_path), str(tmp_path / "missing")])
    assert mounts[-1] == ro_bind(str(tmp_path))
    assert all(mount.dest != str(tmp_path / "missing") for mount in mounts)


# --- resource limits ----------------------------------------------------------------------------------------------


def test_limits_become_prlimit_options_and_core_dumps_are_off_by_default() -> None:
    limits = ResourceLimits(address_space_bytes=1 << 30, file_bytes=1 << 20, open_files=64)
    argv = limits.prlimit_argv("/usr/bin/prlimit")
    assert argv[0] == "/usr/bin/prlimit"
    assert argv[-1] == "--"
    assert set(argv[1:-1]) == {f"--as={1 << 30}", f"--fsize={1 << 20}", "--nofile=64", "--core=0"}
    assert ResourceLimits(core_bytes=None).prlimit_argv("prlimit") == ["prlimit", "--"]


def test_a_limit_never_exceeds_the_callers_hard_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    values = {which: value for which, value, _ in ResourceLimits(open_files=10**12).values()}
    assert values[resource.RLIMIT_NOFILE] == (10**12 if hard == resource.RLIM_INFINITY else hard)


def test_applied_limits_hold_in_a_child() -> None:
    code = (
        "import resource\n"
        "from clawstack.sandbox.spec import ResourceLimits\n"
        "ResourceLimits(file_bytes=4096, open_files=32).apply()\n"
        "print(resource.getrlimit(resource.RLIMIT_FSIZE), resource.getrlimit(resource.RLIMIT_NOFILE),"
        " resource.getrlimit(resource.RLIMIT_CORE))\n"
    )
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert output.strip() == "(4096, 4096) (32, 32) (0, 0)"


# --- standard library only ----------------------------------------------------------------------------------------


def test_the_spec_module_imports_only_the_standard_library() -> None:
    tree = ast.parse(Path(spec_module.__file__).read_text())
    imported = {
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    roots = {name.split(".")[0] for name in imported}
    assert roots <= set(sys.stdlib_module_names) | {"__future__"}, roots


def test_the_spec_module_loads_by_path_without_clawstack() -> None:
    code = (
        "import importlib.util, sys\n"
        f"found = importlib.util.spec_from_file_location('claw_spec', {spec_module.__file__!r})\n"
        "module = importlib.util.module_from_spec(found)\n"
        "sys.modules['claw_spec'] = module\n"
        "found.loader.exec_module(module)\n"
        "print(module.bwrap_argv('bwrap', module.SandboxSpec(env={}, mounts=()), ['true'])[-1])\n"
        "print(sorted(name for name in sys.modules if name.startswith('clawstack')))\n"
    )
    output = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert output.stdout.split("\n")[:2] == ["true", "[]"]
