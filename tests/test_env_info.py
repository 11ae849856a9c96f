"""show-env's library: every probe works, and says "not found", without a GPU or tools."""

from __future__ import annotations

import json
import os
import stat
import types
from pathlib import Path

import pytest

from mllm_kernel import env_info
from mllm_kernel.jit_utils import toolchain


def _script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def bare_path(tmp_path, monkeypatch):
    """PATH with nothing on it (no compiler, nvcc, nvidia-smi, ninja); CUDA_HOME nowhere."""
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
    assert set(info) == {"os", "python", "cpu", "cuda", "torch", "versions", "cache_root"}
    assert info["cpu"]["logical_cores"] == os.cpu_count()
    assert info["versions"]["apache_tvm_ffi"]
    assert info["versions"]["torch_c_dlpack_ext"]
    text = env_info.format_env(info)
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
    assert versions["ninja"] is None
    rows = {(section, field): value for section, field, value in env_info.env_rows(info)}
    assert rows[("CUDA", "nvcc")] == "not found"
    assert rows[("CUDA", "nvcc on PATH")] == "not found"
    assert rows[("CUDA", "nvidia-smi")] == "not found"
    assert rows[("CUDA", "toolkit")].startswith("not found")
    assert rows[("CUDA", "CUDA_HOME")].endswith("($CUDA_HOME)")
    assert rows[("Versions", "C++ compiler")] == "not found"
    assert rows[("Versions", "ninja")] == "not found"


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
        "  --query-gpu=compute_cap) echo 9.0; echo 8.0 ;;\n"
        '  *) echo "| NVIDIA-SMI 555.42.06  Driver Version: 555.42.06  CUDA Version: 12.5 |" ;;\n'
        "esac",
    )
    smi = env_info.nvidia_smi_info()
    assert smi == {
        "path": str(bare_path / "nvidia-smi"),
        "driver_version": "555.42.06",
        "cuda_version": "12.5",
    }
    assert env_info.nvidia_smi_capabilities() == [(9, 0), (8, 0)]


def test_broken_nvidia_smi_is_not_fatal(bare_path):
    _script(bare_path / "nvidia-smi", "echo 'NVIDIA-SMI has failed' >&2; exit 9")
    smi = env_info.nvidia_smi_info()
    assert smi["path"] and smi["driver_version"] is None and smi["cuda_version"] is None
    assert env_info.nvidia_smi_capabilities() == []


def test_torch_without_gpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    info = env_info.torch_info()
    assert info["cuda_available"] is False and info["gpus"] == []
    rows = dict(((s, f), v) for s, f, v in env_info.env_rows({**env_info.collect(), "torch": info}))
    assert rows[("PyTorch", "GPUs")] == "none visible"


def test_torch_gpus_are_listed(monkeypatch):
    import torch

    props = types.SimpleNamespace(
        name="NVIDIA H100 80GB HBM3", major=9, minor=0, total_memory=80 << 30
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    info = env_info.torch_info()
    assert info["gpus"] == [
        {
            "index": 0,
            "name": "NVIDIA H100 80GB HBM3",
            "compute_capability": "9.0",
            "arch": "sm_90a",
            "memory_bytes": 80 << 30,
        }
    ]
    text = env_info.format_env({**env_info.collect(), "torch": info})
    assert "GPU 0" in text and "sm_90a" in text and "80.0 GiB" in text


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
    assert env_info.format_bytes(None) == "-"
    assert env_info.format_bytes(512) == "512 B"
    assert env_info.format_bytes(1536) == "1.5 KiB"
    assert env_info.format_bytes(3 << 30) == "3.0 GiB"


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
