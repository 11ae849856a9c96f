"""show-clangd-recommend-config: the config's content, where its values come from, that an
existing file is kept, and that the real clangd parses package headers and .cu files with it."""

from __future__ import annotations

import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from mllm_kernel.__main__ import main
from mllm_kernel.cli import clangd
from mllm_kernel.jit_utils import paths, toolchain


@pytest.fixture
def no_gpu(monkeypatch, tmp_path):
    """No nvidia-smi on PATH (the compiler stays reachable), no GPU, no arch list."""
    import torch

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("c++", "g++", "clangd"):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for name in ("MLLM_KERNEL_CUDA_ARCH_LIST", "TORCH_CUDA_ARCH_LIST"):
        monkeypatch.delenv(name, raising=False)
    return bin_dir


def test_config_content(no_gpu):
    config = clangd.recommend()
    text = config.text
    assert '- "-std=c++20"' in text
    for directory in (*paths.tvm_ffi_include_dirs(), paths.include_dir()):
        assert f'- "-isystem{directory}"' in text
    assert '- "-xcuda"' in text
    assert config.cuda_arch == "sm_90a" and "--cuda-gpu-arch=sm_90a" in text
    assert config.cuda_arch_source.startswith("default")


@pytest.mark.parametrize(
    ("path", "is_cuda"),
    [
        ("/src/kernels/norm.cu", True),
        ("include/mllm_kernel/utils.cuh", True),
        ("norm.cpp", False),
        ("utils.hpp", False),
        ("cuda/notes.cuhx", False),
    ],
)
def test_cuda_fragment_matches_cu_and_cuh_only(path, is_cuda):
    # clangd anchors PathMatch at both ends, like re.fullmatch.
    pattern = re.search(r"PathMatch: '([^']+)'", clangd.recommend("sm_80").text).group(1)
    assert pattern == clangd.CUDA_PATH_MATCH
    assert bool(re.fullmatch(pattern, path)) is is_cuda


def test_arch_from_the_arch_list(no_gpu, monkeypatch):
    monkeypatch.setenv("MLLM_KERNEL_CUDA_ARCH_LIST", "8.0;9.0a")
    assert clangd.detect_cuda_arch() == ("sm_90a", "$MLLM_KERNEL_CUDA_ARCH_LIST")


def test_arch_order_is_the_loaders(no_gpu, monkeypatch):
    # The arch list wins over the GPU, as in the loader; nvidia-smi is not asked.
    import torch

    smi = no_gpu / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ntouch {no_gpu / 'smi-ran'}\necho 8.6\n")
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 9))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a")
    assert clangd.detect_cuda_arch() == ("sm_90a", "$TORCH_CUDA_ARCH_LIST")
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST")
    assert clangd.detect_cuda_arch() == ("sm_89", "GPU 0 (compute capability 8.9)")
    assert not (no_gpu / "smi-ran").exists()


def test_arch_from_torch(no_gpu, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert clangd.detect_cuda_arch() == ("sm_90a", "GPU 0 (compute capability 9.0)")


def test_without_a_toolkit_cuda_path_is_left_out(no_gpu, monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nowhere"))
    toolchain.reset()
    try:
        config = clangd.recommend()
    finally:
        toolchain.reset()
    assert config.cuda_path is None and "--cuda-path" not in config.text
    assert any("no CUDA toolkit found" in note for note in config.notes)


@pytest.mark.nvcc
def test_with_a_toolkit_cuda_path_is_its_root():
    config = clangd.recommend("sm_80")
    assert f'"--cuda-path={toolchain.find_cuda().home}"' in config.text


def test_cli_writes_then_keeps_an_existing_file(no_gpu, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["show-clangd-recommend-config"]) == 0
    written = (tmp_path / ".clangd").read_text()
    out = capsys.readouterr().out
    # The first line says a file was written, before any note (no GPU gives one here).
    assert out.startswith("wrote .clangd (CUDA arch sm_90a, from default")
    assert "note: no GPU or arch list found" in out
    (tmp_path / ".clangd").write_text("# mine\n")
    assert main(["show-clangd-recommend-config"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(".clangd already exists and was left untouched.") and "--force" in out
    assert written in out  # the recommended content is printed instead
    assert (tmp_path / ".clangd").read_text() == "# mine\n"
    assert main(["show-clangd-recommend-config", "--force"]) == 0
    assert (tmp_path / ".clangd").read_text() == written
    other = tmp_path / "sub" / "config.yaml"
    other.parent.mkdir()
    assert main(["show-clangd-recommend-config", "--output", str(other), "--cuda-arch", "8.0"]) == 0
    assert "--cuda-gpu-arch=sm_80" in other.read_text()


def test_help_says_the_command_writes_a_file(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    words = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "show-clangd-recommend-config write ./.clangd (despite 'show' in the name)" in words
    with pytest.raises(SystemExit):
        main(["show-clangd-recommend-config", "--help"])
    assert "Writes a .clangd file" in " ".join(capsys.readouterr().out.split())


def _clangd_check(path: Path, env: dict) -> subprocess.CompletedProcess:
    # --check-lines=1 limits clangd's per-token feature tests (which report tweak
    # failures in headers as errors in clangd 14) to the first line; parse errors
    # of the whole file are still counted.
    return subprocess.run(
        ["clangd", f"--check={path}", "--check-lines=1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.skipif(shutil.which("clangd") is None, reason="clangd is not installed")
def test_real_clangd_parses_headers_and_cu_files(tmp_path, monkeypatch):
    import os

    version = subprocess.run(["clangd", "--version"], capture_output=True, text=True).stdout
    major = int(re.search(r"version (\d+)", version).group(1))
    # clang learned sm_90a in 17; an older clangd gets an arch it knows.
    arch = "sm_90a" if major >= 17 else "sm_80"
    # The user config applies to every file, so the package's own headers are checked in place.
    config_home = tmp_path / "xdg"
    assert (
        main(
            [
                "show-clangd-recommend-config",
                "--cuda-arch",
                arch,
                "--output",
                str(config_home / "clangd" / "config.yaml"),
            ]
        )
        == 0
    )
    env = {**os.environ, "XDG_CONFIG_HOME": str(config_home), "HOME": str(tmp_path)}
    kernel = tmp_path / "kernel.cu"
    kernel.write_text(
        '#include "mllm_kernel/tensor.hpp"\n'
        '#include "mllm_kernel/utils.hpp"\n'
        "template <typename T>\n"
        "__global__ void scale(T* x, float s) { x[threadIdx.x] = x[threadIdx.x] * s; }\n"
        "void launch(float* x) { scale<float><<<1, 32>>>(x, 2.0f); }\n"
    )
    for path in (paths.include_dir() / "mllm_kernel" / "tensor.hpp", kernel):
        result = _clangd_check(path, env)
        assert result.returncode == 0, f"{path}:\n{result.stderr[-3000:]}"
        assert "All checks completed, 0 errors" in result.stderr


def test_output_in_a_missing_directory_is_an_error_not_created(no_gpu, tmp_path, capsys):
    # Before: the directory was created, parents and all.
    missing = tmp_path / "nonexistent" / "dir"
    assert main(["show-clangd-recommend-config", "--output", str(missing / ".clangd")]) == 1
    err = capsys.readouterr().err
    assert f"cannot write {missing / '.clangd'}: {missing} does not exist" in err
    assert f"mkdir -p {missing}" in err
    assert not missing.parent.exists()
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert main(["show-clangd-recommend-config", "--output", str(blocker / ".clangd")]) == 1
    assert f"{blocker} is not a directory" in capsys.readouterr().err


@pytest.mark.parametrize("arch", ["sm_999", "99.9", "sm_80a", "8.5"])
def test_cuda_arch_nvcc_does_not_know_is_refused(no_gpu, tmp_path, capsys, arch):
    # Before: written as --cuda-gpu-arch=sm_999, which clangd then fails on.
    output = tmp_path / ".clangd"
    assert main(["show-clangd-recommend-config", "--output", str(output), "--cuda-arch", arch]) == 2
    err = capsys.readouterr().err
    assert "is not one nvcc compiles for; known (" in err and "sm_90" in err
    assert "e.g. 9.0a" in err and not output.exists()


def test_cuda_arch_is_checked_against_nvcc_or_the_known_set(no_gpu, monkeypatch, tmp_path):
    from mllm_kernel.jit_utils import nvcc_archs
    from mllm_kernel.jit_utils.errors import CudaArchError

    for good in ("9.0a", "sm_80", "8.6", "sm_100a"):
        assert clangd.recommend(good).cuda_arch == f"sm_{good.replace('sm_', '').replace('.', '')}"
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nowhere"))
    toolchain.reset()
    try:
        numbers, source = nvcc_archs.known_archs()
        assert numbers == nvcc_archs.KNOWN_ARCHS and "no nvcc found" in source
        assert clangd.recommend("9.0a").cuda_arch == "sm_90a"
        with pytest.raises(CudaArchError, match=r"--cuda-arch sm_999 is not one nvcc compiles"):
            clangd.recommend("sm_999")
    finally:
        toolchain.reset()
