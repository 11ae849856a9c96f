"""Never stuck (issue 31, items 8, 9 and 13): a nested, FIFO, device-file or oversized
manifest, a FIFO artifact and a dependency that never ends are rebuilt or refused within a
second by loads, clear-cache and show-config, never a hang or a crash; and a warm writable
cache still loads once its compiler is gone, as a prebuilt cache does."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mllm_kernel.jit_utils import (
    ToolchainError,
    cache,
    cache_admin,
    load_cpu_jit,
    prebuilt,
    registry,
    toolchain,
)
from mllm_kernel.jit_utils.cache_key import module_key, relocatable_key
from mllm_kernel.jit_utils.loader import cpu_spec
from mllm_kernel.jit_utils.status import CacheState

SOURCE = "namespace stuck { template <int K> int f() { return K; } }\n"
# What hangs is stopped here; what merely rebuilds gets the time a compile takes.
LOOKUP_SECONDS = 10
BUILD_SECONDS = 240


class Stuck(Exception):
    """Raised by the deadline's alarm: the call under test hung."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Interrupts a blocked open() or an endless read with Stuck after ``seconds``."""

    def stuck(signum, frame):
        raise Stuck(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, stuck)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(autouse=True)
def _forget_user_kernels():
    """Later show-config tests in this worker must not see this file's kernel."""
    yield
    registry.unregister("stuck", "cpu")
    toolchain.reset()


def _load(source: Path, k: int = 3, **kwargs):
    return load_cpu_jit(
        "stuck",
        str(k),
        cpp_files=[str(source)],
        cpp_wrappers=[("f", f"stuck::f<{k}>")],
        **kwargs,
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """``(source, cache root)``: stuck<3> built once for the file; tests damage copies."""
    base = tmp_path_factory.mktemp("stuck")
    source = base / "stuck.cpp"
    source.write_text(SOURCE)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLLM_KERNEL_CACHE_DIR", str(base / "cache"))
        assert _load(source).f() == 3
    registry.unregister("stuck", "cpu")
    return source, base / "cache"


@pytest.fixture
def warm(built, tmp_path, monkeypatch) -> tuple[Path, Path]:
    """``(source, entry directory)`` in a private copy of the built cache."""
    source, template = built
    root = tmp_path / "cache"
    shutil.copytree(template, root, symlinks=True)
    monkeypatch.setenv("MLLM_KERNEL_CACHE_DIR", str(root))
    (entry,) = [p for p in root.iterdir() if not p.name.startswith(".")]
    return source, entry


def _timed_lookup(source: Path) -> cache.Lookup:
    key = module_key(
        cpu_spec("stuck", "3", cpp_files=[source], cpp_wrappers=[("f", "stuck::f<3>")])
    )
    start = time.monotonic()
    with deadline(LOOKUP_SECONDS):
        found = cache.lookup(key)
    assert time.monotonic() - start < 1.0
    return found


def _rewrite_manifest(entry: Path, change) -> None:
    path = entry / cache.MANIFEST
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


# --------------------------------------------------------------------------- damages
# Each damages the entry and says what a lookup must find: (status, a word of its reason).
def _nested(entry: Path) -> tuple[str, str]:
    (entry / cache.MANIFEST).write_text("[" * 1200 + "]" * 1200)  # the 2.4 KB
    return "corrupt", "nested"


def _nested_field(entry: Path) -> tuple[str, str]:
    _rewrite_manifest(entry, lambda d: d.update(name=[]))
    path = entry / cache.MANIFEST
    path.write_text(path.read_text().replace('"name": []', '"name": ' + "[" * 5000 + "]" * 5000))
    return "corrupt", "nested"


def _fifo_manifest(entry: Path) -> tuple[str, str]:
    (entry / cache.MANIFEST).unlink()
    os.mkfifo(entry / cache.MANIFEST, 0o644)
    return "corrupt", "FIFO"


def _fifo_artifact(entry: Path) -> tuple[str, str]:
    artifact = entry / cache.Manifest.read(entry).artifact
    artifact.unlink()
    os.mkfifo(artifact, 0o644)
    return "corrupt", "FIFO"


def _fifo_dependency(entry: Path) -> tuple[str, str]:
    fifo = entry.parent.parent / "dependency.fifo"
    os.mkfifo(fifo, 0o644)
    _rewrite_manifest(entry, lambda d: d["deps"].update({str(fifo): "0" * 64}))
    return "stale", "FIFO"


def _dev_zero_dependency(entry: Path) -> tuple[str, str]:
    _rewrite_manifest(entry, lambda d: d["deps"].update({"/dev/zero": "0" * 64}))
    return "stale", "character device"


def _oversized_manifest(entry: Path) -> tuple[str, str]:
    # Sparse: costs no disk; past the size cap, so never read.
    with (entry / cache.MANIFEST).open("r+b") as handle:
        handle.truncate(64 << 20)
    return "corrupt", "larger than"


DAMAGES = [
    _nested,
    _nested_field,
    _fifo_manifest,
    _fifo_artifact,
    _fifo_dependency,
    _dev_zero_dependency,
    _oversized_manifest,
]


@pytest.mark.parametrize("damage", DAMAGES, ids=lambda f: f.__name__.strip("_"))
def test_a_damaged_entry_is_found_out_within_a_second(warm, damage):
    source, entry = warm
    status, word = damage(entry)
    found = _timed_lookup(source)
    assert found.status == status and word in found.reason, found


@pytest.mark.parametrize("damage", DAMAGES, ids=lambda f: f.__name__.strip("_"))
def test_a_damaged_entry_is_rebuilt(warm, damage, warnings_logged):
    source, entry = warm
    status, _ = damage(entry)
    with deadline(BUILD_SECONDS):
        assert _load(source).f() == 3
    if status == "corrupt":  # a changed input rebuilds quietly, as an edit does
        assert any("corrupt" in w and "rebuilding" in w for w in warnings_logged)
    assert _timed_lookup(source).status is CacheState.HIT


@pytest.mark.parametrize(
    "damage", [_nested, _fifo_manifest, _fifo_artifact], ids=lambda f: f.__name__.strip("_")
)
def test_clear_cache_and_show_config_get_past_a_damaged_entry(warm, damage):
    source, entry = warm
    damage(entry)
    # Registered, so that show-config looks its variant up (a module it merely finds in
    # the cache is only listed).
    registry.register_kernel("stuck", device="cpu", variants=[(3,)], builtin=False)(
        lambda k: _load(source, k)
    )
    with deadline(LOOKUP_SECONDS):
        listed = {m.path: m for m in cache_admin.cached_modules()}
        dry = cache_admin.clear_cache(dry_run=True)
    if damage is not _fifo_artifact:
        assert listed[entry].manifest is None and "no readable manifest" in listed[entry].error
    assert [r.path for r in dry.removed if r.kind == "module"] == [entry] and entry.is_dir()
    with deadline(BUILD_SECONDS):  # show-config plans every built-in kernel variant
        report = cache_admin.config_report()
    (kernel,) = [k for k in report.kernels if k.name == "stuck"]
    assert [(v.path, v.status) for v in kernel.variants] == [(entry, "corrupt")]
    with deadline(LOOKUP_SECONDS):
        assert cache_admin.clear_cache(kernel="stuck").count == 1
    assert not entry.exists()


def test_a_fifo_in_a_prebuilt_cache_is_skipped(tmp_path, monkeypatch, warnings_logged):
    source = tmp_path / "stuck.cpp"
    source.write_text(SOURCE)
    spec = cpu_spec("stuck", "3", cpp_files=[source], cpp_wrappers=[("f", "stuck::f<3>")])
    entry = relocatable_key(spec, tmp_path / "prebuilt").path
    entry.mkdir(parents=True)
    os.mkfifo(entry / cache.MANIFEST, 0o644)
    monkeypatch.setenv("MLLM_KERNEL_CACHE_PATH", str(tmp_path / "prebuilt"))
    with deadline(LOOKUP_SECONDS):
        assert prebuilt.find(spec) is None
    assert any("not used (corrupt" in w for w in warnings_logged)


def test_a_manifest_is_parsed_or_corrupt_never_a_recursion_error():
    with pytest.raises(cache.CorruptManifest, match="nested"):
        cache.Manifest.parse("[" * 1200 + "]" * 1200)


# --------------------------------------------------------------------------- no compiler
@pytest.fixture
def vanishing_compiler(tmp_path, monkeypatch) -> Path:
    """A C++ compiler that is its own file (no ``exec`` line to follow): removing it
    removes the compiler the cache key names."""
    compiler = tmp_path / "bin" / "c++"
    compiler.parent.mkdir()
    compiler.write_text(f'#!/bin/sh\n"{toolchain.find_cxx().real_path}" "$@"\n')
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    toolchain.reset()
    return compiler


@pytest.mark.parametrize("forget", [True, False], ids=["new-process", "same-process"])
@pytest.mark.parametrize("build_directory", [False, True], ids=["cache", "build-directory"])
def test_a_warm_cache_loads_after_its_compiler_is_removed(
    tmp_path, fresh_cache, vanishing_compiler, forget, build_directory
):
    source = tmp_path / "stuck.cpp"
    source.write_text(SOURCE)
    where = {"build_directory": tmp_path / "modules"} if build_directory else {}
    assert _load(source, **where).f() == 3
    vanishing_compiler.unlink()
    if forget:  # as a new process finds the toolchain again
        toolchain.reset()
    assert _load(source, **where).f() == 3  # before: ToolchainError / FileNotFoundError

    with pytest.raises(ToolchainError, match=r"stuck<4> \(cpu\): no valid cached build \(not "):
        _load(source, 4, **where)
    source.write_text(SOURCE.replace("return K;", "return K + 1;"))
    with pytest.raises(ToolchainError, match=r"\(stale: .*stuck.cpp changed\), and building"):
        _load(source, **where)


def test_show_config_calls_it_cached_as_the_loader_loads_it(
    tmp_path, fresh_cache, vanishing_compiler
):
    source = tmp_path / "stuck.cpp"
    source.write_text(SOURCE)
    registry.register_kernel("stuck", device="cpu", variants=[(3,)], builtin=False)(
        lambda k: _load(source, k)
    )
    assert _load(source).f() == 3
    vanishing_compiler.unlink()
    toolchain.reset()
    (kernel,) = [k for k in cache_admin.config_report(device="cpu").kernels if k.name == "stuck"]
    (variant,) = kernel.variants
    assert variant.status == "cached" and variant.path.parent == fresh_cache  # before: unknown


def test_a_build_without_its_compiler_names_the_compiler(tmp_path, vanishing_compiler):
    vanishing_compiler.unlink()
    tool = toolchain.Tool(vanishing_compiler, vanishing_compiler)
    with pytest.raises(ToolchainError, match=f"{vanishing_compiler}.*(CXX|reinstall)"):
        tool.identity  # noqa: B018
