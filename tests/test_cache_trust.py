"""The trust rule (issue 18, point 1): nothing another local user could have written is
loaded or written through. Each planted entry is a valid cache entry (manifest, size,
checksum and key all match) whose library has a constructor that leaves a marker: the
marker must never appear, and the kernel's result must come from a private rebuild."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import OK_SOURCE

from mllm_kernel.jit_utils import (
    KernelBuildError,
    build_inputs,
    cache,
    load_cpu_jit,
    registry,
    toolchain,
    trust,
)
from mllm_kernel.jit_utils.cache_key import module_key
from mllm_kernel.jit_utils.loader import cpu_spec
from mllm_kernel.jit_utils.spec import BuildSpec

EVIL_SOURCE = """
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void planted() {
  int fd = open("{marker}", O_CREAT | O_WRONLY, 0644);
  if (fd >= 0) close(fd);
}
"""
NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


@pytest.fixture(autouse=True)
def _forget_user_kernels():
    """The registry remembers every module loaded in this process; show-config tests that
    run later must not see this file's "ok" kernel."""
    yield
    registry.unregister("ok", "cpu")


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A HOME of the test's own: the private fallback cache lands under it."""
    path = tmp_path / "home"
    path.mkdir()
    monkeypatch.setenv("HOME", str(path))
    return path


def _spec(source: Path) -> BuildSpec:
    return cpu_spec("ok", "3", cpp_files=[source], cpp_wrappers=[("f", "ok::f<3>")])


def _load(source: Path):
    return load_cpu_jit("ok", "3", cpp_files=[str(source)], cpp_wrappers=[("f", "ok::f<3>")])


@pytest.fixture(scope="module")
def real_entry(tmp_path_factory) -> tuple[Path, Path]:
    """``(source, entry dir)`` of one genuine build of ok<3>, copied by each test."""
    base = tmp_path_factory.mktemp("real")
    source = base / "ok.cpp"
    source.write_text(OK_SOURCE)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLLM_KERNEL_CACHE_DIR", str(base / "cache"))
        assert _load(source).f() == 3
        return source, module_key(_spec(source)).path


def _plant(entry: Path, where: Path, marker: Path) -> Path:
    """A copy of ``entry`` at ``where`` whose library is replaced by one that creates
    ``marker`` when loaded, with the manifest updated to match: everything but its
    owner and mode says "load me"."""
    shutil.copytree(entry, where)
    manifest = json.loads((where / "manifest.json").read_text())
    evil_cpp = where.parent / "evil.cpp"
    evil_cpp.write_text(EVIL_SOURCE.replace("{marker}", str(marker)))
    artifact = where / manifest["artifact"]
    subprocess.run(
        [str(toolchain.find_cxx().path), "-shared", "-fPIC", str(evil_cpp), "-o", str(artifact)],
        check=True,
    )
    evil_cpp.unlink()
    manifest["artifact_size"] = artifact.stat().st_size
    manifest["artifact_sha256"] = build_inputs.file_digest(artifact)
    (where / "manifest.json").write_text(json.dumps(manifest))
    return where


def _chown_tree(path: Path, uid: int) -> None:
    for dirpath, dirnames, filenames in os.walk(path):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in (*dirnames, *filenames))]:
            os.chown(name, uid, uid, follow_symlinks=False)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _foreign_entry(entry: Path) -> None:
    _chown_tree(entry, NOBODY)


def _entry_mode(mode: int):
    return lambda entry: entry.chmod(mode)


def _file_mode(name: str, mode: int):
    def damage(entry: Path) -> None:
        manifest = json.loads((entry / "manifest.json").read_text())
        (entry / (manifest["artifact"] if name == "artifact" else name)).chmod(mode)

    return damage


def _symlinked_entry(entry: Path) -> None:
    target = entry.with_name("elsewhere")
    entry.rename(target)
    entry.symlink_to(target)


ENTRY_DAMAGE = {
    "foreign-owned-entry": (_foreign_entry, "is owned by nobody (uid 65534)"),
    "world-writable-entry": (_entry_mode(0o777), "is writable by group and others"),
    "group-writable-entry": (_entry_mode(0o775), "is writable by its group"),
    "group-writable-artifact": (_file_mode("artifact", 0o664), "is writable by its group"),
    "world-writable-manifest": (_file_mode("manifest.json", 0o646), "is writable by everyone"),
    "symlinked-entry": (_symlinked_entry, "is a symlink"),
}


@needs_root
@pytest.mark.parametrize(
    ("damage", "expected"), ENTRY_DAMAGE.values(), ids=list(ENTRY_DAMAGE.keys())
)
def test_untrusted_entry_is_not_loaded_but_rebuilt(
    real_entry, fresh_cache, tmp_path, warnings_logged, damage, expected
):
    source, entry = real_entry
    fresh_cache.mkdir(mode=0o700)
    marker = tmp_path / "constructor-ran"
    planted = _plant(entry, fresh_cache / entry.name, marker)
    assert cache.lookup(module_key(_spec(source))).status == "hit"  # valid, and ours so far
    damage(planted)

    found = cache.lookup(module_key(_spec(source)))
    assert found.status == "untrusted" and expected in found.reason, found.reason
    assert _load(source).f() == 3  # before: the planted library ran, then the load failed
    assert not marker.exists(), "the planted library was loaded"
    (warning,) = [w for w in warnings_logged if "not loaded" in w]
    assert str(planted) in warning and expected in warning and "mode 0" in warning
    assert "Fix:" in warning and "MLLM_KERNEL_CACHE_DIR" in warning
    rebuilt = module_key(_spec(source)).path
    assert not rebuilt.is_symlink() and rebuilt.lstat().st_uid == os.geteuid()
    assert cache.lookup(module_key(_spec(source))).status == "hit"


@needs_root
@pytest.mark.parametrize(
    ("owner", "mode", "expected"),
    [
        (NOBODY, 0o755, "is owned by nobody (uid 65534), not by you or root"),
        (0, 0o777, "is writable by group and others"),
        (0, 0o1777, "is writable by group and others"),  # /tmp-like: sticky does not stop planting
    ],
    ids=["foreign-owned", "world-writable", "sticky-world-writable"],
)
def test_untrusted_root_is_not_used_and_builds_go_to_a_private_fallback(
    real_entry, tmp_path, home, monkeypatch, warnings_logged, owner, mode, expected
):
    source, entry = real_entry
    shared = tmp_path / "shared"
    shared.mkdir()
    marker = tmp_path / "constructor-ran"
    _plant(entry, shared / entry.name, marker)
    shared.chmod(mode)
    os.chown(shared, owner, owner)
    monkeypatch.setenv("MLLM_KERNEL_CACHE_DIR", str(shared))

    assert _load(source).f() == 3
    assert not marker.exists(), "the planted library was loaded"
    fallback = home / ".cache" / "mllm_kernel"
    assert module_key(_spec(source)).path.parent == fallback
    assert cache.lookup(module_key(_spec(source))).status == "hit"
    (warning,) = [w for w in warnings_logged if "instead of the cache" in w]
    assert f"using {fallback} instead of the cache at {shared}" in warning
    assert expected in warning and f"mode {mode:04o}" in warning
    if mode & 0o1000:  # a shared directory: its mode must stay, the cache goes inside it
        assert (
            f"Fix: leave {shared} as it is" in warning and f"mkdir -m 700 {shared}/$USER" in warning
        )
        assert "chmod" not in warning
    else:
        assert "MLLM_KERNEL_CACHE_DIR at a directory only you can write" in warning
    for created in (home / ".cache", fallback, fallback / ".locks", fallback / ".staging"):
        assert _mode(created) == 0o700, created


def _victim(tmp_path: Path) -> Path:
    """A root-owned 0600 file that a write through a planted symlink would change."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    victim.chmod(0o600)
    return victim


def _plant_links(root: Path, dirname: str, victim: Path, names: tuple[str, ...]) -> None:
    for name in names:  # ".locks/.owner": the directory, then the suffix of the file
        sub, suffix = name.split("/")
        (root / sub).mkdir(mode=0o777, exist_ok=True)
        (root / sub).chmod(0o777)
        (root / sub / f"{dirname}{suffix}").symlink_to(victim)


BROKEN_SOURCE = "namespace ok { template <int K> int f() { return K } }\n"  # missing ';'


@needs_root
def test_planted_owner_and_log_symlinks_in_a_shared_root_are_not_written_through(
    tmp_path, home, monkeypatch, ok_source
):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    victim = _victim(tmp_path)
    broken = tmp_path / "broken" / "ok.cpp"
    broken.parent.mkdir()
    broken.write_text(BROKEN_SOURCE)
    monkeypatch.setenv("MLLM_KERNEL_CACHE_DIR", str(shared))
    for source in (ok_source, broken):
        # Another user plants the links under the name this user's build will use.
        dirname = module_key(_spec(source)).dirname
        _plant_links(shared, dirname, victim, (".locks/.owner", ".logs/.log", ".locks/.lock"))
    _chown_tree(shared, NOBODY)

    assert _load(ok_source).f() == 3
    with pytest.raises(KernelBuildError, match=r"ok.cpp:1: expected .;. before") as info:
        _load(broken)
    assert info.value.log_path.startswith(str(home / ".cache" / "mllm_kernel" / ".logs"))
    assert victim.read_text() == "precious" and _mode(victim) == 0o600


def test_planted_symlinks_in_a_private_root_are_replaced_not_followed(
    tmp_path, fresh_cache, ok_source
):
    # Defense in depth: even in a root that passes the rule, the owner note and the
    # failure log are new files renamed into place, and a symlinked lock is refused.
    victim = _victim(tmp_path)
    broken = tmp_path / "broken" / "ok.cpp"
    broken.parent.mkdir()
    broken.write_text(BROKEN_SOURCE)
    fresh_cache.mkdir(mode=0o700)
    for sub in (".locks", ".logs"):
        (fresh_cache / sub).mkdir(mode=0o700)
    ok_dirname = module_key(_spec(ok_source)).dirname
    broken_dirname = module_key(_spec(broken)).dirname
    for dirname in (ok_dirname, broken_dirname):
        (fresh_cache / ".locks" / f"{dirname}.owner").symlink_to(victim)
        (fresh_cache / ".logs" / f"{dirname}.log").symlink_to(victim)

    assert _load(ok_source).f() == 3
    with pytest.raises(KernelBuildError, match=r"ok.cpp:1: expected .;. before") as info:
        _load(broken)
    assert Path(info.value.log_path).is_file() and not Path(info.value.log_path).is_symlink()
    assert victim.read_text() == "precious"

    (fresh_cache / ".locks" / f"{broken_dirname}.lock").unlink()
    (fresh_cache / ".locks" / f"{broken_dirname}.lock").symlink_to(victim)
    with pytest.raises(KernelBuildError, match=r"is a symlink where the cache keeps a file"):
        _load(broken)
    assert victim.read_text() == "precious"


def test_what_the_cache_creates_is_private_even_with_a_permissive_umask(
    tmp_path, fresh_cache, ok_source
):
    previous = os.umask(0o002)
    try:
        assert _load(ok_source).f() == 3
    finally:
        os.umask(previous)
    entry = module_key(_spec(ok_source)).path
    for directory in (fresh_cache, fresh_cache / ".locks", fresh_cache / ".staging", entry):
        assert _mode(directory) == 0o700, directory
    for file in entry.iterdir():
        assert not _mode(file) & 0o022, (file, oct(_mode(file)))
    assert cache.lookup(module_key(_spec(ok_source))).status == "hit"


# ------------------------------------------------------------ a root that cannot be used
def _file_in_the_way(tmp_path: Path) -> tuple[Path, str]:
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    return blocker / "cache", f"{blocker} is a file, not a directory (ENOTDIR)"


UNUSABLE_ROOTS = {
    # A missing parent on a pseudo filesystem: mkdir says ENOENT, os.access says yes.
    "missing-parent-on-proc": lambda tmp: (
        Path("/proc/x/cache"),
        "(creating /proc/x): No such file or directory (ENOENT)",
    ),
    "file-in-the-way": _file_in_the_way,
}


@pytest.mark.parametrize("make_root", UNUSABLE_ROOTS.values(), ids=list(UNUSABLE_ROOTS))
def test_unusable_root_falls_back_to_the_private_default_with_one_warning(
    tmp_path, home, monkeypatch, warnings_logged, ok_source, make_root
):
    # Before: a 13-frame traceback ending in os.mkdir's FileNotFoundError /
    # NotADirectoryError, naming neither the variable nor a fix.
    root, os_error = make_root(tmp_path)
    monkeypatch.setenv("MLLM_KERNEL_CACHE_DIR", str(root))

    assert _load(ok_source).f() == 3
    assert _load(ok_source).f() == 3
    fallback = home / ".cache" / "mllm_kernel"
    assert module_key(_spec(ok_source)).path.parent == fallback
    assert cache.lookup(module_key(_spec(ok_source))).status == "hit"
    (warning,) = [
        w for w in warnings_logged if "instead of the cache" in w
    ]  # one, not one per call
    assert f"using {fallback} instead of the cache at {root} (MLLM_KERNEL_CACHE_DIR)" in (warning)
    assert f"cannot create {root}" in warning and os_error in warning
    assert "Fix: point MLLM_KERNEL_CACHE_DIR at a directory you can create and write" in warning
    assert _mode(fallback) == 0o700


def test_no_usable_root_is_one_error_naming_both(tmp_path, monkeypatch, ok_source):
    from mllm_kernel.jit_utils.errors import CacheRootError

    not_a_home = tmp_path / "home_is_a_file"
    not_a_home.write_text("")
    monkeypatch.setenv("HOME", str(not_a_home))
    monkeypatch.setenv("MLLM_KERNEL_CACHE_DIR", "/proc/x")
    with pytest.raises(CacheRootError) as info:
        _load(ok_source)
    message = str(info.value)
    assert message.startswith("no cache root can be used: MLLM_KERNEL_CACHE_DIR=/proc/x: ")
    assert "cannot create /proc/x: No such file or directory (ENOENT)" in message
    fallback = not_a_home / ".cache" / "mllm_kernel"
    assert f"the default {fallback}, tried instead: cannot create {fallback}: " in message
    assert f"{not_a_home} is a file, not a directory (ENOTDIR)" in message
    assert message.endswith(
        "Fix: point MLLM_KERNEL_CACHE_DIR at a directory you can create and write"
    )
    assert len(message.splitlines()) == 1

    monkeypatch.delenv("MLLM_KERNEL_CACHE_DIR")  # the default alone: no fallback to name
    with pytest.raises(CacheRootError, match=rf"^the cache root {fallback} cannot be used: "):
        _load(ok_source)


# ------------------------------------------- the directories on the way to the root
# Every check re-resolves the root's path, and so does dlopen: whoever can write a parent
# of the root can rename the root away and put their own directory in its place between
# the two (issue 31, item 6: 12 of 40 victims ran a planted constructor that way). Each
# test plants a valid entry of ours: under a parent others can write it must not load.
def _root_in(parent: Path) -> Path:
    root = parent / "cache"
    root.mkdir(mode=0o700, parents=True)
    return root


def _through_a_named_link(tmp_path: Path, parent: Path) -> Path:
    """The root named through a symlink to its parent: ``<tmp>/via/cache``."""
    (tmp_path / "via").symlink_to(parent)
    return tmp_path / "via" / "cache"


def _as_a_link(tmp_path: Path, parent: Path) -> Path:
    """The root named as a symlink to it: ``<tmp>/link`` -> ``<parent>/cache``."""
    (tmp_path / "link").symlink_to(parent / "cache")
    return tmp_path / "link"


# How MLLM_KERNEL_CACHE_DIR names the root under the open directory ``parent``.
NAMINGS = {
    "parent": lambda tmp_path, parent: parent / "cache",
    "grandparent": lambda tmp_path, parent: parent / "deeper" / "cache",
    "named-through-a-link": _through_a_named_link,
    "root-is-a-link": _as_a_link,
}


@pytest.mark.parametrize(
    ("mode", "writers"),
    [(0o777, "group and others"), (0o775, "its group"), (0o757, "everyone")],
    ids=["world-writable", "group-writable", "other-writable"],
)
@pytest.mark.parametrize("naming", NAMINGS.values(), ids=list(NAMINGS))
def test_a_root_under_a_directory_others_can_write_is_not_used(
    real_entry, tmp_path, home, monkeypatch, warnings_logged, naming, mode, writers
):
    # Before: every check passed (the root itself is private and ours) and the planted
    # library was loaded; an attacker swapping the root in that parent won 12 of 40 races.
    source, entry = real_entry
    parent = tmp_path / "open"
    root = naming(tmp_path, parent)
    real_root = _root_in(root.resolve().parent)
    marker = tmp_path / "constructor-ran"
    _plant(entry, real_root / entry.name, marker)
    parent.chmod(mode)
    monkeypatch.setenv("MLLM_KERNEL_CACHE_DIR", str(root))

    assert _load(source).f() == 3
    assert not marker.exists(), "the planted library was loaded"
    fallback = home / ".cache" / "mllm_kernel"
    assert module_key(_spec(source)).path.parent == fallback
    (warning,) = [w for w in warnings_logged if "instead of the cache" in w]
    assert f"using {fallback} instead of the cache at {root} (MLLM_KERNEL_CACHE_DIR)" in warning
    assert f"passes through {parent}, which is writable by {writers} and has no sticky bit" in (
        warning
    )
    assert f"owner {trust.owner_name(os.geteuid())}, mode {mode:04o}" in warning
    assert f"Fix: chmod go-w {parent} or chmod +t {parent}" in warning


def test_a_root_under_a_sticky_directory_is_used(
    real_entry, tmp_path, home, monkeypatch, warnings_logged
):
    # /tmp's case: in a sticky directory only the root's owner can rename it.
    source, entry = real_entry
    parent = tmp_path / "sticky"
    root = _root_in(parent)
    shutil.copytree(entry, root / entry.name)
    parent.chmod(0o1777)
    monkeypatch.setenv("MLLM_KERNEL_CACHE_DIR", str(root))

    assert trust.check_root(root) is None
    assert _load(source).f() == 3
    assert module_key(_spec(source)).path == root / entry.name
    assert not (home / ".cache").exists() and not warnings_logged


@needs_root
def test_a_root_under_a_directory_of_another_user_is_not_used(
    tmp_path, home, monkeypatch, warnings_logged, ok_source
):
    parent = tmp_path / "theirs"
    root = _root_in(parent)
    os.chown(parent, NOBODY, NOBODY)
    monkeypatch.setenv("MLLM_KERNEL_CACHE_DIR", str(root))

    assert _load(ok_source).f() == 3
    assert module_key(_spec(ok_source)).path.parent == home / ".cache" / "mllm_kernel"
    (warning,) = [w for w in warnings_logged if "instead of the cache" in w]
    assert f"passes through {parent}, which is owned by nobody (uid 65534), not by you or " in (
        warning
    )
    assert f"Fix: move the cache out of {parent}" in warning


@needs_root
def test_a_link_of_another_user_in_a_sticky_directory_is_not_followed(
    tmp_path, home, monkeypatch, warnings_logged, ok_source
):
    # The kernel's protected_symlinks rule: a symlink in /tmp is its owner's to repoint.
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    root = _root_in(tmp_path / "mine")
    link = sticky / "cache"
    link.symlink_to(root)
    os.chown(link, NOBODY, NOBODY, follow_symlinks=False)
    monkeypatch.setenv("MLLM_KERNEL_CACHE_DIR", str(link))

    assert _load(ok_source).f() == 3
    assert module_key(_spec(ok_source)).path.parent == home / ".cache" / "mllm_kernel"
    (warning,) = [w for w in warnings_logged if "instead of the cache" in w]
    assert f"passes through the symlink {link} (owner nobody (uid 65534)" in warning


def _load_into(source: Path, build_directory: Path):
    return load_cpu_jit(
        "ok",
        "3",
        cpp_files=[str(source)],
        cpp_wrappers=[("f", "ok::f<3>")],
        build_directory=str(build_directory),
    )


def test_a_build_directory_under_a_directory_others_can_write_is_an_error(
    real_entry, tmp_path, monkeypatch
):
    # It was asked for by name: no fallback, an error saying what is wrong and the fix.
    source, entry = real_entry
    parent = tmp_path / "open"
    build_directory = _root_in(parent)
    marker = tmp_path / "constructor-ran"
    monkeypatch.setenv("MLLM_KERNEL_CACHE_DIR", str(tmp_path / "cache"))
    planted = module_key(_spec(source)).path.name
    _plant(entry, build_directory / planted, marker)
    parent.chmod(0o777)

    with pytest.raises(KernelBuildError) as info:
        _load_into(source, build_directory)
    assert not marker.exists(), "the planted library was loaded"
    message = str(info.value)
    assert f"the path to {build_directory} passes through {parent}, which is writable" in message
    assert f"Fix: chmod go-w {parent} or chmod +t {parent}" in message
    assert "hint" not in message  # not a full or read-only filesystem: no such hint

    parent.chmod(0o1777)  # sticky: the same directory is fine
    shutil.rmtree(build_directory / planted)
    shutil.copytree(entry, build_directory / planted)
    assert _load_into(source, build_directory).f() == 3


def test_a_build_directory_neither_needs_nor_makes_the_cache_root(ok_source, tmp_path, monkeypatch):
    """load_*_jit(build_directory=...) caches the module there "instead of the cache
    root": the root is not chosen, checked or created (it may be unusable)."""
    never = tmp_path / "never" / "cache"
    monkeypatch.setenv("MLLM_KERNEL_CACHE_DIR", str(never))
    assert _load_into(ok_source, tmp_path / "modules").f() == 3
    assert not (tmp_path / "never").exists()
    entries = [p.name for p in (tmp_path / "modules").iterdir() if not p.name.startswith(".")]
    assert len(entries) == 1 and entries[0].startswith("ok_cpu_3_")


def test_only_a_passing_path_is_remembered(tmp_path, monkeypatch):
    parent = tmp_path / "open"
    root = parent / "cache"
    walks: list[Path] = []
    walk = trust._walk_ancestors

    def counting(path, *args):
        walks.append(path)
        return walk(path, *args)

    monkeypatch.setattr(trust, "_walk_ancestors", counting)
    assert trust.check_root(root) is None  # missing: not remembered, it may still be made
    parent.mkdir(mode=0o777)
    parent.chmod(0o777)
    root.mkdir(mode=0o700)
    assert "has no sticky bit" in trust.check_root(root)
    assert "has no sticky bit" in trust.check_root(root)  # a failure is checked again
    parent.chmod(0o755)
    assert trust.check_root(root) is None
    assert trust.check_root(root) is None  # remembered: no walk
    monkeypatch.setenv("MLLM_KERNEL_TRUSTED_CACHE_OWNERS", str(NOBODY))
    assert trust.check_root(root, any_owner=True) is None  # other owners trusted: walked
    assert walks == [root] * 5


# Swaps argv[1] with a symlink to argv[2] and back, as fast as it can, for 30 seconds (C:
# the interpreter may sit where the other user cannot run it).
ATTACKER = """
#include <stdio.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char** argv) {
  char aside[4096];
  snprintf(aside, sizeof aside, "%s.aside", argv[1]);
  for (time_t until = time(0) + 30; time(0) < until;) {
    if (rename(argv[1], aside) == 0) {
      symlink(argv[2], argv[1]);
      unlink(argv[1]);
      rename(aside, argv[1]);
    }
  }
  return argc;
}
"""


@pytest.fixture
def shared_tmp():
    """A directory another user can reach (pytest's tmp_path is 0700 to others)."""
    path = Path(tempfile.mkdtemp(prefix="mllm-kernel-race-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@needs_root
def test_a_root_being_swapped_by_another_user_is_never_loaded_from(
    real_entry, shared_tmp, home, monkeypatch
):
    # The fault run's race: another user loops renaming the private root away and
    # symlinking a directory of theirs (holding a planted entry) in its place.
    source, entry = real_entry
    parent = shared_tmp / "open"
    root = _root_in(parent)
    parent.chmod(0o777)
    shutil.copytree(entry, root / entry.name)
    theirs = shared_tmp / "theirs"
    theirs.mkdir()
    marker = shared_tmp / "constructor-ran"
    _plant(entry, theirs / entry.name, marker)
    for path in (theirs, *theirs.rglob("*")):
        os.chown(path, NOBODY, NOBODY)
    fallback = home / ".cache" / "mllm_kernel"
    fallback.mkdir(mode=0o700, parents=True)
    (home / ".cache").chmod(0o700)
    shutil.copytree(entry, fallback / entry.name)  # no build: 40 loads in a few seconds
    monkeypatch.setenv("MLLM_KERNEL_CACHE_DIR", str(root))
    (shared_tmp / "attacker.cpp").write_text(ATTACKER)
    cxx = str(toolchain.find_cxx().path)
    subprocess.run(
        [cxx, str(shared_tmp / "attacker.cpp"), "-o", str(shared_tmp / "attacker")], check=True
    )
    attacker = subprocess.Popen(
        [str(shared_tmp / "attacker"), str(root), str(theirs)], user=NOBODY, group=NOBODY
    )
    try:
        for _ in range(40):
            assert _load(source).f() == 3
    finally:
        attacker.kill()
        attacker.wait()
    assert not marker.exists(), "the planted library was loaded"
    assert module_key(_spec(source)).path.parent == fallback
