"""The compiler's identity in the cache key (issue 31, item 3): the compiler as the user
names it, each wrapper script's bytes, the real compiler, and the compiler a ccache
launcher runs; computed without running anything."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import child_env, write_script

from mllm_kernel.jit_utils import ToolchainError, toolchain

GXX = shutil.which("g++")

# A kernel whose result is a flag only a wrapper script passes.
BIAS_SOURCE = textwrap.dedent("""
    #include <cstdint>
    #ifndef TINY_BIAS
    #define TINY_BIAS 0
    #endif
    namespace tiny { inline int64_t value() { return TINY_BIAS; } }
""")
BIAS_PROBE = textwrap.dedent("""
    import sys
    from mllm_kernel.jit_utils import load_cpu_jit
    mod = load_cpu_jit("tinybias", cpp_files=[sys.argv[1]], cpp_wrappers=[("value", "tiny::value")])
    print(mod.value())
""")
# ccache's masquerade, as a script: run the next executable of the called name on PATH
# after its own directory. No line starts with `exec`: it is the end of the chain.
FAKE_CCACHE = textwrap.dedent("""\
    #!/bin/sh
    name=$(basename "$0"); self=$(dirname "$0"); IFS=:
    for dir in $PATH; do
        [ "$dir" != "$self" ] && [ -x "$dir/$name" ] && exec "$dir/$name" "$@"
    done
    exit 127
""")


def _binary(path: Path, content: bytes) -> Path:
    """A stand-in for a compiler binary (not a script: keyed by path, size, mtime)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x7fELF" + content)
    path.chmod(0o755)
    return path


def _keyed_as_binary(path: Path) -> str:
    stat = path.stat()
    return f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"


def _bias(source: Path, cxx: Path | str) -> tuple[str, str]:
    """TINY_BIAS as a fresh process built or loaded it with CXX=cxx, and its log."""
    run = subprocess.run(
        [sys.executable, "-c", BIAS_PROBE, str(source)],
        env=child_env(CXX=str(cxx)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.strip(), run.stderr


# --------------------------------------------------------------------------- wrappers
@pytest.mark.skipif(GXX is None, reason="needs g++")
def test_a_wrapper_script_and_its_flags_are_in_the_key(tmp_path, fresh_cache):
    # Before: the key named only the g++ behind the wrapper; the plain build was served.
    source = tmp_path / "tiny.cpp"
    source.write_text(BIAS_SOURCE)
    assert _bias(source, GXX)[0] == "0"
    wrapper = write_script(tmp_path / "wrap", f'#!/bin/sh\nexec {GXX} -DTINY_BIAS=2 "$@"\n')
    value, log = _bias(source, wrapper)
    assert value == "2" and "compiling tinybias" in log
    write_script(wrapper, f'#!/bin/sh\nexec {GXX} -DTINY_BIAS=3 "$@"\n')  # same size
    value, log = _bias(source, wrapper)
    assert value == "3" and "compiling tinybias" in log
    assert _bias(source, wrapper) == ("3", "")  # unchanged: warm, nothing logged or built


def test_identity_names_the_called_path_each_script_and_the_real_file(tmp_path, reset_toolchain):
    real = _binary(tmp_path / "compilers" / "g++-99", b"v1")
    (tmp_path / "compilers" / "g++").symlink_to("g++-99")
    wrapper = write_script(
        tmp_path / "wrap", f'#!/bin/sh\nexec {tmp_path}/compilers/g++ -O1 "$@"\n'
    )
    tool = toolchain.Tool(wrapper, toolchain.follow_wrapper(wrapper))
    assert tool.real_path == real
    before = tool.identity
    assert before.startswith(f"{wrapper} -> {wrapper}#sha256:")
    assert before.endswith(f" -> {_keyed_as_binary(real)}")
    write_script(wrapper, f'#!/bin/sh\nexec {tmp_path}/compilers/g++ -O2 "$@"\n')
    assert tool.identity != before  # same size, same process: its bytes are keyed
    os.utime(real, ns=(1, 1))
    assert _keyed_as_binary(real) in tool.identity  # the real compiler "upgraded"


def test_the_same_binary_called_by_another_name_is_another_compiler(tmp_path):
    # clang and clang++ are one file that acts by its name.
    real = _binary(tmp_path / "clang-99", b"clang")
    (tmp_path / "clang").symlink_to(real)
    (tmp_path / "clang++").symlink_to(real)
    c, cxx = (toolchain.Tool(tmp_path / n, real) for n in ("clang", "clang++"))
    assert c.identity != cxx.identity
    assert c.identity.endswith(_keyed_as_binary(real))


def test_a_file_of_the_chain_gone_is_a_toolchain_error(tmp_path, reset_toolchain):
    real = _binary(tmp_path / "compilers" / "g++", b"v1")
    wrapper = write_script(tmp_path / "wrap", f'#!/bin/sh\nexec {real} "$@"\n')
    tool = toolchain.Tool(wrapper, real)
    assert tool.identity
    real.unlink()
    gone = re.escape(f"{wrapper} (the file {real}) can no longer be read")
    with pytest.raises(ToolchainError, match=f"^{gone}"):
        tool.identity  # noqa: B018


def test_a_wrapped_nvcc_is_keyed_by_its_script(tmp_path, monkeypatch, reset_toolchain):
    home = tmp_path / "cuda"
    real = _binary(tmp_path / "real-cuda" / "bin" / "nvcc", b"nvcc")
    write_script(home / "bin" / "nvcc", f'#!/bin/sh\nexec {real} -Xptxas=-v "$@"\n')
    (home / "lib64").mkdir()
    (home / "lib64" / "libcudart.so").write_bytes(b"")
    monkeypatch.setenv("CUDA_HOME", str(home))
    cuda = toolchain.find_cuda()
    before = cuda.identity
    assert f"{home}/bin/nvcc#sha256:" in before and _keyed_as_binary(real) in before
    write_script(home / "bin" / "nvcc", f'#!/bin/sh\nexec {real} -Xptxas=-O1 "$@"\n')
    assert cuda.identity != before


# --------------------------------------------------------------------------- launchers
@pytest.fixture
def fake_ccache(tmp_path, monkeypatch, reset_toolchain) -> dict[str, Path]:
    """A ccache masquerade directory (``g++ -> ccache``) first on PATH, then a stand-in
    g++ binary: ``launcher``, ``masquerade`` (the g++ link) and ``gxx`` (the compiler)."""
    launcher = write_script(tmp_path / "fake" / "ccache", FAKE_CCACHE)
    masquerade = tmp_path / "ccache-bin" / "g++"
    masquerade.parent.mkdir()
    masquerade.symlink_to(launcher)
    gxx = _binary(tmp_path / "compilers" / "g++", b"gcc 99.1")
    monkeypatch.setenv("PATH", f"{masquerade.parent}:{gxx.parent}:{launcher.parent}:/usr/bin:/bin")
    return {"launcher": launcher, "masquerade": masquerade, "gxx": gxx}


def test_a_ccache_masquerade_is_keyed_by_the_compiler_it_runs(fake_ccache, monkeypatch):
    # Before: the identity was ccache's alone: upgrading g++ kept the key.
    monkeypatch.setenv("CXX", "g++")
    cxx = toolchain.find_cxx()
    assert cxx.path == fake_ccache["masquerade"] and cxx.real_path == fake_ccache["launcher"]
    before = cxx.identity
    assert f"{fake_ccache['launcher']}#sha256:" in before
    assert before.endswith(
        f" runs [{fake_ccache['gxx']} -> {_keyed_as_binary(fake_ccache['gxx'])}]"
    )
    _binary(fake_ccache["gxx"], b"gcc 99.2")  # the upgrade
    assert cxx.identity != before


def test_a_wrapper_running_ccache_with_the_compiler_is_keyed_by_it(fake_ccache, tmp_path):
    wrapper = write_script(tmp_path / "wrap", '#!/bin/sh\nexec ccache g++ -O2 "$@"\n')
    tool = toolchain.Tool(wrapper, toolchain.follow_wrapper(wrapper))
    assert tool.real_path == fake_ccache["launcher"]
    # ccache skips its own masquerade link on PATH, as the real one does.
    gxx = fake_ccache["gxx"]
    assert tool.identity.endswith(f" runs [{gxx} -> {_keyed_as_binary(gxx)}]")


@pytest.mark.skipif(GXX is None, reason="needs g++")
def test_the_fake_ccache_really_runs_the_compiler_it_is_keyed_by(fake_ccache):
    # The identity above is where the masquerade leads: the script runs that g++.
    write_script(fake_ccache["gxx"], f'#!/bin/sh\nexec {GXX} "$@"\n')
    run = subprocess.run(
        [str(fake_ccache["masquerade"]), "--version"], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0 and "g++" in run.stdout
    masquerade = fake_ccache["masquerade"]
    identity = toolchain.Tool(masquerade, toolchain.follow_wrapper(masquerade)).identity
    assert _keyed_as_binary(Path(GXX)) in identity


# --------------------------------------------------------------------------- warm loads
def _no_processes(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError(f"a process was spawned: {args!r}")

    for module, name in [
        (subprocess, "run"),
        (subprocess, "Popen"),
        (os, "system"),
        (os, "posix_spawn"),
        (os, "posix_spawnp"),
        (os, "fork"),
    ]:
        monkeypatch.setattr(module, name, refuse)


@pytest.fixture(params=["plain", "wrapper", "masquerade"])
def cxx_called(request, fake_ccache, tmp_path, monkeypatch) -> str:
    """CXX as a plain compiler, a wrapper script, and a ccache masquerade."""
    gxx = fake_ccache["gxx"]
    wrapper = write_script(tmp_path / "wrap", f'#!/bin/sh\nexec {gxx} -O2 "$@"\n')
    cxx = {"plain": str(gxx), "wrapper": str(wrapper), "masquerade": "g++"}[request.param]
    monkeypatch.setenv("CXX", cxx)
    return cxx


def test_identity_is_stable_and_spawns_nothing(cxx_called, monkeypatch):
    _no_processes(monkeypatch)
    first = toolchain.find_cxx().identity
    assert toolchain.find_cxx().identity == first
    toolchain.reset()  # as a new process
    assert toolchain.find_cxx().identity == first


def test_a_warm_identity_reads_no_script_again(cxx_called, monkeypatch):
    reads = []
    read_script = toolchain._read_script
    monkeypatch.setattr(toolchain, "_read_script", lambda *a: reads.append(a) or read_script(*a))
    first = toolchain.find_cxx().identity
    read = len(reads)
    assert read > 0
    assert toolchain.find_cxx().identity == first
    assert len(reads) == read  # each file's stat is unchanged: its reading is reused


# ---------------------------------------------------------------- the host ISA (issue 35)
# /proc/cpuinfo of a two-core AArch64 host: "Features" (not x86's "flags") and the core.
AARCH64_CPUINFO = textwrap.dedent("""
    processor\t: 0
    BogoMIPS\t: 243.75
    Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp asimddp
    CPU implementer\t: 0x41
    CPU architecture: 8
    CPU variant\t: 0x3
    CPU part\t: 0xd0c
    CPU revision\t: 1

    processor\t: 1
    BogoMIPS\t: 243.75
    Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp asimddp
    CPU implementer\t: 0x41
    CPU architecture: 8
    CPU variant\t: 0x3
    CPU part\t: 0xd0c
    CPU revision\t: 1
""")
AARCH64_FEATURES = "aes asimd asimddp asimdhp atomics crc32 evtstrm fp fphp pmull sha1 sha2"


@pytest.fixture
def aarch64_host(monkeypatch, tmp_path):
    """An AArch64 machine with AARCH64_CPUINFO; returns the cpuinfo file to rewrite."""
    import platform

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(AARCH64_CPUINFO)
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(toolchain, "_CPUINFO", cpuinfo)
    return cpuinfo


def test_host_isa_on_aarch64_is_its_features_and_its_core(aarch64_host):
    words = sorted([*AARCH64_FEATURES.split(), "core=0x41/0x3/0xd0c"])
    assert toolchain.host_isa() == "aarch64:" + " ".join(words)


def test_another_core_with_the_same_features_is_another_host_isa(aarch64_host):
    before = toolchain.host_isa()
    aarch64_host.write_text(AARCH64_CPUINFO.replace("0xd0c", "0xd42", 1))  # big.LITTLE-like
    after = toolchain.host_isa()
    assert after != before
    assert "core=0x41/0x3/0xd0c" in after.split() and "core=0x41/0x3/0xd42" in after.split()


def test_host_isa_on_x86_is_its_flags_sorted(monkeypatch, tmp_path):
    import platform

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvmx flags\t: ept\nflags\t\t: sse2 avx2 fma avx\n\n")
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(toolchain, "_CPUINFO", cpuinfo)
    assert toolchain.host_isa() == "x86_64:avx avx2 fma sse2"


def test_host_isa_without_cpuinfo_is_the_machine(aarch64_host):
    aarch64_host.unlink()
    assert toolchain.host_isa() == "aarch64"


def test_cpu_flags_have_no_x86_only_option_on_aarch64(monkeypatch):
    import platform

    from mllm_kernel.jit_utils.loader import DEFAULT_CXX_FLAGS, host_vector_flags

    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    assert host_vector_flags() == ()
    assert (
        host_vector_flags("x86_64") == host_vector_flags("AMD64") == ("-mprefer-vector-width=512",)
    )
    # -march=native is understood by an AArch64 g++ too (it reads the same cpuinfo).
    assert "-march=native" in DEFAULT_CXX_FLAGS
