"""The cache across processes: rebuild on header edits, warm loads that spawn no
compiler, one build for many processes, recovery from SIGKILL and corruption,
and build errors that say what to fix."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import child_env

from mllm_kernel.jit_utils import (
    CacheLockTimeout,
    KernelBuildError,
    ToolchainError,
    cache,
    cache_once,
    load_cpu_jit,
    make_cpp_args,
    toolchain,
)
from mllm_kernel.jit_utils.cache_key import module_key
from mllm_kernel.jit_utils.spec import BuildSpec, Wrapper

PROBE = textwrap.dedent("""
    import sys
    from mllm_kernel.jit_utils import load_cpu_jit, make_cpp_args
    args = make_cpp_args(int(sys.argv[2]))
    mod = load_cpu_jit("probe", *args, cpp_files=[sys.argv[1]],
                       cpp_wrappers=[("value", f"probe::value<{args}>")])
    print(mod.value(10))
""")


@pytest.fixture
def kernel(tmp_path) -> Path:
    """A kernel whose result depends on an included header: value(x) = x*K + H."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "helper.h").write_text("#pragma once\n#define HELPER_VALUE 1\n")
    (src / "probe.cpp").write_text(
        textwrap.dedent("""
        #include "helper.h"
        #include "mllm_kernel/utils.hpp"
        namespace probe {
        template <int K>
        int64_t value(int64_t x) { return x * K + HELPER_VALUE; }
        }  // namespace probe
    """)
    )
    return src / "probe.cpp"


@pytest.fixture
def spy(tmp_path) -> dict[str, str]:
    """Environment for a child process whose C++ compiler logs each call."""
    log = tmp_path / "spy.log"
    log.touch()
    real = toolchain.find_cxx().real_path
    compiler = tmp_path / "spy-c++"
    compiler.write_text(
        f'#!/bin/sh\necho "$@" >> "{log}"\n'
        f'if [ -n "$SPY_SLEEP" ]; then sleep "$SPY_SLEEP"; fi\n'
        f'if [ -z "$SPY_SLEEP_AFTER" ]; then exec {real} "$@"; fi\n'
        # The compiler has read every input; then a pause (SPY_SLEEP_AFTER seconds) before
        # the build goes on, announced in SPY_LOG.done.
        f'{real} "$@"; status=$?\n'
        f'echo "$@" >> "{log}.done"; sleep "$SPY_SLEEP_AFTER"; exit $status\n'
    )
    compiler.chmod(0o755)
    return child_env(
        CXX=str(compiler),
        SPY_LOG=str(log),
        MLLM_KERNEL_CACHE_DIR=str(tmp_path / "cache"),
    )


def _spy_calls(env: dict[str, str]) -> list[str]:
    """Every compiler invocation (a cold build also asks for ``--version`` and, once per
    process, for its built-in include directories)."""
    return Path(env["SPY_LOG"]).read_text().splitlines()


def _builds(env: dict[str, str]) -> list[str]:
    """Compile and link invocations only."""
    queries = ("--version", "-x c++ -E -v - -o /dev/null")
    return [c for c in _spy_calls(env) if c.strip() not in queries]


def _probe(env, kernel, k=3, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", PROBE, str(kernel), str(k)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        **kwargs,
    )


def _start_probe(env, kernel, k, **popen) -> subprocess.Popen:
    """The probe as a running child (its output piped), for a test that acts meanwhile."""
    return subprocess.Popen(
        [sys.executable, "-c", PROBE, str(kernel), str(k)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **popen,
    )


def _module_dirs(env) -> list[Path]:
    root = Path(env["MLLM_KERNEL_CACHE_DIR"])
    return [p for p in root.iterdir() if not p.name.startswith(".")]


def test_warm_load_spawns_no_compiler_and_header_edit_rebuilds(kernel, spy):
    first = _probe(spy, kernel)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "31"
    assert "built probe<3> (cpu) in" in first.stderr  # one INFO line with the duration
    assert len(_builds(spy)) == 2  # one compile, one link
    cold_calls = len(_spy_calls(spy))

    warm = _probe(spy, kernel)
    assert warm.stdout.strip() == "31"
    assert len(_spy_calls(spy)) == cold_calls, "a warm load must not run the compiler"
    assert "compiling" not in warm.stderr

    (kernel.parent / "helper.h").write_text("#pragma once\n#define HELPER_VALUE 5\n")
    edited = _probe(spy, kernel)
    assert edited.stdout.strip() == "35"
    assert "helper.h changed" in edited.stderr
    assert len(_builds(spy)) == 4
    assert len(_module_dirs(spy)) == 1  # rebuilt in place, not beside

    calls = len(_spy_calls(spy))
    again = _probe(spy, kernel)
    assert again.stdout.strip() == "35" and len(_spy_calls(spy)) == calls


def test_sources_and_cache_under_paths_with_hash_dollar_and_space(kernel, spy, tmp_path):
    """The compilers' depfiles escape '#', '$' and ' ' in paths (parse_depfile): such a
    source directory and cache root build, load warm, and see a header edit."""
    odd = tmp_path / "src #1 $x y"
    kernel.parent.rename(odd)
    env = {**spy, "MLLM_KERNEL_CACHE_DIR": str(tmp_path / "cache #2 $z")}
    source = odd / kernel.name
    first = _probe(env, source)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "31"
    builds = len(_builds(env))
    assert _probe(env, source).stdout.strip() == "31" and len(_builds(env)) == builds
    (odd / "helper.h").write_text("#pragma once\n#define HELPER_VALUE 5\n")
    edited = _probe(env, source)
    assert edited.stdout.strip() == "35" and "helper.h changed" in edited.stderr


def test_template_args_and_flags_get_their_own_directories(kernel, spy):
    assert _probe(spy, kernel, k=2).stdout.strip() == "21"
    assert _probe(spy, kernel, k=4).stdout.strip() == "41"
    names = sorted(p.name for p in _module_dirs(spy))
    assert (
        len(names) == 2
        and names[0].startswith("probe_cpu_2_")
        and names[1].startswith("probe_cpu_4_")
    )


def test_four_processes_build_a_cold_module_once(kernel, spy):
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PROBE, str(kernel), "7"],
            env=spy,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outputs]
    assert [out.strip() for out, _ in outputs] == ["71"] * 4
    compiles = [c for c in _builds(spy) if " -c " in f" {c} "]
    assert len(compiles) == 1, compiles
    assert sum("compiling" in err for _, err in outputs) == 1
    assert len(_module_dirs(spy)) == 1


def test_sigkill_mid_build_leaves_nothing_loadable(kernel, spy):
    proc = _start_probe({**spy, "SPY_SLEEP": "60"}, kernel, 9, start_new_session=True)
    deadline = time.monotonic() + 60
    while not _builds(spy) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _builds(spy), "the build never started"
    os.killpg(proc.pid, signal.SIGKILL)  # the python process and its compiler
    proc.wait()
    assert _module_dirs(spy) == []  # only staging leftovers, never a module dir

    rerun = _probe(spy, kernel, k=9)
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stdout.strip() == "91"
    assert "removing an interrupted build" in rerun.stderr
    staging = Path(spy["MLLM_KERNEL_CACHE_DIR"]) / ".staging"
    assert list(staging.iterdir()) == []


def test_a_header_edited_while_compiling_is_built_again_on_the_next_load(kernel, spy):
    """The compiler reads helper.h, then the user saves an edit before the build ends:
    the module holds the old header, so the next load must not take it as current."""
    proc = _start_probe({**spy, "SPY_SLEEP_AFTER": "1"}, kernel, 3, text=True)
    done = Path(spy["SPY_LOG"] + ".done")
    deadline = time.monotonic() + 120
    while not (done.is_file() and " -c " in done.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    (kernel.parent / "helper.h").write_text("#pragma once\n#define HELPER_VALUE 5\n")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.strip() == "31"  # built from the header as the compiler read it

    again = _probe(spy, kernel)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "35" and "helper.h changed" in again.stderr
    calls = len(_spy_calls(spy))
    assert _probe(spy, kernel).stdout.strip() == "35" and len(_spy_calls(spy)) == calls


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_corrupt_artifact_is_rebuilt_with_a_warning(kernel, spy, damage):
    assert _probe(spy, kernel).returncode == 0
    (module_dir,) = _module_dirs(spy)
    artifact = module_dir / cache.Manifest.read(module_dir).artifact
    data = artifact.read_bytes()
    if damage == "truncate":
        artifact.write_bytes(data[: len(data) // 2])
    else:
        middle = len(data) // 2
        artifact.write_bytes(
            data[:middle]
            + bytes(b ^ 0xFF for b in data[middle : middle + 64])
            + data[middle + 64 :]
        )
    rerun = _probe(spy, kernel)
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stdout.strip() == "31"
    assert "WARNING" in rerun.stderr and "corrupt" in rerun.stderr
    assert len(_builds(spy)) == 4


def test_garbage_manifest_is_rebuilt(kernel, spy):
    assert _probe(spy, kernel).returncode == 0
    (module_dir,) = _module_dirs(spy)
    (module_dir / "manifest.json").write_text("{not json")
    rerun = _probe(spy, kernel)
    assert rerun.stdout.strip() == "31" and "corrupt" in rerun.stderr


# --------------------------------------------------------------------------- errors
def _load(source: Path, *args, **kwargs):
    cpp_args = make_cpp_args(*args)
    return load_cpu_jit(
        "broken",
        *cpp_args,
        cpp_files=[str(source)],
        cpp_wrappers=[("f", f"broken::f<{cpp_args}>")],
        **kwargs,
    )


def test_syntax_error_leads_with_file_and_line(tmp_path, fresh_cache):
    source = tmp_path / "broken.cpp"
    source.write_text("namespace broken {\ntemplate <int K>\nint f() { return K +; }\n}\n")
    with pytest.raises(KernelBuildError) as info:
        _load(source, 3)
    error = info.value
    message = str(error)
    assert message.startswith(f"{source}:3: "), message
    assert "module 'broken'" in message and "<3>" in message
    assert error.first_error.startswith(f"{source}:3:")
    assert Path(error.log_path).is_file() and "-c" in Path(error.log_path).read_text()
    assert "full log: " + error.log_path in message
    assert isinstance(error, RuntimeError)
    modules = [p for p in fresh_cache.iterdir() if not p.name.startswith(".")]
    assert modules == []
    assert list((fresh_cache / ".staging").iterdir()) == []


def test_missing_header_has_a_hint(tmp_path, fresh_cache):
    source = tmp_path / "broken.cpp"
    source.write_text('#include "not_there.h"\nnamespace broken { template <int K> int f(); }\n')
    with pytest.raises(KernelBuildError, match=r"not_there\.h") as info:
        _load(source, 1)
    assert "extra_include_paths" in str(info.value)


def test_extra_include_paths_are_used(tmp_path, fresh_cache):
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "there.h").write_text("#define THERE 42\n")
    source = tmp_path / "ok.cpp"
    source.write_text(
        '#include "there.h"\n#include <cstdint>\n'
        "namespace broken { template <int K> int64_t f() { return THERE + K; } }\n"
    )
    assert _load(source, 1, extra_include_paths=[inc]).f() == 43


def test_missing_source_lists_where_it_looked(tmp_path, monkeypatch, fresh_cache):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as info:
        load_cpu_jit("nothing", cpp_files=["no_such_kernel.cpp"], cpp_wrappers=[("f", "f")])
    message = str(info.value)
    assert "no_such_kernel.cpp" in message
    assert str(tmp_path / "no_such_kernel.cpp") in message
    assert "csrc" in message or "sources" in message


def test_relative_source_in_the_current_directory(tmp_path, monkeypatch, fresh_cache):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_kernel.cpp").write_text(
        textwrap.dedent("""
        #include <cstdint>
        namespace my_namespace {
        template <int A, int B>
        int64_t my_kernel(int64_t x) { return x * A + B; }
        }  // namespace my_namespace
    """)
    )

    @cache_once
    def _jit_my_kernel_module(a: int, b: int):
        args = make_cpp_args(a, b)
        return load_cpu_jit(
            "my_kernel",
            *args,
            cpp_files=["my_kernel.cpp"],
            cpp_wrappers=[("my_kernel", f"my_namespace::my_kernel<{args}>")],
        )

    assert _jit_my_kernel_module(2, 5).my_kernel(10) == 25
    assert _jit_my_kernel_module(2, 5) is _jit_my_kernel_module(2, 5)


def test_missing_compiler_fails_before_any_build(tmp_path, monkeypatch, fresh_cache):
    source = tmp_path / "ok.cpp"
    source.write_text("namespace broken { template <int K> int f() { return K; } }\n")
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    toolchain.reset()
    try:
        with pytest.raises(ToolchainError, match="No C\\+\\+ compiler found"):
            _load(source, 1)
    finally:
        toolchain.reset()
    assert not fresh_cache.exists() or not (fresh_cache / ".staging").exists()


def test_lock_timeout_names_the_holder(tmp_path, fresh_cache, monkeypatch):
    source = tmp_path / "ok.cpp"
    source.write_text("namespace broken { template <int K> int f() { return K; } }\n")
    spec = BuildSpec(
        name="broken",
        device="cpu",
        template_args=("1",),
        cpp_wrappers=(Wrapper("f", "broken::f<1>"),),
    )
    key = module_key(spec)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import time
            from pathlib import Path
            from mllm_kernel.jit_utils import cache
            from mllm_kernel.jit_utils.cache_key import ModuleKey
            root = Path({str(key.root)!r})
            key = ModuleKey(hash={key.hash!r}, dirname={key.dirname!r}, root=root)
            with cache.module_lock(key, purpose="holding it for the test"):
                print("held", flush=True)
                time.sleep(60)
        """),
        ],
        env=child_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setenv("MLLM_KERNEL_LOCK_TIMEOUT", "1")
        from mllm_kernel.jit_utils import loader

        with pytest.raises(CacheLockTimeout) as info:
            loader.build_and_load(spec, key)
        assert f"pid {holder.pid}" in str(info.value)
        assert "holding it for the test" in str(info.value)
    finally:
        holder.kill()
        holder.wait()


def test_verbose_logs_compiler_commands(kernel, spy):
    result = _probe({**spy, "MLLM_KERNEL_VERBOSE": "1"}, kernel, k=5)
    assert result.stdout.strip() == "51"
    assert "$ " in result.stderr and " -c " in result.stderr and "-shared" in result.stderr


def test_native_builds_on_aarch64_are_keyed_by_its_features_and_core(monkeypatch, tmp_path):
    """The host-ISA part of the key on an AArch64 host (/proc/cpuinfo says "Features"):
    another core or another feature set is another key; a non-native build has none."""
    import dataclasses
    import platform

    from mllm_kernel.jit_utils import cache_key, toolchain
    from mllm_kernel.jit_utils.spec import BuildSpec, Wrapper

    source = tmp_path / "k.cpp"
    source.write_text("inline int k() { return 1; }\n")
    native = BuildSpec(
        "k", "cpu", (), cpp_files=(source,), cpp_wrappers=(Wrapper("k", "k"),),
        cxx_flags=("-O3", "-march=native"),
    )  # fmt: skip
    cpuinfo = tmp_path / "cpuinfo"
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(toolchain, "_CPUINFO", cpuinfo)

    def keys(text: str) -> tuple[str, str]:
        cpuinfo.write_text(text)
        return cache_key.toolchain_free_hash(native), str(
            cache_key.relocatable_key(native, tmp_path).hash
        )

    base = (
        "processor\t: 0\nFeatures\t: fp asimd fphp asimdhp\n"
        "CPU implementer\t: 0x41\nCPU variant\t: 0x1\nCPU part\t: 0xd42\n"
    )
    first = keys(base)
    assert toolchain.host_isa() == "aarch64:asimd asimdhp core=0x41/0x1/0xd42 fp fphp"
    assert keys(base) == first
    assert keys(base.replace("asimdhp", "asimdhp sve")) != first
    assert keys(base.replace("0xd42", "0xd4f")) != first
    plain = dataclasses.replace(native, cxx_flags=("-O3",))
    assert "host_isa" not in cache_key.toolchain_free_material(plain)
    assert cache_key.relocatable_key_material(native)["machine"] == "aarch64"


def test_a_load_after_a_rebuild_in_one_process_returns_the_rebuilt_module(kernel, fresh_cache):
    """One process (a notebook): load, edit a header, load (rebuilt), load again (a cache
    hit). The last must be the rebuilt module: the loader hands back a library already
    loaded from the same path, so an artifact under its predecessor's name came back as
    the predecessor (31 after 32)."""

    def value() -> int:
        module = load_cpu_jit(
            "probe", *make_cpp_args(3), cpp_files=[str(kernel)],
            cpp_wrappers=[("value", f"probe::value<{make_cpp_args(3)}>")],
        )  # fmt: skip
        return module.value(10)

    assert value() == 31
    assert value() == 31  # a cache hit, loaded from the cache's path
    (kernel.parent / "helper.h").write_text("#pragma once\n#define HELPER_VALUE 2\n")
    assert value() == 32  # rebuilt
    assert value() == 32  # a cache hit again: the rebuilt library, not the first


LOAD = textwrap.dedent("""
    import json, sys
    from mllm_kernel.jit_utils import KernelBuildError, load_cpu_jit
    name, source, ldflags = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    try:
        mod = load_cpu_jit(name, cpp_files=[source], extra_ldflags=ldflags,
                           cpp_wrappers=[("value", f"{name}::value")])
        print(mod.value(10))
    except KernelBuildError as error:
        print("refused:", error)
""")


def _load_in_a_child(tmp_path: Path, name: str, source: Path, ldflags=()) -> str:
    """``name::value(10)`` of ``source``'s module loaded in a child process (a crash
    there fails the test, not the run), or ``refused: <KernelBuildError>``."""
    run = subprocess.run(
        [sys.executable, "-c", LOAD, name, str(source), json.dumps(list(ldflags))],
        env=child_env(MLLM_KERNEL_CACHE_DIR=str(tmp_path / "cache")),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def _scale_library(directory: Path, factor: int, kind: str) -> None:
    """``long long scale(long long x) { return x * factor; }`` as directory's libscale.a
    (``kind`` "a") or libscale.so ("so")."""
    directory.mkdir(exist_ok=True)
    (directory / "scale.c").write_text(f"long long scale(long long x) {{ return x * {factor}; }}\n")
    cc = str(toolchain.find_cxx().path)
    c_file = str(directory / "scale.c")
    if kind == "so":
        out = str(directory / "libscale.so")
        subprocess.run([cc, "-x", "c", "-shared", "-fPIC", c_file, "-o", out], check=True)
        return
    obj = str(directory / "scale.o")
    subprocess.run([cc, "-x", "c", "-fPIC", "-c", c_file, "-o", obj], check=True)
    (directory / "libscale.a").unlink(missing_ok=True)
    subprocess.run(["ar", "rcs", str(directory / "libscale.a"), obj], check=True)


LINKED_SOURCE = (
    "#include <cstdint>\n"
    'extern "C" int64_t scale(int64_t x);\n'
    "namespace linked { int64_t value(int64_t x) { return scale(x) + 1; } }\n"
)


def test_a_declared_but_undefined_function_fails_the_build_not_its_first_call(tmp_path):
    """A function declared but defined nowhere (its source left out of cpp_files) links
    into a shared library; loaded lazily it ended the process at its first call, every
    run again from the cache (exit 127, 'symbol lookup error'). It is refused when the
    module is built, and the broken library is never cached."""
    source = tmp_path / "half_built.cpp"
    source.write_text(
        "#include <cstdint>\n"
        "namespace half_built {\n"
        "int64_t helper(int64_t x);  // defined in a file left out\n"
        "int64_t value(int64_t x) { return helper(x) + 1; }\n"
        "}\n"
    )
    for _ in range(2):  # and again: nothing was cached
        out = _load_in_a_child(tmp_path, "half_built", source)
        assert out.startswith("refused:"), out
        assert "undefined symbol" in out and "declared but not defined" in out


@pytest.mark.parametrize("form", ["path", "-l"])
def test_a_static_library_linked_in_is_tracked(tmp_path, form):
    """A static archive given to the linker (by path, or by -l and -L) is built into the
    module: rebuilding the archive rebuilds the module, where the cached one kept the
    old code (11 after the archive became 1001)."""
    lib = tmp_path / "lib"
    source = tmp_path / "linked.cpp"
    source.write_text(LINKED_SOURCE)
    flags = [str(lib / "libscale.a")] if form == "path" else [f"-L{lib}", "-lscale"]
    _scale_library(lib, 1, "a")
    assert _load_in_a_child(tmp_path, "linked", source, flags) == "11"
    _scale_library(lib, 100, "a")
    assert _load_in_a_child(tmp_path, "linked", source, flags) == "1001"


def test_a_library_not_found_at_load_names_the_fix(tmp_path):
    """A shared library linked by -L and -l but not found when the module loads (no
    rpath): a KernelBuildError that says how to make it found, not a bare error naming
    a staging path that is gone."""
    lib = tmp_path / "lib"
    source = tmp_path / "linked.cpp"
    source.write_text(LINKED_SOURCE)
    _scale_library(lib, 3, "so")
    out = _load_in_a_child(tmp_path, "linked", source, [f"-L{lib}", "-lscale"])
    assert out.startswith("refused:"), out
    assert "libscale.so" in out and "-Wl,-rpath" in out


def test_the_compilers_flag_variables_are_in_the_key(monkeypatch, tmp_path):
    """NVCC_APPEND_FLAGS and the like change the binary: each value has its own key;
    with none set the key is what it was (no rebuild of every entry)."""
    from mllm_kernel.jit_utils import cache_key, env

    spec = BuildSpec(
        name="k", device="cpu", template_args=(), cpp_files=(tmp_path / "k.cpp",),
        cpp_wrappers=(Wrapper("f", "k::f"),),
    )  # fmt: skip
    for name in env.COMPILER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    plain = cache_key.toolchain_free_material(spec)
    assert "compiler_variables" not in plain
    keys = {cache_key.toolchain_free_hash(spec)}
    for name in env.COMPILER_VARIABLES:
        monkeypatch.setenv(name, "-DX=1")
        keys.add(cache_key.toolchain_free_hash(spec))
        monkeypatch.delenv(name)
    assert len(keys) == 1 + len(env.COMPILER_VARIABLES)
