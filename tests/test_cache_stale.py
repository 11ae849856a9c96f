"""Never stale (issue 31, items 1, 2 and 5): a new process never runs a binary built from
other sources than the ones it would compile now, and never rebuilds one whose inputs
are the same files again.

* symlinks are recorded as the compiler was given them: pointing one elsewhere (a
  source, a header, an include directory, a directory on the way) rebuilds;
* headers that appear later: a ``"..."`` include found next to its includer, a
  ``__has_include`` probe;
* toolchain headers: an edit that puts the size and mtime back rebuilds; a touch or a
  reinstall of the same files does not, and is recorded so later loads skip the hash.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import child_env

from mllm_kernel.jit_utils import build_inputs, cache, include_search

# Each load runs in a new process, as a user's next run would.
PROBE = textwrap.dedent("""
    import json, sys
    settings = json.loads(sys.argv[2])
    if settings.pop("tvm_ffi_include", None):  # a copy of tvm-ffi's headers stands in
        from tvm_ffi import libinfo
        libinfo.find_include_path = lambda: sys.argv[3]
    from mllm_kernel.jit_utils import load_cpu_jit
    mod = load_cpu_jit("stale", cpp_files=[sys.argv[1]],
                       cpp_wrappers=[("value", "tiny::value")], **settings)
    print(mod.value())
""")
SOURCE = (
    '#include <cstdint>\n#include "bias.h"\n'
    "namespace tiny { inline int64_t value() { return BIAS; } }\n"
)


def _load(source: Path, tvm_ffi_include: Path | None = None, **settings) -> tuple[int, str]:
    """``(value, stderr)`` of a fresh process loading ``source``."""
    if tvm_ffi_include is not None:
        settings["tvm_ffi_include"] = True
    run = subprocess.run(
        [sys.executable, "-c", PROBE, str(source), json.dumps(settings), str(tvm_ffi_include)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    return int(run.stdout), run.stderr


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _bias(directory: Path, value: int, name: str = "bias.h") -> Path:
    return _write(directory / name, f"#pragma once\n#define BIAS {value}\n")


def _retarget(link: Path, target: Path) -> None:
    """Points ``link`` at ``target`` atomically, as a release switch does."""
    tmp = link.with_name(link.name + ".new")
    tmp.symlink_to(target)
    os.replace(tmp, link)


# --------------------------------------------------------------------------- symlinks
def _release_dir(tmp: Path) -> tuple[Path, dict]:
    """``current -> releases/v1`` holds k.cpp and bias.h; v2's k.cpp is the same."""
    for version, bias in (("v1", 1), ("v2", 2)):
        _write(tmp / "releases" / version / "k.cpp", SOURCE)
        _bias(tmp / "releases" / version, bias)
    (tmp / "current").symlink_to(tmp / "releases" / "v1")
    return tmp / "current" / "k.cpp", {}


def _linked_source(tmp: Path) -> tuple[Path, dict]:
    """``k.cpp -> a.cpp``; b.cpp returns another value."""
    _write(tmp / "a.cpp", SOURCE)
    _write(tmp / "b.cpp", SOURCE.replace("return BIAS;", "return BIAS + 1;"))
    _bias(tmp, 1)
    (tmp / "k.cpp").symlink_to(tmp / "a.cpp")
    return tmp / "k.cpp", {}


def _linked_header(tmp: Path) -> tuple[Path, dict]:
    """``bias.h -> b1.h``, next to k.cpp."""
    _bias(tmp, 1, "b1.h")
    _bias(tmp, 2, "b2.h")
    (tmp / "bias.h").symlink_to(tmp / "b1.h")
    return _write(tmp / "k.cpp", SOURCE), {}


def _linked_include_dir(tmp: Path) -> tuple[Path, dict]:
    """``-I inc`` with ``inc -> inc1``."""
    _bias(tmp / "inc1", 1)
    _bias(tmp / "inc2", 2)
    (tmp / "inc").symlink_to(tmp / "inc1")
    source = _write(tmp / "src" / "k.cpp", SOURCE)
    return source, {"extra_include_paths": [str(tmp / "inc")]}


def _linked_dir_on_the_way(tmp: Path) -> tuple[Path, dict]:
    """``#include "sub/bias.h"`` with ``sub -> s1``."""
    _bias(tmp / "s1", 1)
    _bias(tmp / "s2", 2)
    (tmp / "sub").symlink_to(tmp / "s1")
    return _write(tmp / "k.cpp", SOURCE.replace('"bias.h"', '"sub/bias.h"')), {}


SYMLINKS = {
    "source directory": (_release_dir, "current", "releases/v2", 2),
    "source file": (_linked_source, "k.cpp", "b.cpp", 2),
    "header": (_linked_header, "bias.h", "b2.h", 2),
    "include directory": (_linked_include_dir, "inc", "inc2", 2),
    "directory on the way": (_linked_dir_on_the_way, "sub", "s2", 2),
}


@pytest.mark.parametrize("case", SYMLINKS.values(), ids=SYMLINKS.keys())
def test_a_retargeted_symlink_rebuilds(tmp_path, fresh_cache, case):
    # Before: the manifest recorded resolved paths; the old files hashed the same.
    make, link, target, value = case
    source, settings = make(tmp_path)
    assert _load(source, **settings)[0] == 1
    assert _load(source, **settings)[1] == ""  # warm: nothing built, nothing logged
    _retarget(tmp_path / link, tmp_path / target)
    rebuilt, log = _load(source, **settings)
    assert rebuilt == value, log
    assert "rebuilding" in log or "compiling" in log


# --------------------------------------------------------------------------- new headers
def test_a_header_created_next_to_its_includer_rebuilds(tmp_path, fresh_cache):
    # Before: "inner.h" from I1/pkg/outer.h was found in I2; I1/pkg/inner.h was not seen.
    one, two = tmp_path / "I1", tmp_path / "I2"
    _write(one / "pkg" / "outer.h", '#pragma once\n#include "inner.h"\n')
    _bias(two, 5, "inner.h")
    source = _write(tmp_path / "k.cpp", SOURCE.replace('"bias.h"', "<pkg/outer.h>"))
    settings = {"extra_include_paths": [str(one), str(two)]}
    assert _load(source, **settings)[0] == 5
    assert _load(source, **settings)[1] == ""
    _bias(one / "pkg", 6, "inner.h")
    value, log = _load(source, **settings)
    assert value == 6
    assert f"{one / 'pkg' / 'inner.h'} now shadows the inner.h" in log


def test_a_header_probed_with_has_include_rebuilds_once_it_exists(tmp_path, fresh_cache):
    # Before: a name probed by __has_include but not found was recorded nowhere.
    inc = tmp_path / "inc"
    inc.mkdir()
    source = _write(
        tmp_path / "k.cpp",
        "#include <cstdint>\n#if __has_include(<optbias.h>)\n#include <optbias.h>\n#else\n"
        "#define BIAS 7\n#endif\nnamespace tiny { inline int64_t value() { return BIAS; } }\n",
    )
    settings = {"extra_include_paths": [str(inc)]}
    assert _load(source, **settings)[0] == 7
    assert _load(source, **settings)[1] == ""
    _bias(inc, 8, "optbias.h")
    value, log = _load(source, **settings)
    assert value == 8
    assert f"{inc / 'optbias.h'} now exists (the build found no optbias.h)" in log


def test_directives_are_read_from_every_branch():
    quoted, angled = include_search.directives(
        b'#include "a.h"\n  #  include <sys/b.h>\n#include_next <c.h>\n'
        b'#if __has_include("d.h") || __has_include_next( <e.h> )\n#endif\n'
        b'// #include "not-a-directive.h" (after a comment)\n#define X "f.h"\n#include X\n'
    )
    assert quoted == {"a.h", "d.h"}
    assert angled == {"sys/b.h", "c.h", "e.h"}


# --------------------------------------------------------------------------- toolchain
@pytest.fixture
def toolchain_copy(tmp_path):
    """A copy of tvm-ffi's include directory, standing in for the real one (a
    toolchain directory: fingerprinted, not hashed)."""
    from tvm_ffi import libinfo

    copy = tmp_path / "tvm_ffi_include"
    shutil.copytree(libinfo.find_include_path(), copy)
    return copy


def _reinstall(directory: Path) -> None:
    """The same files again, as ``pip --force-reinstall`` writes them: new inodes, new
    mtimes and ctimes, identical content."""
    fresh = directory.with_name(directory.name + ".fresh")
    shutil.copytree(directory, fresh, copy_function=shutil.copyfile)
    shutil.rmtree(directory)
    fresh.rename(directory)


def _entry(root: Path) -> Path:
    (entry,) = [p for p in root.iterdir() if p.name.startswith("stale_")]
    return entry


def test_identical_toolchain_reinstall_does_not_rebuild_and_is_recorded(
    tmp_path, fresh_cache, toolchain_copy
):
    # Before: size+mtime fingerprints; a touch or a reinstall of tvm-ffi rebuilt every kernel.
    _bias(tmp_path, 3)
    source = _write(tmp_path / "k.cpp", SOURCE)
    assert _load(source, toolchain_copy)[0] == 3
    recorded = cache.Manifest.read(_entry(fresh_cache)).toolchain_deps
    ours = [dep for dep in recorded if dep.startswith(str(toolchain_copy))]
    assert ours, "the build recorded none of the stand-in tvm-ffi headers"
    _reinstall(toolchain_copy)
    assert _load(source, toolchain_copy) == (3, "")  # no rebuild, nothing logged
    refreshed = cache.Manifest.read(_entry(fresh_cache)).toolchain_deps
    for dep in ours:  # the new stats are recorded: the next load hashes nothing
        stat = os.stat(dep)
        assert refreshed[dep].startswith(f"{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ctime_ns}:")
        assert refreshed[dep].rpartition(":")[2] == recorded[dep].rpartition(":")[2]


def test_toolchain_edit_that_restores_size_and_mtime_rebuilds(
    tmp_path, fresh_cache, toolchain_copy
):
    # Before: size and mtime alike meant unchanged; the stale binary was served.
    header = toolchain_copy / "tvm" / "ffi" / "function.h"
    header.write_text(header.read_text() + "\n#define TINY_TOOLCHAIN_BIAS 0\n")
    _write(tmp_path / "bias.h", "#pragma once\n#define BIAS (40 + TINY_TOOLCHAIN_BIAS)\n")
    source = _write(tmp_path / "k.cpp", SOURCE)
    assert _load(source, toolchain_copy)[0] == 40
    before = header.stat()
    text = header.read_text().replace("TINY_TOOLCHAIN_BIAS 0", "TINY_TOOLCHAIN_BIAS 2")
    header.write_text(text)
    os.utime(header, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert header.stat().st_size == before.st_size
    value, log = _load(source, toolchain_copy)
    assert value == 42
    assert f"{header} changed" in log


def test_old_style_toolchain_fingerprints_are_stale_not_trusted(tmp_path):
    # A manifest of an older build ("size:mtime") has no content hash to compare.
    header = _write(tmp_path / "tc" / "x.h", "#pragma once\n")
    stat = header.stat()
    old = build_inputs.BuildInputs(toolchain_deps={str(header): f"{stat.st_size}:1"})
    assert build_inputs.check(old).reason == f"{header} changed"


def test_scan_includes_follows_headers_outside_the_toolchain(tmp_path):
    # NVRTC reports no dependencies: the raw runtime reads the directives instead.
    toolchain_dir, inc, src = tmp_path / "toolkit", tmp_path / "inc", tmp_path / "src"
    _write(toolchain_dir / "tk.h", '#include "never_read.h"\n')
    _write(inc / "outer.h", '#include "inner.h"\n#include <tk.h>\n')
    _write(inc / "inner.h", "#if __has_include(<absent.h>)\n#endif\n")
    _write(src / "local.h", "")
    text = b'#include "local.h"\n#include <outer.h>\n'
    dirs = [str(inc), str(toolchain_dir)]
    found = build_inputs.scan_includes(text, dirs, [str(toolchain_dir)], str(src))
    assert sorted(found) == sorted(
        [
            str(src / "local.h"),
            str(inc / "outer.h"),
            str(inc / "inner.h"),
            str(toolchain_dir / "tk.h"),
        ]
    )
    unit = build_inputs.CompiledUnit(found, dirs, text)
    inputs = build_inputs.record([unit], [str(toolchain_dir)], started_ns=time.time_ns())
    assert set(inputs.toolchain_deps) == {str(toolchain_dir / "tk.h")}
    assert inputs.include_search[0]["names"]["absent.h"] == -1  # probed, recorded missing
    assert build_inputs.check(inputs) == build_inputs.Verdict()
    _write(inc / "absent.h", "")
    assert (
        build_inputs.check(inputs).reason
        == f"{inc / 'absent.h'} now exists (the build found no absent.h)"
    )


def test_files_written_while_compiling_are_recorded_changed_but_clock_skew_is_not(tmp_path):
    """record() after a build: a source or toolchain header whose mtime falls after the
    build started was written while the compilers ran (they may have read the old text),
    so the next check() finds it changed even though its content is what record() read;
    an mtime past the present is a skewed clock, recorded as usual (else every lookup
    would rebuild)."""
    toolchain_dir = tmp_path / "tc"
    edited = _write(tmp_path / "src" / "edited.h", "#pragma once\n")
    skewed = _write(tmp_path / "src" / "skewed.h", "#pragma once\n")
    header = _write(toolchain_dir / "tk.h", "#pragma once\n")
    old = time.time_ns() - 10**9
    for path in (edited, skewed, header):
        os.utime(path, ns=(old, old))
    unit = build_inputs.CompiledUnit([str(edited), str(skewed), str(header)], [], b"")
    started = time.time_ns()
    inputs = build_inputs.record([unit], [str(toolchain_dir)], started_ns=started)
    assert build_inputs.check(inputs) == build_inputs.Verdict()  # nothing written since

    future = time.time_ns() + 3600 * 10**9
    os.utime(skewed, ns=(future, future))
    time.sleep(0.02)  # past the kernel's coarse mtime clock
    started = time.time_ns()
    time.sleep(0.02)
    edited.write_text("#pragma once\n")  # saved again, same text, while compiling
    inputs = build_inputs.record([unit], [str(toolchain_dir)], started_ns=started)
    assert inputs.deps[str(edited)] == build_inputs.CHANGED_WHILE_COMPILING
    assert build_inputs.check(inputs).reason == f"{edited} changed"
    del inputs.deps[str(edited)]
    assert build_inputs.check(inputs) == build_inputs.Verdict()  # the skewed one is fine

    header.write_text("#pragma once\n")  # the toolchain's headers are checked first
    inputs = build_inputs.record([unit], [str(toolchain_dir)], started_ns=started)
    assert build_inputs.check(inputs).reason == f"{header} changed"
