"""A user's own kernel, written as the README's example (issue 30, points 7 and 10): a
wrapper that does not compile leads with the user's expression and the declaration it
names, never with the deleted generated file; a call with the wrong kind of argument
names the C++ parameter and says what to pass."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import tvm_ffi

from mllm_kernel.jit_utils import (
    KernelBuildError,
    load_cpu_jit,
    load_cuda_jit,
    make_cpp_args,
    registry,
)
from mllm_kernel.jit_utils.cuda_arch import cuda_arch_override

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "examples" / "custom_kernel" / "my_kernel.cpp"
DECLARATION = (
    "template <int kScale> void my_kernel(tvm::ffi::TensorView out, tvm::ffi::TensorView x)"
)


def _template_line(path: Path) -> int:
    lines = path.read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if line.startswith("template <int kScale>"))


@pytest.fixture(autouse=True)
def _forget_user_kernels():
    """Loading records the module in the registry; later show-config tests must not see it."""
    yield
    for name, device in (("my_kernel", "cpu"), ("scale_cu", "cuda")):
        registry.unregister(name, device)


def _load(*template_args, expression: str | None = None):
    args = make_cpp_args(*template_args)
    return load_cpu_jit(
        "my_kernel",
        *args,
        cpp_files=[SOURCE],
        cpp_wrappers=[("my_kernel", expression or f"my_namespace::my_kernel<{args}>")],
    )


# ------------------------------------------------------------------ point 7: build errors
def test_a_wrong_template_argument_leads_with_the_wrapper_and_the_declaration(fresh_cache):
    # Before: ".staging/.../main.cpp:5: 'decltype' cannot resolve address of overloaded
    # function", a file deleted with its staging directory; the expression only in the log.
    with pytest.raises(KernelBuildError) as info:
        _load(torch.float32)  # the template takes an int
    lead, declared, *rest = str(info.value).splitlines()
    assert lead.startswith(
        "wrapper 'my_kernel' = my_namespace::my_kernel<fp32_t> (cpp_wrappers) does not compile: "
    )
    assert ".staging" not in lead and "main.cpp" not in lead
    assert info.value.first_error == lead
    assert (
        declared == f"  my_kernel is declared at {SOURCE}:{_template_line(SOURCE)}: {DECLARATION}"
    )
    assert rest[0] == "  while building module 'my_kernel' with template args <fp32_t> (cpu)"
    assert "make_cpp_args(3)" in info.value.hint and "make_cpp_args(torch.float32)" in (
        info.value.hint
    )
    log = Path(info.value.log_path).read_text()
    assert "--- generated main.cpp" in log
    assert "TVM_FFI_DLL_EXPORT_TYPED_FUNC(my_kernel, (my_namespace::my_kernel<fp32_t>));" in log


def test_a_misspelt_function_says_no_declaration_was_found(fresh_cache):
    with pytest.raises(KernelBuildError) as info:
        _load(3, expression="my_namespace::my_kernell<3>")
    lead, context = str(info.value).splitlines()[:2]
    assert lead.startswith("wrapper 'my_kernel' = my_namespace::my_kernell<3> (cpp_wrappers)")
    assert context == f"  no declaration of 'my_kernell' was found in {SOURCE}"


@pytest.mark.nvcc
def test_a_wrong_template_argument_in_a_cuda_wrapper(fresh_cache, tmp_path):
    source = tmp_path / "scale.cu"
    source.write_text(
        "#include <tvm/ffi/container/tensor.h>\n"
        "namespace cu {\n"
        "template <int N>\n"
        "void scale(tvm::ffi::TensorView out, tvm::ffi::TensorView x) {}\n"
        "}\n"
    )
    with cuda_arch_override("9.0a"), pytest.raises(KernelBuildError) as info:
        load_cuda_jit(
            "scale_cu",
            "fp32_t",
            cuda_files=[source],
            cuda_wrappers=[("scale", "cu::scale<fp32_t>")],
        )
    lead, declared = str(info.value).splitlines()[:2]
    assert lead.startswith("wrapper 'scale' = cu::scale<fp32_t> (cuda_wrappers) does not compile: ")
    assert ".staging" not in lead
    assert declared == (
        f"  scale is declared at {source}:3: "
        "template <int N> void scale(tvm::ffi::TensorView out, tvm::ffi::TensorView x)"
    )


# -------------------------------------------------------------- point 10: argument errors
@pytest.fixture
def my_kernel(fresh_cache):
    return _load(3)


def test_a_list_argument_names_the_parameter_and_what_to_pass(my_kernel):
    # Before: "Mismatched type on argument #1 when calling: `my_kernel(0: DLTensor*, 1:
    # DLTensor*) -> void`. Expected `DLTensor*` but got `ffi.Array`".
    out = torch.empty(3)
    with pytest.raises(TypeError) as info:
        my_kernel.my_kernel(out, [1.0, 2.0, 3.0])
    first, context = str(info.value).splitlines()
    assert first == (
        "my_kernel(out, x): argument 'x' (the 2nd, C++ tvm::ffi::TensorView) must be a tensor, "
        "got list. Pass a torch.Tensor (torch.tensor(...) or torch.as_tensor(...) make one of "
        "a list) or another DLPack array (numpy, cupy, jax)."
    )
    assert context == (
        "  my_kernel of module 'my_kernel' wraps my_namespace::my_kernel<3>, declared at "
        f"{SOURCE}:{_template_line(SOURCE)}: {DECLARATION}"
    )
    with pytest.raises(TypeError, match=r"^my_kernel\(out, x\): argument 'out' \(the 1st, "):
        my_kernel.my_kernel(None, out)
    with pytest.raises(TypeError, match=r"^my_kernel\(out, x\) takes 2 argument\(s\), got 1"):
        my_kernel.my_kernel(out)


def test_the_kernels_own_errors_and_results_are_unchanged(my_kernel):
    x = torch.arange(4, dtype=torch.float32)
    out = torch.empty_like(x)
    my_kernel.my_kernel(out, x)
    torch.testing.assert_close(out, x * 3)
    with pytest.raises(TypeError, match=r"^argument 'x': expected dtype in \{float32\}"):
        my_kernel.my_kernel(out, x.double())  # the C++ check's own message
    assert isinstance(my_kernel, tvm_ffi.Module)
    assert isinstance(my_kernel.get_function("my_kernel"), tvm_ffi.Function)


def test_the_package_loader_path_hands_out_bare_tvm_ffi_functions(my_kernel):
    # The package's own ops load through load_spec (kernel_module.Exports): no wrapper
    # on their calls. Only load_cpu_jit / load_cuda_jit explain argument errors.
    from mllm_kernel.jit_utils import loader

    spec = loader.cpu_spec(
        "my_kernel",
        "3",
        cpp_files=[SOURCE],
        cpp_wrappers=[("my_kernel", "my_namespace::my_kernel<3>")],
    )
    assert type(loader.load_spec(spec).my_kernel) is tvm_ffi.Function
    assert type(my_kernel.my_kernel) is not tvm_ffi.Function


# ----------------------------------------------------- reading declarations (no compiler)
def test_declarations_are_found_through_quoted_includes_and_calls_are_skipped(tmp_path):
    from mllm_kernel.jit_utils.cpp_declarations import find_declarations, function_name

    header = tmp_path / "detail" / "kernels.h"
    header.parent.mkdir()
    header.write_text(
        "namespace ns {\n"
        "// template <int N> void f(int x);  a comment, not a declaration\n"
        "template <typename T,\n"
        "          int N = sizeof(T)>\n"
        "static inline void f(tvm::ffi::TensorView out, const T* x, int64_t n = 4) {\n"
        "  return g(f(out, x));\n"
        "}\n"
        "}\n"
    )
    source = tmp_path / "main.cpp"
    source.write_text('#include "detail/kernels.h"\nauto y = ns::f(3);\n')
    (found,) = find_declarations(function_name("ns::f<float, 4>"), [source])
    assert found.where() == f"{header.resolve()}:3"
    assert found.text == (
        "template <typename T, int N = sizeof(T)> static inline void f(tvm::ffi::TensorView "
        "out, const T* x, int64_t n = 4)"
    )
    assert [(p.type, p.name) for p in found.parameters] == [
        ("tvm::ffi::TensorView", "out"),
        ("const T*", "x"),
        ("int64_t", "n"),
    ]
    assert function_name("[](int x) { return x; }") is None
