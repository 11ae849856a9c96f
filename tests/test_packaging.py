"""The package as installed: wheel contents, CMake options, find_package, a
kernel compiled from an installed copy with no source tree in reach."""

from __future__ import annotations

import os
import re
import shutil
import site as sitelib
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(
    not (REPO / "pyproject.toml").is_file() or shutil.which("cmake") is None,
    reason="needs the source checkout and cmake",
)


def _build_wheel(out_dir: Path, *defines: str) -> Path:
    settings = [f"--config-settings=cmake.define.{d}" for d in defines]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(REPO),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out_dir),
            *settings,
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    (wheel,) = out_dir.glob("mllm_kernel-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return _build_wheel(tmp_path_factory.mktemp("wheel"))


def test_wheel_holds_headers_sources_and_cmake_config(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for header in ("source_location.hpp", "tensor.hpp", "utils.hpp", "utils.cuh"):
        assert f"mllm_kernel/include/mllm_kernel/{header}" in names
    assert "mllm_kernel/cpu/sources/add_constant.cpp" in names
    assert any(n.startswith("mllm_kernel/cuda/sources/") for n in names) or not any(
        (REPO / "mllm_kernel" / "cuda" / "csrc").iterdir()
    )
    assert "mllm_kernel/share/cmake/MllmKernel/MllmKernelConfig.cmake" in names
    assert "mllm_kernel/jit_utils/loader.py" in names
    assert "mllm_kernel/py.typed" in names  # PEP 561: type checkers read our annotations
    # Nothing lands at the top level of site-packages, and no checkout csrc/ copy.
    assert all(n.startswith(("mllm_kernel/", "mllm_kernel-")) for n in names), names
    assert not any("/csrc/" in n or "__pycache__" in n for n in names)


def _cmake_install(tmp_path: Path, *defines: str) -> subprocess.CompletedProcess:
    build, prefix = tmp_path / "build", tmp_path / "prefix"
    configure = subprocess.run(
        [
            "cmake",
            "-S",
            str(REPO),
            "-B",
            str(build),
            f"-DCMAKE_INSTALL_PREFIX={prefix}",
            *(f"-D{d}" for d in defines),
        ],
        capture_output=True,
        text=True,
    )
    if configure.returncode != 0:
        return configure
    return subprocess.run(["cmake", "--install", str(build)], capture_output=True, text=True)


@pytest.mark.parametrize("cpu", ["ON", "OFF"])
@pytest.mark.parametrize("cuda", ["ON", "OFF"])
def test_backend_options_decide_installed_kernel_trees(tmp_path, cpu, cuda):
    result = _cmake_install(
        tmp_path, f"MLLM_KERNEL_BUILD_CPU={cpu}", f"MLLM_KERNEL_BUILD_CUDA={cuda}"
    )
    assert result.returncode == 0, result.stderr
    share = tmp_path / "prefix" / "share" / "mllm_kernel"
    assert (share / "cpu" / "sources").is_dir() == (cpu == "ON")
    assert (share / "cuda" / "sources").is_dir() == (cuda == "ON")
    assert (tmp_path / "prefix" / "include" / "mllm_kernel" / "tensor.hpp").is_file()


def test_ascend_on_stops_configure_with_a_clear_message(tmp_path):
    result = _cmake_install(tmp_path, "MLLM_KERNEL_BUILD_ASCEND=ON")
    assert result.returncode != 0
    assert "no Ascend backend" in result.stderr
    assert "MLLM_KERNEL_BUILD_ASCEND=OFF" in result.stderr


def test_pip_config_settings_override_an_option(tmp_path):
    wheel = _build_wheel(tmp_path, "MLLM_KERNEL_BUILD_CUDA=OFF")
    names = zipfile.ZipFile(wheel).namelist()
    assert "mllm_kernel/cpu/sources/add_constant.cpp" in names
    assert not any(n.startswith("mllm_kernel/cuda/sources/") for n in names)


@pytest.fixture
def site(tmp_path, wheel) -> Path:
    """The wheel unpacked into a private site dir beside the real tvm_ffi."""
    import tvm_ffi

    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    (site / "tvm_ffi").symlink_to(Path(tvm_ffi.__file__).parent)
    return site


def test_find_package_gives_headers_to_a_cmake_project(tmp_path, site):
    project = tmp_path / "consumer"
    project.mkdir()
    (project / "CMakeLists.txt").write_text(
        textwrap.dedent("""
        cmake_minimum_required(VERSION 3.21)
        project(Consumer LANGUAGES CXX)
        find_package(MllmKernel 0.1 REQUIRED)
        add_library(consumer SHARED consumer.cpp)
        target_link_libraries(consumer PRIVATE MllmKernel::headers)
    """)
    )
    (project / "consumer.cpp").write_text(
        textwrap.dedent("""
        #include <mllm_kernel/tensor.hpp>
        #include <tvm/ffi/function.h>
        static_assert(__cplusplus >= 202002L, "MllmKernel::headers must bring C++20");
        int64_t rank(tvm::ffi::TensorView x) {
          mllm_kernel::TensorMatcher().verify(x, "x");
          return x.ndim();
        }
        TVM_FFI_DLL_EXPORT_TYPED_FUNC(rank, rank);
    """)
    )
    config_dir = site / "mllm_kernel" / "share" / "cmake" / "MllmKernel"
    build = tmp_path / "build"
    configure = subprocess.run(
        ["cmake", "-S", str(project), "-B", str(build), f"-DMllmKernel_DIR={config_dir}"],
        capture_output=True,
        text=True,
    )
    assert configure.returncode == 0, configure.stdout + configure.stderr
    compiled = subprocess.run(["cmake", "--build", str(build)], capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr


def test_installed_copy_compiles_a_kernel_without_the_source_tree(tmp_path, site):
    script = textwrap.dedent("""
        import torch, mllm_kernel
        from mllm_kernel.jit_utils import paths
        assert mllm_kernel.__file__.startswith(SITE), mllm_kernel.__file__
        assert str(paths.include_dir()).startswith(SITE), paths.include_dir()
        from mllm_kernel.cpu.jit import add_constant
        x = torch.arange(6, dtype=torch.float32)
        assert torch.equal(add_constant(x, 4), x + 4)
        print("ok")
    """).replace("SITE", repr(str(site)))
    # -S: no .pth files, so an editable install of this checkout (README set-up
    # command 1), whose import hook would win over PYTHONPATH, stays out; the
    # private site comes first, then site-packages for torch.
    search_path = os.pathsep.join([str(site), *sitelib.getsitepackages()])
    env = {**os.environ, "PYTHONPATH": search_path, "MLLM_KERNEL_CACHE_DIR": str(tmp_path / "c")}
    result = subprocess.run(
        [sys.executable, "-S", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_installed_copy_serves_the_original_api(tmp_path, site):
    """Issue 13 on an installed copy: the original's path constants point into it, its
    registry functions work, and @jit builds from a source named as the original's ops
    name theirs (relative to the package's kernel sources)."""
    script = textwrap.dedent("""
        from pathlib import Path
        import torch, mllm_kernel
        from mllm_kernel.jit_utils import (
            MLLM_KERNEL_ASCEND_CSRC_DIR, MLLM_KERNEL_CPU_CSRC_DIR, MLLM_KERNEL_CPU_INCLUDE_DIR,
            MLLM_KERNEL_CUDA_CSRC_DIR, MLLM_KERNEL_INCLUDE_DIR, MLLM_KERNEL_TOP_PATH,
            clear_jit_kernel_registry, get_jit_kernel_registry, jit,
        )
        top = Path(SITE) / "mllm_kernel"
        assert MLLM_KERNEL_TOP_PATH == top, MLLM_KERNEL_TOP_PATH
        assert MLLM_KERNEL_INCLUDE_DIR == top / "include", MLLM_KERNEL_INCLUDE_DIR
        assert MLLM_KERNEL_CPU_CSRC_DIR == top / "cpu" / "sources", MLLM_KERNEL_CPU_CSRC_DIR
        assert (MLLM_KERNEL_CPU_CSRC_DIR / "add_constant.cpp").is_file()
        assert (MLLM_KERNEL_CUDA_CSRC_DIR / "store_cache.cu").is_file()
        assert (MLLM_KERNEL_CPU_INCLUDE_DIR / "parallel.hpp").is_file()
        assert MLLM_KERNEL_ASCEND_CSRC_DIR == top / "ascend" / "sources"

        @mllm_kernel.jit(
            args=4, device="cpu", cpp_files=["add_constant.cpp"],
            cpp_wrappers=[("add_constant", "mllm_kernel::cpu::add_constant<4>")],
            func_name="add_constant",
        )
        def _add_constant_4(compiled_module, dst, src):
            compiled_module.add_constant(dst, src, 1)

        x = torch.arange(6, dtype=torch.float32)
        out = torch.full_like(x, float("nan"))
        _add_constant_4(out, x)
        assert torch.equal(out, x + 4), out
        (info,) = get_jit_kernel_registry().values()
        assert info["export_name"] == "add_constant" and info["template_args"] == ("4",)
        clear_jit_kernel_registry()
        assert get_jit_kernel_registry() == {}
        print("ok")
    """).replace("SITE", repr(str(site)))
    search_path = os.pathsep.join([str(site), *sitelib.getsitepackages()])
    env = {**os.environ, "PYTHONPATH": search_path, "MLLM_KERNEL_CACHE_DIR": str(tmp_path / "c")}
    result = subprocess.run(
        [sys.executable, "-S", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_cmake_dir_of_an_editable_install(tmp_path, monkeypatch):
    import mllm_kernel
    from mllm_kernel.jit_utils import paths

    # An editable install: the code runs from the checkout, and what CMake installed
    # (the package config) lives in site-packages, another entry of __path__.
    checkout, site = tmp_path / "checkout" / "mllm_kernel", tmp_path / "site" / "mllm_kernel"
    checkout.mkdir(parents=True)
    monkeypatch.setattr(paths, "PACKAGE_DIR", checkout)
    monkeypatch.setattr(mllm_kernel, "__path__", [str(site), str(checkout)])
    assert paths.cmake_dir() is None
    config_dir = site / "share" / "cmake" / "MllmKernel"
    config_dir.mkdir(parents=True)
    (config_dir / "MllmKernelConfig.cmake").write_text("# installed by CMake\n")
    assert paths.cmake_dir() == config_dir


def test_scripts_point_at_nothing_outside_the_repository():
    scripts = sorted((REPO / "scripts").glob("*.sh"))
    assert scripts
    for script in scripts:
        text = script.read_text()
        assert "../" not in text, f"{script.name} refers to a path outside the repository"
        for named in re.findall(r"scripts/[\w.-]+\.sh", text):
            assert (REPO / named).is_file(), f"{script.name} names {named}, which is missing"
    assert "scripts/device_wheels.sh" in (REPO / "scripts" / "gpu_check.sh").read_text()
