"""The CPU kernels on AArch64 (Jetson's CPU, Graviton, Grace), checked without one
(issue 35): every registered CPU kernel variant's generated translation unit compiles
with Debian's cross compiler (``g++-aarch64-linux-gnu``), with the flags the JIT passes
on an AArch64 host, to an object file (no link: no AArch64 libtvm_ffi here), and pulls
in no x86 intrinsic header. Where qemu-aarch64 exists, the NEON fp16 conversions also
run, bit for bit against the portable ones."""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import mllm_kernel.cpu.jit  # noqa: F401  (registers the CPU kernels)
from mllm_kernel.jit_utils import paths, registry
from mllm_kernel.jit_utils.build import parse_depfile
from mllm_kernel.jit_utils.loader import (
    DEFAULT_CPU_OPENMP_FLAGS,
    DEFAULT_CXX_FLAGS,
    host_vector_flags,
)

CROSS_CXX = shutil.which("aarch64-linux-gnu-g++")
QEMU = shutil.which("qemu-aarch64")
SYSROOT = Path("/usr/aarch64-linux-gnu")  # Debian's AArch64 libc and libstdc++

pytestmark = [
    pytest.mark.cross,
    pytest.mark.skipif(
        CROSS_CXX is None,
        reason="no aarch64-linux-gnu-g++ (apt-get install g++-aarch64-linux-gnu; .ci/run "
        "installs it where apt-get can)",
    ),
]

# -march=native on the build host means nothing for another machine: an explicit
# AArch64 target stands in. Armv8.2-A with fp16 arithmetic is Jetson Orin's
# Cortex-A78AE and Graviton2's Neoverse N1 (Grace's Neoverse V2 is a superset).
TARGET = "-march=armv8.2-a+fp16"
# Headers only x86 targets have (intrinsics, cpuid).
X86_HEADERS = ("immintrin.h", "x86intrin.h", "mmintrin.h", "xmmintrin.h", "emmintrin.h", "cpuid.h")
# Kernels that convert fp16 rows by NEON blocks (include/mllm_kernel/cpu/float_blocks.hpp).
USES_NEON = {"activation", "rmsnorm", "softmax", "add_constant", "add_constant_runtime"}


def aarch64_flags(cxx_flags: tuple[str, ...]) -> list[str]:
    """``cxx_flags`` (a CPU spec's, built on this host) as the JIT would give them on an
    AArch64 host: the loader's defaults for that machine, then the kernel's own flags."""
    host_defaults = (*DEFAULT_CXX_FLAGS, *DEFAULT_CPU_OPENMP_FLAGS)
    assert cxx_flags[: len(host_defaults)] == host_defaults, cxx_flags
    defaults = [TARGET if f == "-march=native" else f for f in DEFAULT_CXX_FLAGS]
    return [*defaults, "-fopenmp", *host_vector_flags("aarch64"), *cxx_flags[len(host_defaults) :]]


VARIANTS = [
    pytest.param(entry, variant, id=f"{entry.name}-{i}")
    for entry in registry.kernels("cpu")
    if entry.builtin
    for i, variant in enumerate(entry.variants)
]


@pytest.fixture(scope="module")
def every_variant_compiled(tmp_path_factory):
    """Each variant's translation unit compiled once, two at a time; maps the variant's
    test id to (compiler exit code, its output, the headers it read)."""
    root = tmp_path_factory.mktemp("aarch64")
    includes = [f"-I{paths.include_dir()}"]
    for path in paths.tvm_ffi_include_dirs():
        includes += ["-isystem", str(path)]

    def compile_one(index: int):
        entry, variant = VARIANTS[index].values
        spec = entry.spec(variant)
        unit = root / f"{index}.cpp"
        (text,) = spec.translation_units().values()
        unit.write_text(text)
        command = [
            CROSS_CXX, *aarch64_flags(spec.cxx_flags), *includes,
            *(f"-I{p}" for p in spec.include_paths),
            "-MD", "-MF", str(root / f"{index}.d"), "-c", str(unit), "-o", str(root / f"{index}.o"),
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True)
        depfile = root / f"{index}.d"
        headers = parse_depfile(depfile.read_text()) if depfile.is_file() else []
        return done.returncode, done.stdout + done.stderr, headers

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 2)) as pool:
        outcomes = list(pool.map(compile_one, range(len(VARIANTS))))
    print(f"{len(VARIANTS)} CPU kernel variants for AArch64 in {time.monotonic() - started:.1f}s")
    return {param.id: outcome for param, outcome in zip(VARIANTS, outcomes, strict=True)}


def test_every_builtin_cpu_kernel_has_variants():
    names = {param.values[0].name for param in VARIANTS}
    assert {"activation", "add_constant", "rmsnorm", "softmax"} <= names


@pytest.mark.parametrize("entry, variant", VARIANTS)
def test_variant_compiles_for_aarch64_without_x86_headers(
    entry, variant, every_variant_compiled, request
):
    code, output, headers = every_variant_compiled[request.node.callspec.id]
    assert code == 0, f"{entry.name}{variant}: {output}"
    names = {Path(h).name for h in headers}
    assert not names & set(X86_HEADERS), f"x86 headers pulled in: {names & set(X86_HEADERS)}"
    # The tvm-ffi headers every module includes came along, for AArch64.
    assert any(Path(h).match("*/tvm/ffi/function.h") for h in headers)
    if entry.name in USES_NEON:
        assert "arm_neon.h" in names, f"{entry.name}: the NEON fp16 path was not compiled"


def test_the_jit_passes_no_x86_only_flag_on_aarch64():
    flags = aarch64_flags((*DEFAULT_CXX_FLAGS, *DEFAULT_CPU_OPENMP_FLAGS))
    assert not [f for f in flags if f.startswith(("-mprefer-vector-width", "-mavx", "-mf16c"))]
    done = subprocess.run(
        [CROSS_CXX, *flags, "-x", "c++", "-fsyntax-only", "-"],
        input="int main() {}\n",
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr, done.stderr


CONVERSION_PROBE = textwrap.dedent("""
    #include <cstdio>
    #include <cstring>
    #include <vector>
    #include "mllm_kernel/cpu/float_blocks.hpp"
    using namespace mllm_kernel;
    int main() {
      static_assert(cpu::kConvertsInBlocks<fp16_t>, "NEON blocks expected on AArch64");
      long bad = 0;
      // Every half (and 3 more for a tail), widened in blocks vs one by one.
      std::vector<fp16_t> halves(65536 + 3);
      for (std::size_t i = 0; i < halves.size(); ++i) halves[i].bits = static_cast<uint16_t>(i);
      std::vector<float> wide(halves.size());
      cpu::widen(halves.data(), wide.data(), static_cast<int64_t>(halves.size()));
      for (std::size_t i = 0; i < halves.size(); ++i) {
        const float one = to_float(halves[i]);
        bad += std::memcmp(&one, &wide[i], sizeof(float)) != 0;
      }
      // Floats across every exponent (ties, subnormals, overflow, inf, NaN payloads).
      std::vector<float> floats;
      for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 4099) {
        const uint32_t bits = static_cast<uint32_t>(b);
        float f;
        std::memcpy(&f, &bits, sizeof(f));
        floats.push_back(f);
      }
      for (uint32_t bits : {0x33000000u, 0x33000001u, 0x387fc000u, 0x477ff000u, 0x477fefffu,
                            0x7f800000u, 0x7fc00001u, 0xff800123u, 0x80000001u}) {
        float f;
        std::memcpy(&f, &bits, sizeof(f));
        floats.push_back(f);
      }
      std::vector<fp16_t> narrow(floats.size());
      cpu::narrow(floats.data(), narrow.data(), static_cast<int64_t>(floats.size()));
      for (std::size_t i = 0; i < floats.size(); ++i) {
        bad += from_float<fp16_t>(floats[i]).bits != narrow[i].bits;
      }
      std::printf("%zu halves, %zu floats, %ld mismatches\\n", halves.size(), floats.size(), bad);
      return bad != 0;
    }
""")


@pytest.mark.skipif(
    QEMU is None or not SYSROOT.is_dir(), reason="no qemu-aarch64 (apt-get install qemu-user)"
)
def test_neon_fp16_conversions_match_the_portable_ones_bit_for_bit(tmp_path):
    source = tmp_path / "probe.cpp"
    source.write_text(CONVERSION_PROBE)
    binary = tmp_path / "probe"
    includes = [f"-I{paths.include_dir()}", *(f"-I{p}" for p in paths.tvm_ffi_include_dirs())]
    built = subprocess.run(
        [CROSS_CXX, "-std=c++20", "-O2", TARGET, *includes, str(source), "-o", str(binary)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr
    ran = subprocess.run(
        [QEMU, "-L", str(SYSROOT), str(binary)], capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert " 0 mismatches" in ran.stdout
