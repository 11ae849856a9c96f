"""The raw runtime's signature parsing and host-value conversion: pure Python, no GPU."""

from __future__ import annotations

import numpy as np
import pytest

from mllm_kernel.cuda.runtime import host_arrays
from mllm_kernel.cuda.runtime.signature import kernel_params, parse_signature

EVERY_C_TYPE = [
    ("bool", "bool"),
    ("char", "int8"),
    ("signed char", "int8"),
    ("unsigned char", "uint8"),
    ("short", "int16"),
    ("unsigned short int", "uint16"),
    ("int", "int32"),
    ("signed", "int32"),
    ("unsigned", "uint32"),
    ("unsigned int", "uint32"),
    ("long", "int64"),
    ("long long int", "int64"),
    ("unsigned long", "uint64"),
    ("unsigned long long", "uint64"),
    ("int8_t", "int8"),
    ("int16_t", "int16"),
    ("int32_t", "int32"),
    ("int64_t", "int64"),
    ("uint8_t", "uint8"),
    ("uint16_t", "uint16"),
    ("uint32_t", "uint32"),
    ("uint64_t", "uint64"),
    ("std::int64_t", "int64"),
    ("size_t", "uint64"),
    ("ptrdiff_t", "int64"),
    ("half", "float16"),
    ("__half", "float16"),
    ("__nv_bfloat16", "bfloat16"),
    ("nv_bfloat16", "bfloat16"),
    ("float", "float32"),
    ("double", "float64"),
]


@pytest.mark.parametrize(("ctype", "kind"), EVERY_C_TYPE)
def test_every_scalar_type_by_value_and_by_pointer(ctype, kind):
    (scalar,) = parse_signature(f"{ctype} value")
    assert (scalar.name, scalar.ctype, scalar.kind, scalar.is_pointer) == (
        "value",
        ctype,
        kind,
        False,
    )
    (unnamed,) = parse_signature(ctype)
    assert (unnamed.name, unnamed.kind) == ("", kind)
    (pointer,) = parse_signature(f"const {ctype}* __restrict__ p")
    byte_pointer = ctype in ("char", "signed char", "unsigned char")
    assert pointer.kind == ("pointer" if byte_pointer else f"pointer:{kind}")
    assert (pointer.ctype, pointer.const, pointer.is_pointer) == (f"const {ctype}*", True, True)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("float* restrict out", ("out", "float*", "pointer:float32", False)),
        ("float* __restrict out", ("out", "float*", "pointer:float32", False)),
        ("float* const out", ("out", "float*", "pointer:float32", False)),  # const pointer
        ("volatile const int* flags", ("flags", "const int*", "pointer:int32", True)),
        ("void* raw", ("raw", "void*", "pointer", False)),
        ("float4* vec", ("vec", "float4*", "pointer", False)),  # unknown pointee: any dtype
        ("struct Params* params", ("params", "Params*", "pointer", False)),
        ("float rows[]", ("rows", "float*", "pointer:float32", False)),
    ],
)
def test_qualifiers_and_pointees(text, expected):
    (param,) = parse_signature(text)
    assert (param.name, param.ctype, param.kind, param.const) == expected


def test_labels_name_parameters_by_name_or_position():
    named = parse_signature("(const float* x, int n)")
    assert [p.label for p in named] == ["argument 'x' (const float*)", "argument 'n' (int)"]
    unnamed = parse_signature("const float*, float*, int")
    assert [p.label for p in unnamed] == [
        "argument 0 (const float*)",
        "argument 1 (float*)",
        "argument 2 (int)",
    ]
    assert parse_signature("") == () == parse_signature("void")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("float** rows", "parameter 'rows' (float**) is a pointer to pointer"),
        ("const int* const* table", "is a pointer to pointer"),
        ("float4 v", "parameter 'v' (float4) is passed by value, but the runtime passes only"),
        ("const CUtensorMap map", "is passed by value"),
        ("int& n", "is a reference: kernels take pointers"),
        ("int n = 4", "has a default value"),
        ("Tensor<float, 2> t", "templates are out of scope"),
        ("int a, , int b", "parameter 1 is empty"),
    ],
)
def test_parameters_the_runtime_cannot_pass(text, message):
    with pytest.raises(ValueError, match=r"^signature: ") as info:
        parse_signature(text)
    assert message in str(info.value)


def test_signature_must_be_text():
    with pytest.raises(TypeError, match="signature must be a str"):
        parse_signature(["float*"])


SOURCE = r"""
#include <cuda_fp16.h>
#define NOT_A_KERNEL __global__ void hidden(int);
// extern "C" __global__ void in_a_comment(int x) {}
/* extern "C" __global__ void in_a_block_comment(int x) {} */
template <typename T>
__global__ void templated(T* x) {}

extern "C" {
__global__ void __launch_bounds__(256) in_block(const float* __restrict__ a, /* b: */ half* b,
                                                int n) {}
}

extern "C" __global__ void declared_then_defined(int64_t n);
extern "C" __global__ void declared_then_defined(int64_t n) {}
extern "C" __global__ void declared_unnamed(const float*, int);
extern "C" __global__ void declared_unnamed(const float* x, int n) {}

extern "C" __global__ void overloaded(int a) {}
extern "C" __global__ void overloaded(float a) {}

__global__ void mangled(float* x) {}

extern "C" __global__ void no_params() {}
"""


def test_kernel_params_from_declarations():
    params = kernel_params(SOURCE, "in_block", "k.cu")
    assert [(p.name, p.kind, p.const) for p in params] == [
        ("a", "pointer:float32", True),
        ("b", "pointer:float16", False),
        ("n", "int32", False),
    ]
    assert [p.kind for p in kernel_params(SOURCE, "declared_then_defined")] == ["int64"]
    assert kernel_params(SOURCE, "no_params") == ()
    # Before: a forward declaration without names was taken for an overload.
    unnamed = kernel_params(SOURCE, "declared_unnamed")
    assert [(p.name, p.kind, p.const) for p in unnamed] == [
        ("x", "pointer:float32", True),
        ("n", "int32", False),
    ]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("templated", r"^k\.cu:7: kernel 'templated' is a template; .*templates are out of scope"),
        (
            "overloaded",
            r"^k\.cu:19: kernel 'overloaded' is overloaded or declared twice with different "
            r"parameters \(lines 19, 20;.*pass signature='...' to compile_kernel",
        ),
        ("mangled", r"^k\.cu:22: kernel 'mangled' is not declared extern \"C\""),
        (
            "in_a_comment",
            r"^k\.cu: no extern \"C\" __global__ kernel named 'in_a_comment' \(kernels found: "
            r"declared_then_defined, declared_unnamed, in_block, no_params, overloaded\)",
        ),
        ("hidden", r"kernel named 'hidden'.*pass signature="),
    ],
)
def test_kernels_the_runtime_cannot_launch(name, message):
    with pytest.raises(ValueError, match=message):
        kernel_params(SOURCE, name, "k.cu")


def test_host_values_become_native_module_values():
    params = parse_signature("float a, bool b, int n, int8_t c")
    staged = host_arrays.stage(
        (np.float32(1.5), np.bool_(True), np.int64(7), np.array(3)), params, None
    )
    assert staged.args == (1.5, True, 7, 3)
    assert all(type(v) in (float, bool, int) for v in staged.args)
    assert staged.copy_back == []


def test_nothing_to_convert_leaves_the_error_standing():
    params = parse_signature("float a, int n")
    assert host_arrays.stage((1.5, "seven"), params, None) is None
    assert host_arrays.stage((1.5,), params, None) is None  # wrong count: its error stands


def test_stream_objects_become_handles():
    class CupyLikeStream:
        ptr = 1234

    class ProtocolStream:
        def __cuda_stream__(self):
            return (0, 5678)

    assert host_arrays.stream_handle(CupyLikeStream()) == 1234
    assert host_arrays.stream_handle(ProtocolStream()) == 5678
    assert host_arrays.stream_handle(None) is None
    assert host_arrays.stream_handle(42) == 42
    with pytest.raises(TypeError, match=r"stream must be a torch\.cuda\.Stream.*got str"):
        host_arrays.stream_handle("default")
    staged = host_arrays.stage((1.0,), parse_signature("float a"), CupyLikeStream())
    assert (staged.args, staged.stream) == ((1.0,), 1234)
