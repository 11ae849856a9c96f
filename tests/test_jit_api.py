"""make_cpp_args, cache_once, CUDA arch selection, toolchain discovery, the registry."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import write_script

from mllm_kernel.jit_utils import (
    CudaArchError,
    ToolchainError,
    cache_once,
    cuda_arch_override,
    make_cpp_args,
    registry,
    toolchain,
)
from mllm_kernel.jit_utils.cuda_arch import (
    CudaArch,
    arch_for_capability,
    gencode_flags,
    parse_arch_list,
    resolve_cuda_archs,
)
from mllm_kernel.jit_utils.spec import BuildSpec, Wrapper


# --------------------------------------------------------------------------- make_cpp_args
def test_make_cpp_args_example_from_the_docs():
    args = make_cpp_args(16, torch.float16)
    assert args == ["16", "fp16_t"]
    assert str(args) == "16, fp16_t"
    assert f"k<{args}>" == "k<16, fp16_t>"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (True, "true"),
        (False, "false"),
        (0, "0"),
        (-7, "-7"),
        (2**31, "2147483648LL"),
        (2**63, "9223372036854775808ULL"),
        (1.5, "1.5"),
        (1e-07, "1e-07"),
        (2.0, "2.0"),
        (float("inf"), "__builtin_huge_val()"),
        (torch.float32, "fp32_t"),
        (torch.float16, "fp16_t"),
        (torch.bfloat16, "bf16_t"),
        (torch.float64, "fp64_t"),
        (torch.bool, "bool_t"),
        (torch.int8, "int8_t"),
        (torch.int64, "int64_t"),
        (torch.uint8, "uint8_t"),
        (torch.float8_e4m3fn, "fp8_e4m3_t"),
        ("my_ns::Op", "my_ns::Op"),
        ("::std::plus", "::std::plus"),
    ],
)
def test_make_cpp_args_values(value, text):
    assert make_cpp_args(value) == [text]


@pytest.mark.parametrize(
    "bad", ["a b", "f()", "x; system(1)", "1abc", "ns::", "a<b>", "", "x\ny", "a-b"]
)
def test_make_cpp_args_rejects_strings_that_are_not_names(bad):
    with pytest.raises(ValueError, match="not a C\\+\\+ identifier") as info:
        make_cpp_args(bad)
    assert repr(bad) in str(info.value)


@pytest.mark.parametrize("bad", [None, [1], object(), b"x", 1j])
def test_make_cpp_args_rejects_other_objects(bad):
    with pytest.raises(TypeError, match="cannot turn"):
        make_cpp_args(bad)


def test_make_cpp_args_rejects_huge_ints():
    with pytest.raises(ValueError, match="64 bits"):
        make_cpp_args(2**64)


# --------------------------------------------------------------------------- cache_once
def test_cache_once_builds_each_key_once_across_threads():
    calls: list[int] = []

    @cache_once
    def slow(x, *, scale=1):
        calls.append(x)
        time.sleep(0.05)
        return x * scale

    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(slow(3, scale=2))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [6] * 8
    assert calls == [3]
    assert slow(3, scale=3) == 9 and calls == [3, 3]
    assert slow(3) == 3 and calls == [3, 3, 3]


def test_cache_once_does_not_cache_exceptions_and_rejects_unhashable():
    attempts = []

    @cache_once
    def flaky(x):
        attempts.append(x)
        if len(attempts) == 1:
            raise RuntimeError("first try fails")
        return x

    with pytest.raises(RuntimeError):
        flaky(1)
    assert flaky(1) == 1 and flaky(1) == 1
    assert attempts == [1, 1]
    with pytest.raises(TypeError, match="hashable"):
        flaky([1])


def test_cache_once_tells_equal_arguments_of_other_types_apart():
    """1, 1.0 and True are one dict key, but three template arguments to make_cpp_args
    (``1``, ``1.0``, ``true``): each must get its own module, positional or keyword."""
    calls = []

    @cache_once
    def spelled(value, *, other=0):
        calls.append((value, other))
        return f"{make_cpp_args(value)}, {make_cpp_args(other)}"

    assert [spelled(v) for v in (1, 1.0, True, 1)] == ["1, 0", "1.0, 0", "true, 0", "1, 0"]
    assert [spelled(0, other=v) for v in (0, 0.0, False)] == ["0, 0", "0, 0.0", "0, false"]
    assert len(calls) == 6


def test_cache_once_clear_and_uncached():
    calls = []

    @cache_once
    def f(x):
        calls.append(x)
        return x

    f(1)
    f.cache_clear()
    f(1)
    assert calls == [1, 1]
    assert f.uncached(5) == 5


# --------------------------------------------------------------------------- CUDA arch
@pytest.mark.parametrize(
    ("text", "archs"),
    [
        ("9.0a", [CudaArch(9, 0, "a")]),
        ("90a", [CudaArch(9, 0, "a")]),
        ("sm_90a", [CudaArch(9, 0, "a")]),
        ("8.0;9.0a", [CudaArch(8, 0), CudaArch(9, 0, "a")]),
        ("8.6 9.0+PTX", [CudaArch(8, 6), CudaArch(9, 0, "", True)]),
        ("100a,120", [CudaArch(10, 0, "a"), CudaArch(12, 0)]),
    ],
)
def test_parse_arch_list(text, archs):
    assert list(parse_arch_list(text)) == archs


@pytest.mark.parametrize("bad", ["", "hopper", "9", "sm_9x"])
def test_parse_arch_list_rejects_garbage(bad):
    with pytest.raises(CudaArchError):
        parse_arch_list(bad)


def test_gencode_flags_for_hopper_and_ptx():
    assert gencode_flags(parse_arch_list("9.0a")) == ["-gencode=arch=compute_90a,code=sm_90a"]
    assert gencode_flags(parse_arch_list("8.0+PTX")) == [
        "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_80,code=compute_80",
    ]


def test_capability_to_arch_adds_a_suffix_from_hopper_on():
    assert str(arch_for_capability(9, 0)) == "9.0a"
    assert str(arch_for_capability(10, 0)) == "10.0a"
    assert str(arch_for_capability(8, 9)) == "8.9"


@pytest.fixture
def no_arch_env(monkeypatch):
    monkeypatch.delenv("MLLM_KERNEL_CUDA_ARCH_LIST", raising=False)
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)


def test_arch_precedence(no_arch_env, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None: (9, 0))
    assert resolve_cuda_archs() == (CudaArch(9, 0, "a"),)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")
    assert resolve_cuda_archs() == (CudaArch(8, 0),)
    monkeypatch.setenv("MLLM_KERNEL_CUDA_ARCH_LIST", "8.9")
    assert resolve_cuda_archs() == (CudaArch(8, 9),)
    with cuda_arch_override("10.0a"):
        assert resolve_cuda_archs() == (CudaArch(10, 0, "a"),)
    assert resolve_cuda_archs() == (CudaArch(8, 9),)


def test_choose_cuda_archs_says_where_the_archs_came_from(no_arch_env, monkeypatch):
    from mllm_kernel.jit_utils.cuda_arch import choose_cuda_archs

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None: (8, 6))
    assert choose_cuda_archs() == ((CudaArch(8, 6),), "GPU 1 (compute capability 8.6)")
    assert choose_cuda_archs(0) == ((CudaArch(8, 6),), "GPU 0 (compute capability 8.6)")
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a")
    assert choose_cuda_archs() == ((CudaArch(9, 0, "a"),), "$TORCH_CUDA_ARCH_LIST")
    with cuda_arch_override("8.0"):
        assert choose_cuda_archs() == ((CudaArch(8, 0),), "override (--arch)")


def test_no_gpu_and_no_arch_is_a_clear_error_not_a_default(no_arch_env, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(CudaArchError, match="MLLM_KERNEL_CUDA_ARCH_LIST"):
        resolve_cuda_archs()


def test_bad_arch_env_names_the_variable(no_arch_env, monkeypatch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "hopper")
    with pytest.raises(CudaArchError, match=r"\$TORCH_CUDA_ARCH_LIST"):
        resolve_cuda_archs()


# --------------------------------------------------------------------------- toolchain


def test_follow_wrapper_reaches_the_real_executable(tmp_path):
    real = write_script(tmp_path / "real-nvcc", "#!/bin/sh\necho real\n")
    (tmp_path / "bin").mkdir()
    inner = write_script(tmp_path / "bin" / "inner", f'#!/bin/sh\nexec "{real}" "$@"\n')
    outer = write_script(tmp_path / "outer", f'#!/bin/sh\n# wrapper\nexec {inner} "$@"\n')
    link = tmp_path / "link"
    link.symlink_to(outer)
    # real-nvcc is itself a script without an exec line: the chain stops there.
    assert toolchain.follow_wrapper(link) == real.resolve()


def _fake_toolkit(root: Path, lib: str) -> Path:
    (root / "bin").mkdir(parents=True)
    write_script(root / "bin" / "nvcc", "#!/bin/sh\necho 'Cuda compilation tools, release 99.9'\n")
    (root / lib).mkdir()
    (root / lib / "libcudart.so").write_bytes(b"")
    return root


@pytest.mark.parametrize("lib", ["lib", "lib64"])
def test_cuda_home_with_lib_or_lib64(tmp_path, monkeypatch, reset_toolchain, lib):
    home = _fake_toolkit(tmp_path / "cuda", lib)
    monkeypatch.setenv("CUDA_HOME", str(home))
    found = toolchain.find_cuda()
    assert found.home == home and found.lib_dir == home / lib
    assert found.nvcc.path == home / "bin" / "nvcc"


def test_nvcc_on_path_through_a_wrapper(tmp_path, monkeypatch, reset_toolchain):
    home = _fake_toolkit(tmp_path / "cuda-99", "lib")
    wrappers = tmp_path / "wrappers"
    wrappers.mkdir()
    write_script(wrappers / "nvcc", f'#!/bin/sh\nexec {home}/bin/nvcc "$@"\n')
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", f"{wrappers}:/usr/bin:/bin")
    assert toolchain.find_cuda().home == home


def test_wrong_cuda_home_is_an_error_that_says_where_it_looked(
    tmp_path, monkeypatch, reset_toolchain
):
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nowhere"))
    with pytest.raises(ToolchainError, match=r"nowhere \(\$CUDA_HOME\): no bin/nvcc"):
        toolchain.find_cuda()


def test_toolkit_without_cudart_is_reported(tmp_path, monkeypatch, reset_toolchain):
    home = _fake_toolkit(tmp_path / "cuda", "lib")
    (home / "lib" / "libcudart.so").unlink()
    monkeypatch.setenv("CUDA_HOME", str(home))
    with pytest.raises(ToolchainError, match=r"no libcudart\.so in lib64/ or lib/"):
        toolchain.find_cuda()


def test_missing_cxx_is_a_toolchain_error(monkeypatch, reset_toolchain):
    monkeypatch.setenv("CXX", "/definitely/not/a/compiler")
    with pytest.raises(ToolchainError, match="CXX"):
        toolchain.find_cxx()


# --------------------------------------------------------------------------- spec & registry
def test_only_requested_wrappers_are_emitted():
    spec = BuildSpec(
        name="only_cuda",
        device="cuda",
        template_args=(),
        cuda_wrappers=(Wrapper("run", "ns::run<1, 2>"),),
    )
    units = spec.translation_units()
    assert list(units) == ["main.cu"]
    assert "TVM_FFI_DLL_EXPORT_TYPED_FUNC(run, (ns::run<1, 2>));" in units["main.cu"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cpp_wrappers": ()}, "exports nothing"),
        ({"cpp_wrappers": (Wrapper("a", "f"), Wrapper("a", "g"))}, "more than once"),
        ({"name": "bad name", "cpp_wrappers": (Wrapper("a", "f"),)}, "C identifier"),
    ],
)
def test_bad_specs_are_rejected(kwargs, message):
    base = {"name": "m", "device": "cpu", "template_args": ()}
    with pytest.raises(ValueError, match=message):
        BuildSpec(**{**base, **kwargs})


def test_bad_wrapper_export_name():
    with pytest.raises(ValueError, match="not a C identifier"):
        Wrapper("my-export", "f")


def test_builtin_kernels_are_registered_before_any_call():
    names = {(e.name, e.device) for e in registry.kernels()}
    assert ("add_constant", "cpu") in names


def test_entry_spec_returns_the_spec_without_building(fresh_cache):
    (entry,) = [e for e in registry.kernels("cpu") if e.name == "add_constant"]
    spec = entry.spec((4,))
    assert spec.template_args == ("4",) and spec.device == "cpu"
    status = registry.variant_status(entry, (4,))
    assert status.status == "not built"
    assert status.path is not None and status.path.parent == fresh_cache
    assert not fresh_cache.exists() or not any(fresh_cache.iterdir())


def test_register_kernel_refuses_a_device_it_cannot_build_for():
    with pytest.raises(ValueError, match=r"device must be one of \('cpu', 'cuda'\), got 'gpu'"):
        registry.register_kernel("on_gpu", device="gpu")
    assert registry.find("on_gpu", "gpu") is None


def test_logging_set_up_lives_in_jit_utils_not_at_the_package_top():
    import importlib.util

    from mllm_kernel.jit_utils import logging_setup, use_application_logging

    assert importlib.util.find_spec("mllm_kernel.logging_setup") is None
    assert use_application_logging is logging_setup.use_application_logging


def test_the_loaders_return_a_typed_tvm_ffi_module(tmp_path):
    import typing

    import tvm_ffi

    from mllm_kernel.jit_utils import load_cpu_jit, load_cuda_jit

    for load in (load_cpu_jit, load_cuda_jit):
        assert typing.get_type_hints(load)["return"] is tvm_ffi.Module
    source = tmp_path / "seven.cpp"
    source.write_text("namespace seven { int f() { return 7; } }\n")
    try:
        module = load_cpu_jit("seven", cpp_files=[str(source)], cpp_wrappers=[("f", "seven::f")])
        assert isinstance(module, tvm_ffi.Module) and module.f() == 7
    finally:
        registry.unregister("seven", "cpu")  # later show-config tests must not see it
