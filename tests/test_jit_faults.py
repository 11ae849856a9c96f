"""Regression tests from the fault-injection and fuzz run (issue 19): bad environment
values, injected line breaks, unusable names, filesystem failures during a build,
wrong-shaped manifests and headers the cache key used to miss."""

from __future__ import annotations

import errno
import json
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import OK_SOURCE, child_env

from mllm_kernel.jit_utils import (
    KernelBuildError,
    cache,
    env,
    include_search,
    load_cpu_jit,
    toolchain,
)
from mllm_kernel.jit_utils.cache_key import module_key
from mllm_kernel.jit_utils.spec import BuildSpec, Wrapper


# --------------------------------------------------------------------------- env values
@pytest.mark.parametrize(
    ("value", "seconds"), [("inf", math.inf), ("1e30", 1e30), (" 2.5 ", 2.5), ("", 900.0)]
)
def test_lock_timeout_accepts_inf_and_huge_values(monkeypatch, value, seconds):
    monkeypatch.setenv("MLLM_KERNEL_LOCK_TIMEOUT", value)
    assert env.lock_timeout() == seconds


@pytest.mark.parametrize("value", ["inf", "1e30"])
def test_lock_with_an_unbounded_timeout_is_taken(monkeypatch, fresh_cache, value):
    # Before: threading.Lock.acquire(timeout=inf) raised OverflowError on every cold build.
    monkeypatch.setenv("MLLM_KERNEL_LOCK_TIMEOUT", value)
    spec = BuildSpec(name="ok", device="cpu", template_args=(), cpp_wrappers=(Wrapper("f", "f"),))
    with cache.module_lock(module_key(spec), purpose="test"):
        pass


@pytest.mark.parametrize("value", ["nan", "-1", "soon", "1e400x"])
def test_lock_timeout_garbage_names_the_variable(monkeypatch, value):
    monkeypatch.setenv("MLLM_KERNEL_LOCK_TIMEOUT", value)
    with pytest.raises(ValueError, match=r"^MLLM_KERNEL_LOCK_TIMEOUT must be a number of seconds"):
        env.lock_timeout()


# --------------------------------------------------------------------------- line breaks
LINE_BREAKS = ["\n", "\r", "\r\n", "\v", "\f", "\x85", "\u2028", "\u2029", "\x00", "\x1c"]


@pytest.mark.parametrize("brk", LINE_BREAKS, ids=repr)
def test_template_args_with_any_line_break_are_refused(ok_source, fresh_cache, brk):
    with pytest.raises(ValueError, match=r"template argument must be one non-empty line of C\+\+"):
        load_cpu_jit(
            "ok",
            f"3{brk}#error injected",
            cpp_files=[str(ok_source)],
            cpp_wrappers=[("f", "ok::f<3>")],
        )
    assert not fresh_cache.exists(), "nothing may be built or cached"


@pytest.mark.parametrize("brk", LINE_BREAKS, ids=repr)
def test_wrapper_expressions_with_any_line_break_are_refused(ok_source, fresh_cache, brk):
    with pytest.raises(ValueError, match=r"C\+\+ expression of wrapper 'f' must be one"):
        load_cpu_jit(
            "ok", cpp_files=[str(ok_source)], cpp_wrappers=[("f", f"ok::f<3>{brk}#error injected")]
        )
    assert not fresh_cache.exists()


# --------------------------------------------------------------------------- module names
@pytest.mark.parametrize(
    ("name", "error", "message"),
    [
        ("a" * 300, ValueError, r"has 300 characters; at most 100"),
        ("my-kernel", ValueError, r"must be a C identifier"),
        ("kernel_é", ValueError, r"must be a C identifier"),
        ("1st", ValueError, r"must be a C identifier"),
        (5, TypeError, r"module name must be a str, got int"),
    ],
)
def test_module_names_are_checked_before_anything_else(
    ok_source, fresh_cache, name, error, message
):
    with pytest.raises(error, match=message):
        load_cpu_jit(name, cpp_files=[str(ok_source)], cpp_wrappers=[("f", "ok::f<3>")])
    assert not fresh_cache.exists()


# --------------------------------------------------------------------------- filesystem
@pytest.fixture
def failing_linker(tmp_path, monkeypatch):
    """Makes the link step print ``message`` (a real tool's wording) and fail."""

    def install(message: str) -> None:
        real = toolchain.find_cxx().real_path
        script = tmp_path / "fail-link-c++"
        script.write_text(
            textwrap.dedent(f"""\
            #!/bin/sh
            for arg in "$@"; do
              if [ "$arg" = "-shared" ]; then
                printf '%s\\n' {message!r} >&2
                echo "collect2: error: ld returned 1 exit status" >&2
                exit 1
              fi
            done
            exec {real} "$@"
            """)
        )
        script.chmod(0o755)
        monkeypatch.setenv("CXX", str(script))
        toolchain.reset()

    yield install
    toolchain.reset()


@pytest.mark.parametrize(
    ("tool_line", "lead"),
    [
        (
            "/usr/bin/ld: final link failed: No space left on device",
            r"No space left on device \(ENOSPC\): \S+/\.staging/ok_cpu_3_",
        ),
        (
            "/usr/bin/ld: cannot open output file /cache/x/ok.so: Read-only file system",
            r"Read-only file system \(EROFS\): /cache/x/ok\.so$",
        ),
        (
            "/usr/bin/ld: cannot open output file /cache/x/ok.so: Permission denied",
            r"Permission denied \(EACCES\): /cache/x/ok\.so$",
        ),
    ],
)
def test_filesystem_errors_lead_the_build_error(
    ok_source, fresh_cache, failing_linker, tool_line, lead
):
    failing_linker(tool_line)
    with pytest.raises(KernelBuildError) as info:
        load_cpu_jit("ok", "3", cpp_files=[str(ok_source)], cpp_wrappers=[("f", "ok::f<3>")])
    first_line = str(info.value).splitlines()[0]
    assert "collect2" not in first_line
    assert re.match(lead, first_line), first_line
    assert info.value.first_error == first_line
    assert "MLLM_KERNEL_CACHE_DIR" in info.value.hint


def test_failed_build_with_an_unwritable_log_still_reports(
    ok_source, fresh_cache, failing_linker, monkeypatch
):
    failing_linker("/usr/bin/ld: final link failed: No space left on device")
    real_write_text = Path.write_text

    def full_disk(self, *args, **kwargs):
        if self.suffix == ".log":
            raise OSError(28, "No space left on device", str(self))
        return real_write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(KernelBuildError, match=r"^No space left on device \(ENOSPC\)") as info:
        load_cpu_jit("ok", "3", cpp_files=[str(ok_source)], cpp_wrappers=[("f", "ok::f<3>")])
    assert "full log: not written (No space left on device" in str(info.value)
    assert "collect2: error: ld returned 1 exit status" in str(info.value)  # the log's end


# --------------------------------------------------------------------------- manifests
def _load_ok(source: Path):
    return load_cpu_jit("ok", "3", cpp_files=[str(source)], cpp_wrappers=[("f", "ok::f<3>")])


def _only_entry(root: Path) -> Path:
    (entry,) = [p for p in root.iterdir() if p.name.startswith("ok_")]
    return entry


def _set_field(name, value):
    def damage(manifest: Path) -> None:
        data = json.loads(manifest.read_text())
        data[name] = value
        manifest.write_text(json.dumps(data))

    return damage


def _write(text):
    return lambda manifest: manifest.write_text(text)


def _artifact_in_another_entry(manifest: Path) -> None:
    """Points ``artifact`` at an identical copy outside the entry: loadable, but not ours."""
    data = json.loads(manifest.read_text())
    other = manifest.parent.parent / "other_entry"
    other.mkdir()
    shutil.copy(manifest.parent / data["artifact"], other / data["artifact"])
    data["artifact"] = f"../other_entry/{data['artifact']}"
    manifest.write_text(json.dumps(data))


MANIFEST_DAMAGE = {
    "list": _write("[]"),
    "null": _write("null"),
    "number": _write("3"),
    "deps-list": _set_field("deps", []),
    "deps-null": _set_field("deps", None),
    "deps-values-int": _set_field("deps", {"/x.h": 3}),
    "artifact-null": _set_field("artifact", None),
    "artifact-int": _set_field("artifact", 7),
    "artifact-outside": _artifact_in_another_entry,
    "artifact-absolute": _set_field("artifact", "/usr/lib/x.so"),
    "size-bool": _set_field("artifact_size", True),
    "exports-str": _set_field("exports", "f"),
    "extra-field": _set_field("surprise", 1),
    "deleted": lambda manifest: manifest.unlink(),
}


@pytest.fixture(scope="module")
def built_ok(tmp_path_factory):
    """``(source, cache root)`` of one build of ok<3>, copied by each test that damages it."""
    base = tmp_path_factory.mktemp("built_ok")
    source = base / "ok.cpp"
    source.write_text(OK_SOURCE)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLLM_KERNEL_CACHE_DIR", str(base / "cache"))
        assert _load_ok(source).f() == 3
    return source, base / "cache"


@pytest.mark.parametrize("damage", MANIFEST_DAMAGE.values(), ids=MANIFEST_DAMAGE.keys())
def test_wrong_shaped_manifest_is_rebuilt_with_a_warning(
    built_ok, fresh_cache, warnings_logged, damage
):
    ok_source, built_cache = built_ok
    shutil.copytree(built_cache, fresh_cache)
    manifest = _only_entry(fresh_cache) / "manifest.json"
    damage(manifest)
    assert cache.lookup(module_key(_spec_of_ok(ok_source))).status == "corrupt"
    assert _load_ok(ok_source).f() == 3  # before: AttributeError/TypeError, every time
    assert any("is corrupt" in w for w in warnings_logged), warnings_logged
    assert cache.lookup(module_key(_spec_of_ok(ok_source))).status == "hit"


def _spec_of_ok(source: Path) -> BuildSpec:
    from mllm_kernel.jit_utils.loader import cpu_spec

    return cpu_spec("ok", "3", cpp_files=[source], cpp_wrappers=[("f", "ok::f<3>")])


# --------------------------------------------------------------------------- headers
# Each load runs in a child process: a process cannot dlopen a rebuilt .so at the path
# of one it has loaded, and a user sees a stale binary in the next process anyway.
HEADER_PROBE = textwrap.dedent("""
    import json, sys
    from mllm_kernel.jit_utils import load_cpu_jit
    kwargs = json.loads(sys.argv[2])
    mod = load_cpu_jit("hdr", cpp_files=[sys.argv[1]], cpp_wrappers=[("value", "hdr::value")],
                       **kwargs)
    print(mod.value())
""")
HEADER_SOURCE = textwrap.dedent("""
    #include <myconst.h>
    #include <cstdint>
    namespace hdr { inline int64_t value() { return MYCONST; } }
""")


def _header_value(tmp_path, env_extra=None, **kwargs) -> tuple[str, str]:
    source = tmp_path / "hdr.cpp"
    if not source.exists():
        source.write_text(HEADER_SOURCE)
    run = subprocess.run(
        [sys.executable, "-c", HEADER_PROBE, str(source), json.dumps(kwargs)],
        env=child_env(**(env_extra or {})),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.strip(), run.stderr


def _header(directory: Path, value: int) -> None:
    directory.mkdir(exist_ok=True)
    (directory / "myconst.h").write_text(f"#pragma once\n#define MYCONST {value}\n")


def test_header_through_isystem_is_tracked(tmp_path, fresh_cache):
    # Before: -MMD left system headers out of the dependency list; the edit was ignored.
    inc = tmp_path / "sys"
    _header(inc, 1)
    flags = {"extra_cxx_flags": ["-isystem", str(inc)]}
    assert _header_value(tmp_path, **flags)[0] == "1"
    _header(inc, 2)
    value, log = _header_value(tmp_path, **flags)
    assert value == "2" and "myconst.h changed" in log


def test_new_header_shadowing_the_recorded_one_rebuilds(tmp_path, fresh_cache):
    # Before: a myconst.h created in an earlier include dir kept the cached 3120.
    early, late = tmp_path / "early", tmp_path / "late"
    early.mkdir()
    _header(late, 3120)
    paths = {"extra_include_paths": [str(early), str(late)]}
    assert _header_value(tmp_path, **paths)[0] == "3120"
    assert _header_value(tmp_path, **paths)[1] == ""  # warm: nothing logged, nothing built
    _header(early, 3140)
    value, log = _header_value(tmp_path, **paths)
    assert value == "3140" and f"{early}/myconst.h now shadows the myconst.h" in log
    (early / "myconst.h").unlink()
    assert _header_value(tmp_path, **paths)[0] == "3120"


def test_header_through_cpath_is_tracked_and_cpath_is_in_the_key(tmp_path, fresh_cache):
    one, two = tmp_path / "one", tmp_path / "two"
    _header(one, 11)
    _header(two, 22)
    assert _header_value(tmp_path, {"CPATH": str(one)})[0] == "11"
    _header(one, 12)
    assert _header_value(tmp_path, {"CPATH": str(one)})[0] == "12"
    assert _header_value(tmp_path, {"CPATH": str(two)})[0] == "22"
    assert _header_value(tmp_path, {"CPLUS_INCLUDE_PATH": str(two)})[0] == "22"
    entries = [p for p in fresh_cache.iterdir() if p.name.startswith("hdr_")]
    assert len(entries) == 3  # one key per include-path environment


def test_toolchain_headers_are_fingerprinted_not_hashed(ok_source, fresh_cache):
    _load_ok(ok_source)
    manifest = cache.Manifest.read(_only_entry(fresh_cache))
    builtin = include_search.builtin_dirs()
    assert builtin, "the compiler reported no built-in include directories"
    assert any(p.startswith(builtin) for p in manifest.toolchain_deps)  # libstdc++, libc
    assert not any(p.startswith(builtin) for p in manifest.deps)
    assert any(p.endswith("mllm_kernel/utils.hpp") for p in manifest.deps)


@pytest.mark.parametrize(
    ("code", "name"), [(errno.ENOSPC, "ENOSPC"), (errno.EROFS, "EROFS"), (errno.EACCES, "EACCES")]
)
def test_unwritable_cache_leads_the_build_error(ok_source, fresh_cache, monkeypatch, code, name):
    # Before: a bare OSError from mkdir/open deep in the cache code.
    real_mkdir = os.mkdir

    def failing_mkdir(path, *args, **kwargs):
        if os.path.basename(path) == ".locks":
            raise OSError(code, os.strerror(code), str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", failing_mkdir)
    with pytest.raises(KernelBuildError) as info:
        _load_ok(ok_source)
    lead = str(info.value).splitlines()[0]
    assert lead == f"{os.strerror(code)} ({name}): {fresh_cache / '.locks'}"
    assert "MLLM_KERNEL_CACHE_DIR" in str(info.value)
