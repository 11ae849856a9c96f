"""show-env's library: every probe works, and says "not found", without a GPU or tools."""

from __future__ import annotations

import json
import os
import re
import types
from pathlib import Path

import pytest
from conftest import write_script

from mllm_kernel.cli import env_info, output
from mllm_kernel.jit_utils import toolchain


def _script(path: Path, body: str) -> Path:
    return write_script(path, "#!/bin/sh\n" + body + "\n")


@pytest.fixture
def bare_path(tmp_path, monkeypatch):
    """PATH with nothing on it (no compiler, nvcc, nvidia-smi); CUDA_HOME nowhere."""
    empty = tmp_path / "empty_bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no_cuda_here"))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.delenv("CXX", raising=False)
    toolchain.reset()
    yield empty
    toolchain.reset()


def test_collect_is_json_and_complete():
    info = env_info.collect()
    assert json.loads(json.dumps(info)) == info
    assert set(info) == {
        "os",
        "python",
        "cpu",
        "cuda",
        "jit_cuda_arch",
        "torch",
        "versions",
        "cache_root",
        "cache_root_in_use",
        "cache_root_problem",
    }
    assert info["cpu"]["logical_cores"] == os.cpu_count()
    assert info["versions"]["apache_tvm_ffi"]
    assert info["versions"]["torch_c_dlpack_ext"]
    text = output.format_env(info)
    for section in ("OS:", "Python:", "CPU:", "CUDA:", "PyTorch:", "Versions:", "Cache:"):
        assert section in text
    assert info["cache_root"] in text


def test_nothing_installed_says_not_found(bare_path):
    info = env_info.collect()
    cuda, versions = info["cuda"], info["versions"]
    assert cuda["nvcc"] is None and cuda["nvcc_on_path"] is None and cuda["toolkit"] is None
    assert "CUDA toolkit not found" in cuda["toolkit_error"]
    assert cuda["nvidia_smi"] == {"path": None, "driver_version": None, "cuda_version": None}
    assert versions["cxx"] is None and "No C++ compiler found" in versions["cxx_error"]
    rows = {(section, field): value for section, field, value in output.env_rows(info)}
    assert rows[("CUDA", "nvcc")] == "not found"
    assert rows[("CUDA", "nvcc on PATH")] == "not found"
    assert rows[("CUDA", "nvidia-smi")] == "not found"
    assert rows[("CUDA", "toolkit")].startswith("not found")
    assert rows[("CUDA", "CUDA_HOME")].endswith("($CUDA_HOME)")
    assert rows[("Versions", "C++ compiler")] == "not found"


def test_show_env_does_not_ask_ninja(bare_path, tmp_path):
    # No build uses ninja: show-env neither runs it nor reports it.
    ran = tmp_path / "ninja-ran"
    _script(bare_path / "ninja", f"touch {ran}; echo 1.11.1")
    info = env_info.collect()
    assert not any("ninja" in name for name in info["versions"]) and not ran.exists()
    assert not any("ninja" in field for _, field, _ in output.env_rows(info))


def test_nvcc_version_worded_otherwise_is_shown_as_said(tmp_path, monkeypatch, bare_path):
    home = tmp_path / "cuda-odd"
    _script(home / "bin" / "nvcc", "echo 'nvcc: NVIDIA (R) Cuda compiler'; echo 'build 7'")
    (home / "lib64").mkdir()
    (home / "lib64" / "libcudart.so").write_bytes(b"")
    monkeypatch.setenv("CUDA_HOME", str(home))
    toolchain.reset()
    cuda = toolchain.find_cuda()
    assert cuda.nvcc_version() == toolchain.NvccVersion("build 7", None)
    assert cuda.release() is None
    (home / "version.json").write_text('{"cuda": {"name": "CUDA SDK", "version": "12.9.1"}}')
    assert cuda.release() == "12.9.1"  # version.json first, and no nvcc run for it
    info = env_info.cuda_info()
    assert (info["nvcc_version"], info["toolkit_version"]) == ("build 7", "12.9.1")


def test_nvcc_found_through_a_wrapper_script(tmp_path, monkeypatch, bare_path):
    home = tmp_path / "cuda-99.1"
    real = _script(home / "bin" / "nvcc", "echo 'Cuda compilation tools, release 99.1, V99.1.7'")
    (home / "lib64").mkdir()
    (home / "lib64" / "libcudart.so").write_bytes(b"")
    _script(bare_path / "nvcc", f'exec {real} "$@"')
    monkeypatch.delenv("CUDA_HOME")
    toolchain.reset()
    cuda = env_info.cuda_info()
    assert cuda["nvcc_on_path"] == str(bare_path / "nvcc")
    assert cuda["nvcc_on_path_real"] == str(real.resolve())
    assert cuda["toolkit"] == str(home.resolve())
    assert cuda["nvcc_version"] == "99.1, V99.1.7"
    assert cuda["toolkit_version"] == "99.1"  # no version.json: from nvcc's release line


def test_nvidia_smi_driver_and_capabilities(bare_path):
    _script(
        bare_path / "nvidia-smi",
        'case "$1" in\n'
        "  --query-gpu=driver_version) echo 555.42.06; echo 555.42.06 ;;\n"
        '  *) echo "| NVIDIA-SMI 555.42.06  Driver Version: 555.42.06  CUDA Version: 12.5 |" ;;\n'
        "esac",
    )
    smi = env_info.nvidia_smi_info()
    assert smi == {
        "path": str(bare_path / "nvidia-smi"),
        "driver_version": "555.42.06",
        "cuda_version": "12.5",
    }


def test_broken_nvidia_smi_is_not_fatal(bare_path):
    _script(bare_path / "nvidia-smi", "echo 'NVIDIA-SMI has failed' >&2; exit 9")
    smi = env_info.nvidia_smi_info()
    assert smi["path"] and smi["driver_version"] is None and smi["cuda_version"] is None


def test_torch_without_gpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    info = env_info.torch_info()
    assert info["cuda_available"] is False and info["gpus"] == []
    rows = dict(((s, f), v) for s, f, v in output.env_rows({**env_info.collect(), "torch": info}))
    assert rows[("PyTorch", "GPUs")] == "none visible"


def test_torch_gpus_are_listed(monkeypatch):
    import torch

    props = types.SimpleNamespace(
        name="NVIDIA H100 80GB HBM3", major=9, minor=0, total_memory=80 << 30
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(env_info, "gpu_details", lambda index: {"error": f"stub {index}"})
    info = env_info.torch_info()
    assert info["gpus"] == [
        {
            "index": 0,
            "name": "NVIDIA H100 80GB HBM3",
            "compute_capability": "9.0",
            "arch": "sm_90a",
            "memory_bytes": 80 << 30,
            "details": {"error": "stub 0"},
        }
    ]
    text = output.format_env({**env_info.collect(), "torch": info})
    assert "GPU 0" in text and "sm_90a" in text and "80.0 GiB" in text
    assert re.search(r"GPU 0 details +unavailable \(stub 0\)", text)


@pytest.mark.parametrize(
    ("isa", "expected"),
    [
        (
            "x86_64:avx avx2 amx_tile avx512f sse4_2 smep smap",
            ["amx_tile", "avx", "avx2", "avx512f"],
        ),
        ("aarch64:fp asimd asimdhp sve sve2 sme", ["asimd", "asimdhp", "sme", "sve", "sve2"]),
    ],
)
def test_isa_flags_keep_what_kernels_use(monkeypatch, isa, expected):
    monkeypatch.setattr(toolchain, "host_isa", lambda: isa)
    assert env_info.isa_flags() == expected


def test_format_bytes():
    assert output.format_bytes(None) == "-"
    assert output.format_bytes(512) == "512 B"
    assert output.format_bytes(1536) == "1.5 KiB"
    assert output.format_bytes(3 << 30) == "3.0 GiB"


def test_check_bounds_is_read_once_per_process(monkeypatch):
    from mllm_kernel.jit_utils import env

    monkeypatch.setenv("MLLM_KERNEL_CHECK_BOUNDS", "1")
    env.check_bounds.cache_clear()
    try:
        assert env.check_bounds() is True
        monkeypatch.setenv("MLLM_KERNEL_CHECK_BOUNDS", "0")
        assert env.check_bounds() is True  # cached: decode calls must not read os.environ
        env.check_bounds.cache_clear()
        assert env.check_bounds() is False
    finally:
        monkeypatch.undo()
        env.check_bounds.cache_clear()


def test_gpu_details_rows():
    details = {
        "sm_count": 132,
        "warp_size": 32,
        "max_threads_per_block": 1024,
        "max_threads_per_sm": 2048,
        "registers_per_sm": 65536,
        "cluster_launch": True,
        "jit_arch": "sm_90a",
        "shared_memory_per_block": 48 * 1024,
        "shared_memory_per_block_optin": 227 * 1024,
        "shared_memory_per_sm": 228 * 1024,
        "total_memory_bytes": 80 * 2**30,
        "l2_cache_bytes": 50 * 2**20,
        "memory_bus_width_bits": 5120,
        "memory_clock_khz": 2619000,
        "memory_bandwidth_gbps": 3352.3,
    }
    rows = {f: v for _, f, v in output.gpu_detail_rows({"index": 1, "details": details})}
    assert rows["GPU 1 compute"] == (
        "132 SMs, warp 32, 1024 threads/block, 2048 threads/SM, 65536 registers/SM, "
        "clusters yes, JIT arch sm_90a"
    )
    assert rows["GPU 1 shared memory"] == "48.0 KiB/block (227.0 KiB opt-in), 228.0 KiB/SM"
    assert rows["GPU 1 memory"] == (
        "80.0 GiB, L2 50.0 MiB, 5120-bit at 2619 MHz: 3352 GB/s theoretical"
    )
    unavailable = output.gpu_detail_rows({"index": 0, "details": {"error": "no nvcc"}})
    assert unavailable == [("PyTorch", "GPU 0 details", "unavailable (no nvcc)")]


def test_jit_arch_is_the_loaders_choice(monkeypatch):
    from mllm_kernel.jit_utils.cuda_arch import cuda_arch_override, resolve_cuda_archs

    monkeypatch.setenv("MLLM_KERNEL_CUDA_ARCH_LIST", "8.0;9.0a")
    arch = env_info.jit_cuda_arch()
    assert arch == {"archs": ["8.0", "9.0a"], "source": "$MLLM_KERNEL_CUDA_ARCH_LIST"}
    assert arch["archs"] == [str(a) for a in resolve_cuda_archs()]
    rows = {(s, f): v for s, f, v in output.env_rows(env_info.collect())}
    assert rows[("CUDA", "JIT arch")] == "8.0;9.0a (from $MLLM_KERNEL_CUDA_ARCH_LIST)"
    with cuda_arch_override("10.0a"):
        assert env_info.jit_cuda_arch()["source"] == "override (--arch)"
    assert env_info.jit_cuda_arch("10.0a") == {"archs": ["10.0a"], "source": "override (--arch)"}


def test_no_gpu_and_no_arch_is_stated_as_a_fact_not_a_fault(monkeypatch):
    # Before: "unknown: No CUDA GPU is visible and no arch was given: set
    # MLLM_KERNEL_CUDA_ARCH_LIST ...", in every summary of a CPU-only machine.
    import torch

    for name in ("MLLM_KERNEL_CUDA_ARCH_LIST", "TORCH_CUDA_ARCH_LIST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    arch = env_info.jit_cuda_arch()
    assert arch["archs"] is None and arch["no_gpu"] is True
    assert "MLLM_KERNEL_CUDA_ARCH_LIST=9.0a" in arch["error"]  # the loader's own error stays
    text = output.format_jit_arch(arch)
    assert text == output.NO_GPU_ARCH and text.startswith("none (no GPU here")
    assert "--arch 9.0a" in text and "unknown" not in text
    rows = {(s, f): v for s, f, v in output.env_rows(env_info.collect())}
    assert rows[("CUDA", "JIT arch")] == output.NO_GPU_ARCH


def test_a_bad_arch_list_still_says_what_to_fix(monkeypatch):
    monkeypatch.setenv("MLLM_KERNEL_CUDA_ARCH_LIST", "banana")
    arch = env_info.jit_cuda_arch()
    assert arch["archs"] is None and arch["no_gpu"] is False
    assert output.format_jit_arch(arch).startswith(
        "unknown: $MLLM_KERNEL_CUDA_ARCH_LIST: cannot parse CUDA arch 'banana'"
    )
