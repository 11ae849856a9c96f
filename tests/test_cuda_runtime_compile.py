"""The raw runtime without a GPU (CI): CUBIN/PTX for sm_90a through the package cache,
compile errors, argument conversion in the native module, and the errors that need
no device."""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from mllm_kernel.cuda import Kernel, compile_to_cubin, compile_to_ptx, load_cubin, load_ptx
from mllm_kernel.cuda.runtime.native import native_module
from mllm_kernel.cuda.runtime.signature import parse_signature
from mllm_kernel.jit_utils import KernelBuildError, toolchain
from mllm_kernel.jit_utils.cuda_arch import cuda_arch_override
from mllm_kernel.jit_utils.errors import CudaArchError, ToolchainError

pytestmark = pytest.mark.nvcc

SAXPY = textwrap.dedent("""\
    extern "C" __global__ void saxpy(const float* x, float* y, float a, int n) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < n) y[i] = a * x[i] + y[i];
    }
""")
BROKEN = 'extern "C" __global__ void broken(int* x) {\n  x[0] = undefined_name;\n}\n'


@pytest.fixture(autouse=True)
def _hopper(monkeypatch):
    monkeypatch.setenv("MLLM_KERNEL_CUDA_ARCH_LIST", "9.0a")


def _entries(root: Path, prefix: str = "cuda_") -> list[Path]:
    return sorted(p for p in root.iterdir() if p.name.startswith(prefix))


def _cuobjdump_arch(cubin: bytes, tmp_path: Path) -> str | None:
    tool = toolchain.find_cuda().home / "bin" / "cuobjdump"
    if not tool.is_file():
        return None
    path = tmp_path / "probe.cubin"
    path.write_bytes(cubin)
    out = subprocess.run([str(tool), "--dump-elf", str(path)], capture_output=True, text=True)
    return out.stdout


def test_cubin_for_sm90a(fresh_cache, tmp_path):
    cubin = compile_to_cubin(SAXPY, arch="sm_90a")
    assert cubin.startswith(b"\x7fELF")
    assert compile_to_cubin(SAXPY) == cubin  # the default arch is the arch list's 9.0a
    (entry,) = _entries(fresh_cache)
    assert entry.name.startswith("cuda_cubin_kernel_sm_90a_")
    manifest = json.loads((entry / "manifest.json").read_text())
    assert manifest["template_args"] == ["cubin", "sm_90a", "nvcc"]
    assert manifest["cuda_archs"] == ["9.0a"]
    assert "Used" in (entry / "compile.log").read_text()  # the register report is kept
    dump = _cuobjdump_arch(cubin, tmp_path)
    if dump is not None:
        assert "sm_90a" in dump and "saxpy" in dump


def test_ptx_for_compute90a(fresh_cache):
    ptx = compile_to_ptx(SAXPY, arch="9.0a")
    assert ".target sm_90a" in ptx and ".visible .entry saxpy(" in ptx
    (entry,) = _entries(fresh_cache)
    assert entry.name.startswith("cuda_ptx_kernel_compute_90a_")


def test_source_from_a_path_and_its_headers_are_tracked(fresh_cache, tmp_path):
    header = tmp_path / "scale.h"
    header.write_text("#define SCALE 2.0f\n")
    source = tmp_path / "scaled.cu"
    source.write_text('#include "scale.h"\n' + SAXPY.replace("a * x[i]", "SCALE * x[i]"))
    first = compile_to_ptx(source)
    assert "2.0" in first or "0f40000000" in first  # 2.0f as PTX spells it
    (entry,) = _entries(fresh_cache)
    assert entry.name.startswith("cuda_ptx_scaled_compute_90a_")
    manifest = json.loads((entry / "manifest.json").read_text())
    assert sorted(manifest["deps"]) == sorted([str(header), str(source)])  # as named
    assert manifest["toolchain_deps"], "the toolkit's headers are fingerprinted"
    header.write_text("#define SCALE 3.0f\n")
    second = compile_to_ptx(str(source))
    assert second != first and "0f40400000" in second  # 3.0f: recompiled for the header


SCALED = "#include <scale.h>\n" + SAXPY.replace("a * x[i]", "SCALE * x[i]")


def _scale(directory: Path, value: str) -> None:
    directory.mkdir(exist_ok=True)
    (directory / "scale.h").write_text(f"#define SCALE {value}\n")


# Issue 31, item 4: the raw runtime kept its own, weaker dependency tracking.
def test_a_header_through_isystem_is_tracked(fresh_cache, tmp_path):
    # Before: -MMD left -isystem headers out; the edit was served stale.
    _scale(tmp_path / "sys", "2.0f")
    options = ["-isystem", str(tmp_path / "sys")]
    assert "0f40000000" in compile_to_ptx(SCALED, options=options)
    _scale(tmp_path / "sys", "3.0f")
    assert "0f40400000" in compile_to_ptx(SCALED, options=options)


def test_cpath_is_in_the_key(fresh_cache, tmp_path, monkeypatch):
    # Before: CPATH was not in the key; the other directory's header was never read.
    _scale(tmp_path / "one", "2.0f")
    _scale(tmp_path / "two", "3.0f")
    monkeypatch.setenv("CPATH", str(tmp_path / "one"))
    assert "0f40000000" in compile_to_ptx(SCALED)
    monkeypatch.setenv("CPATH", str(tmp_path / "two"))
    assert "0f40400000" in compile_to_ptx(SCALED)


def test_nvccs_flag_variables_are_in_the_key(fresh_cache, monkeypatch):
    # Before: NVCC_APPEND_FLAGS changed the binary but not the key: a cached build made
    # with or without it was served to the other.
    default = "#ifndef SCALE\n#define SCALE 2.0f\n#endif\n"
    source = default + SAXPY.replace("a * x[i]", "SCALE * x[i]")
    assert "0f40000000" in compile_to_ptx(source)
    for name in ("NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS"):
        monkeypatch.setenv(name, "-DSCALE=3.0f")
        assert "0f40400000" in compile_to_ptx(source)
        monkeypatch.delenv(name)
    assert "0f40000000" in compile_to_ptx(source)


def test_a_new_shadowing_header_recompiles(fresh_cache, tmp_path, caplog, monkeypatch):
    # Before: scale.h created in A (searched before B) was not seen.
    monkeypatch.setattr(logging.getLogger("mllm_kernel"), "propagate", True)  # for caplog
    (tmp_path / "A").mkdir()
    _scale(tmp_path / "B", "2.0f")
    options = ["-I", str(tmp_path / "A"), "-I", str(tmp_path / "B")]
    assert "0f40000000" in compile_to_ptx(SCALED, options=options)
    _scale(tmp_path / "A", "3.0f")
    with caplog.at_level(logging.INFO, logger="mllm_kernel"):
        assert "0f40400000" in compile_to_ptx(SCALED, options=options)
    assert f"{tmp_path / 'A' / 'scale.h'} now shadows the scale.h" in caplog.text


def test_options_reach_the_compiler_and_the_key(fresh_cache):
    source = "#ifndef SCALE\n#define SCALE 2.0f\n#endif\n" + SAXPY.replace("a * x", "SCALE * x")
    plain = compile_to_ptx(source)
    scaled = compile_to_ptx(source, options=["-DSCALE=3.0f"])
    assert "0f40000000" in plain and "0f40400000" in scaled  # 2.0f, then 3.0f
    assert len(_entries(fresh_cache)) == 2
    with pytest.raises(TypeError, match=r"options must be a sequence of flags"):
        compile_to_ptx(SAXPY, options="--use_fast_math")


def test_cache_dir_overrides_the_root(fresh_cache, tmp_path):
    other = tmp_path / "elsewhere"
    compile_to_cubin(SAXPY, cache_dir=other)
    assert len(_entries(other)) == 1
    assert not fresh_cache.exists() or _entries(fresh_cache) == []


def test_corrupt_artifact_is_recompiled(fresh_cache, caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("mllm_kernel"), "propagate", True)  # for caplog
    cubin = compile_to_cubin(SAXPY)
    (entry,) = _entries(fresh_cache)
    artifact = entry / "kernel.cubin"
    artifact.write_bytes(cubin[: len(cubin) // 2])  # truncated
    assert compile_to_cubin(SAXPY) == cubin
    assert "is corrupt" in caplog.text
    artifact.write_bytes(cubin[:-1] + bytes([cubin[-1] ^ 0xFF]))  # same size, altered
    assert compile_to_cubin(SAXPY) == cubin


def test_second_process_hits_the_cache_without_a_compiler(fresh_cache):
    cubin = compile_to_cubin(SAXPY)
    script = textwrap.dedent(f"""
        import subprocess, sys
        from mllm_kernel.cuda import compile_to_cubin

        def refuse(*args, **kwargs):
            raise AssertionError(f"spawned {{args[0] if args else kwargs}}")

        subprocess.Popen = refuse
        sys.stdout.buffer.write(compile_to_cubin({SAXPY!r}))
    """)
    env = {**os.environ, "MLLM_KERNEL_CACHE_DIR": str(fresh_cache)}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent.parent), *sys.path])
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, env=env, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout == cubin


@pytest.mark.parametrize("backend", ["nvcc", "nvrtc"])
def test_compile_error_leads_with_file_and_line(fresh_cache, tmp_path, backend):
    if backend == "nvrtc":
        pytest.importorskip("cuda.bindings.nvrtc")
    with pytest.raises(KernelBuildError) as info:
        compile_to_cubin(BROKEN, backend=backend)
    message = str(info.value)
    assert message.startswith('kernel.cu:2: identifier "undefined_name" is undefined\n')
    assert f"-> cubin for sm_90a ({backend})" in message
    assert Path(info.value.log_path).is_file()
    path = tmp_path / "broken.cu"
    path.write_text(BROKEN)
    with pytest.raises(KernelBuildError, match=rf"^{path}:2: identifier \"undefined_name\""):
        compile_to_ptx(path, backend=backend)
    assert [p for p in _entries(fresh_cache)] == []  # nothing half-built was installed


def test_nvrtc_compiles_the_same_kernel(fresh_cache):
    pytest.importorskip("cuda.bindings.nvrtc")
    cubin = compile_to_cubin(SAXPY, backend="nvrtc")
    ptx = compile_to_ptx(SAXPY, backend="nvrtc")
    assert cubin.startswith(b"\x7fELF")
    assert ".visible .entry saxpy(" in ptx and "\0" not in ptx
    names = [p.name for p in _entries(fresh_cache)]
    assert len(names) == 2 and all("nvrtc" not in n for n in names)
    manifest = json.loads((_entries(fresh_cache)[0] / "manifest.json").read_text())
    assert manifest["template_args"][-1] == "nvrtc"


def test_nvrtc_tracks_the_headers_it_read(fresh_cache, tmp_path, caplog, monkeypatch):
    # NVRTC reports no dependencies: its headers were never tracked (edits served stale).
    pytest.importorskip("cuda.bindings.nvrtc")
    monkeypatch.setattr(logging.getLogger("mllm_kernel"), "propagate", True)  # for caplog
    _scale(tmp_path / "inc", "2.0f")
    (tmp_path / "early").mkdir()
    options = ["-I", str(tmp_path / "early"), "-I", str(tmp_path / "inc")]
    assert "0f40000000" in compile_to_ptx(SCALED, options=options, backend="nvrtc")
    _scale(tmp_path / "inc", "3.0f")  # edited
    assert "0f40400000" in compile_to_ptx(SCALED, options=options, backend="nvrtc")
    _scale(tmp_path / "early", "4.0f")  # now shadows it
    with caplog.at_level(logging.INFO, logger="mllm_kernel"):
        assert "0f40800000" in compile_to_ptx(SCALED, options=options, backend="nvrtc")
    assert f"{tmp_path / 'early' / 'scale.h'} now shadows the scale.h" in caplog.text


def test_nvrtc_missing_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "cuda.bindings.nvrtc", None)  # import fails
    with pytest.raises(ToolchainError, match=r"pip install mllm-kernel\[nvrtc\]"):
        compile_to_cubin(SAXPY, backend="nvrtc")


def test_bad_requests():
    with pytest.raises(ValueError, match="backend must be 'nvcc' or 'nvrtc'"):
        compile_to_cubin(SAXPY, backend="clang")
    with pytest.raises(CudaArchError, match="arch must name one architecture"):
        compile_to_cubin(SAXPY, arch="8.0;9.0a")
    with pytest.raises(FileNotFoundError, match=r"missing\.cu"):
        compile_to_cubin("missing.cu")
    with pytest.raises(TypeError, match="source must be CUDA source text or a path"):
        compile_to_cubin(b"bytes are not source")


def test_several_archs_need_one_chosen(monkeypatch):
    monkeypatch.setenv("MLLM_KERNEL_CUDA_ARCH_LIST", "8.0;9.0a")
    if torch.cuda.is_available():
        pytest.skip("with a GPU the arch list entry of that GPU is chosen")
    with pytest.raises(CudaArchError, match=r"arch list is 8\.0;9\.0a: pass arch="):
        compile_to_cubin(SAXPY)


def test_loading_checks_the_image_before_the_gpu(tmp_path):
    with pytest.raises(ValueError, match="not a CUBIN or fatbin"):
        load_cubin(b"#!/bin/sh\n")
    path = tmp_path / "fake.cubin"
    path.write_bytes(b"not elf")
    with pytest.raises(ValueError, match="not a CUBIN or fatbin"):
        load_cubin(path)
    with pytest.raises(ValueError, match=r"not PTX \(no \.version"):
        load_ptx(b"garbage")


def test_kernel_object_steps_in_order():
    kernel = Kernel()
    with pytest.raises(RuntimeError, match=r"no module loaded: call load_cubin\(path\)"):
        kernel.set_kernel("saxpy")
    with pytest.raises(RuntimeError, match=r"no kernel selected: call set_kernel"):
        kernel.launch((), grid=1, block=1)
    with pytest.raises(RuntimeError, match="no kernel selected"):
        kernel.synchronize()


# ---------------------------------------------------------------------------
# Argument conversion: the native module's own packing code, run without a GPU.
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pack():
    # Module-scoped, so set up before the autouse arch fixture: the native module holds no
    # device code, and any arch builds it on a machine without a GPU.
    with cuda_arch_override("9.0a"):
        module = native_module()

    def pack_as(signature: str, *args):
        params = parse_signature(signature)
        return module.pack_arguments([p.kind for p in params], [p.label for p in params], args)

    return pack_as


def _slots(data: bytes) -> list[bytes]:
    return [data[i : i + 8] for i in range(0, len(data), 8)]


def test_scalars_pack_as_their_c_types(pack):
    data = pack(
        "bool b, int8_t c, short s, int i, long long l, unsigned char uc, uint16_t us, "
        "unsigned u, size_t z, half h, __nv_bfloat16 bf, float f, double d",
        True,
        -5,
        -300,
        -(2**31),
        2**63 - 1,
        255,
        65535,
        2**32 - 1,
        2**64 - 1,
        1.5,
        -2.0,
        0.1,
        1 / 3,
    )
    slots = _slots(bytes(data))
    assert len(slots) == 13
    expected = [
        struct.pack("<?", True),
        struct.pack("<b", -5),
        struct.pack("<h", -300),
        struct.pack("<i", -(2**31)),
        struct.pack("<q", 2**63 - 1),
        struct.pack("<B", 255),
        struct.pack("<H", 65535),
        struct.pack("<I", 2**32 - 1),
        struct.pack("<Q", 2**64 - 1),
        np.float16(1.5).tobytes(),
        struct.pack("<H", 0xC000),  # bf16 -2.0
        struct.pack("<f", 0.1),
        struct.pack("<d", 1 / 3),
    ]
    for slot, value in zip(slots, expected, strict=True):
        assert slot == value.ljust(8, b"\0")


def test_ints_and_bools_for_float_parameters(pack):
    slots = _slots(bytes(pack("float a, double b, half c", 3, True, 2)))
    assert slots[0][:4] == struct.pack("<f", 3.0)
    assert slots[1] == struct.pack("<d", 1.0)
    assert slots[2][:2] == np.float16(2).tobytes()


def test_half_rounds_to_nearest_even(pack):
    values = [65504.0, 6.1e-5, 1.0 + 2**-11, -0.0, 1e-8]
    got = [bytes(pack("half h", v))[:2] for v in values]
    assert got == [np.float16(v).tobytes() for v in values]


@pytest.mark.parametrize(
    ("signature", "value", "message"),
    [
        (
            "int n",
            2**31,
            r"argument 'n' \(int\): 2147483648 does not fit \(the range is "
            r"-2147483648\.\.2147483647\)",
        ),
        ("int n", -(2**31) - 1, "does not fit"),
        ("unsigned char u", -1, r"argument 'u' \(unsigned char\): -1 does not fit"),
        ("int8_t c", 128, r"128 does not fit \(the range is -128\.\.127\)"),
        ("size_t z", -1, "does not fit"),
        ("int64_t l", 2**63, r"argument 'l' \(int64_t\): 9223372036854775808 does not fit"),
        ("size_t z", 2**64, "does not fit in 64 bits"),
        ("bool b", 2, r"argument 'b' \(bool\): 2 is not a bool"),
        ("half h", 70000.0, r"argument 'h' \(half\): 70000 is out of the type's range"),
        ("float f", 1e300, "is out of the type's range"),
        ("__nv_bfloat16 bf", 1e39, "is out of the type's range"),
    ],
)
def test_out_of_range_scalars(pack, signature, value, message):
    with pytest.raises(OverflowError, match=message):
        pack(signature, value)


def test_infinities_and_nan_pass_through(pack):
    assert bytes(pack("float f", float("inf")))[:4] == struct.pack("<f", float("inf"))
    assert np.isnan(np.frombuffer(bytes(pack("double d", float("nan"))), np.float64)[0])


@pytest.mark.parametrize(
    ("signature", "value", "error", "message"),
    [
        ("int n", 1.5, TypeError, r"argument 'n' \(int\): expected an int, got float"),
        ("int n", "3", TypeError, r"expected an int, got str"),
        ("int n", None, TypeError, r"expected an int, got None"),
        ("int n", b"3", TypeError, r"expected an int, got bytes"),
        ("float* p", [1.0], TypeError, r"got a list or tuple"),
        ("bool b", 1.0, TypeError, r"argument 'b' \(bool\): expected a bool, got float"),
        ("float f", "1", TypeError, r"argument 'f' \(float\): expected a float or an int, got"),
        (
            "float* p",
            1234,
            TypeError,
            r"argument 'p' \(float\*\): expected a CUDA tensor "
            r"\(torch, CuPy, JAX or any DLPack array\), a NumPy "
            r"array or None, got int",
        ),
        (
            "const float* p",
            torch.zeros(2),
            ValueError,
            r"argument 'p' \(const float\*\): expected a CUDA tensor, got one on cpu",
        ),
        ("const float*", torch.zeros(2), ValueError, r"^argument 0 \(const float\*\)"),
        ("float* p", np.zeros(2, np.float32), ValueError, "got one on cpu"),
    ],
)
def test_wrong_kinds(pack, signature, value, error, message):
    with pytest.raises(error, match=message):
        pack(signature, value)


def test_null_pointer_and_argument_count(pack):
    assert bytes(pack("float* p, int n", None, 7)) == bytes(8) + struct.pack("<q", 7)
    with pytest.raises(
        TypeError,
        match=r"takes 2 arguments \(argument 'p' \(float\*\), argument 'n' \(int\)\), got 1",
    ):
        pack("float* p, int n", None)
    with pytest.raises(TypeError, match="takes 0 arguments"):
        pack("", 1)


def test_import_initialises_no_cuda():
    script = (
        "import mllm_kernel.cuda, torch, sys; "
        "assert not torch.cuda.is_initialized(); "
        "assert 'mllm_kernel.cuda.runtime.nvrtc' not in sys.modules"
    )
    # The checkout first, then whatever the caller's PYTHONPATH holds (tvm-ffi may be there).
    search = [str(Path(__file__).parent.parent), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in search if p)}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=120)


def test_cache_entries_are_listed_with_other_modules(fresh_cache):
    from mllm_kernel.jit_utils.cache_admin import cached_modules

    compile_to_cubin(SAXPY)
    (module,) = [m for m in cached_modules(fresh_cache) if m.name == "kernel"]
    assert module.device == "cuda" and module.manifest.template_args[0] == "cubin"
    shutil.rmtree(module.path)


def test_verbose_prints_command_time_and_registers(fresh_cache, capsys):
    compile_to_cubin(SAXPY, verbose=True)
    err = capsys.readouterr().err
    assert "kernel.cu -> cubin for sm_90a (nvcc): compiled in" in err
    assert "nvcc" in err and "-gencode=arch=compute_90a,code=sm_90a" in err
    assert "Used" in err and "registers" in err and "spill" in err
    compile_to_cubin(SAXPY, verbose=True)
    err = capsys.readouterr().err
    assert f"from the cache ({_entries(fresh_cache)[0]})" in err and "registers" in err
    compile_to_cubin(SAXPY)
    assert capsys.readouterr().err == ""
