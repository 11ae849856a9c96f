"""The C++ checks of include/mllm_kernel/{tensor,rows,utils}.hpp, through a test kernel."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from mllm_kernel.jit_utils import cache_once, load_cpu_jit

SOURCE = Path(__file__).parent / "csrc" / "tensor_checks.cpp"
EXPORTS = [
    "row_dot",
    "rows_and_shapes",
    "row_stride",
    "fixed_strides",
    "needs_cuda",
    "any_rank",
    "runtime_check",
    "value_check",
    "panic",
    "round_trip_fp16",
    "round_trip_bf16",
    "widen_fp16",
    "write_beside",
]
LOCATION = re.compile(r"\[at .*tensor_checks\.cpp:\d+\]")


@cache_once
def _module():
    return load_cpu_jit(
        "tensor_checks",
        cpp_files=[str(SOURCE)],
        cpp_wrappers=[(name, f"check_kernels::{name}") for name in EXPORTS],
    )


@pytest.fixture(scope="module")
def mod():
    return _module()


def _reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x.double() * w.double()).sum(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (16, 33)])
def test_row_dot_matches_reference(mod, dtype, shape):
    torch.manual_seed(0)
    x = torch.randn(shape).to(dtype)
    w = torch.randn(shape[1]).to(dtype)
    out = torch.full((shape[0],), float("nan"))
    mod.row_dot(out, x, w)
    torch.testing.assert_close(out.double(), _reference(x, w), rtol=1e-3, atol=1e-3)


def test_strided_rows_are_read_with_their_stride(mod):
    torch.manual_seed(1)
    base = torch.randn(5, 12)
    x = base[:, 2:9]  # row stride 12, last dim contiguous
    w = torch.randn(7)
    out = torch.full((5,), float("nan"))
    mod.row_dot(out, x, w)
    torch.testing.assert_close(out.double(), _reference(x, w), rtol=1e-5, atol=1e-5)


def test_dtype_error_is_type_error_naming_argument_and_location(mod):
    x, w, out = torch.randn(2, 3).double(), torch.randn(3).double(), torch.empty(2)
    with pytest.raises(TypeError) as info:
        mod.row_dot(out, x, w)
    message = str(info.value)
    assert "argument 'x'" in message
    assert "float32, float16" in message and "float64" in message
    assert LOCATION.search(message), message


def test_shared_symbolic_size_mismatch_names_both_arguments(mod):
    x, w, out = torch.randn(2, 3), torch.randn(4), torch.empty(2)
    with pytest.raises(ValueError) as info:
        mod.row_dot(out, x, w)
    message = str(info.value)
    assert "argument 'w'" in message and "hidden" in message and "'x'" in message
    assert "to be 3" in message and "got 4" in message
    assert LOCATION.search(message)


def test_dtype_bound_by_another_argument_names_it(mod):
    x, w, out = torch.randn(2, 3), torch.randn(3).half(), torch.empty(2)
    with pytest.raises(
        TypeError, match=r"^argument 'w': expected dtype float32 as in 'x' but got float16 \[at "
    ):
        mod.row_dot(out, x, w)


def test_rows_share_their_length(mod):
    x, out, half = torch.randn(2, 3, 8), torch.empty(2, 3, 8), torch.empty(2, 3, 4)
    mod.rows_and_shapes(x, torch.randn(5, 8)[:, :8], out, half)
    with pytest.raises(
        ValueError,
        match=r"^argument 'y': expected rows of cols=8 elements \(the last dim\) as in 'x' but "
        r"got shape \[5, 7\]",
    ):
        mod.rows_and_shapes(x, torch.randn(5, 7), out, half)
    with pytest.raises(ValueError, match=r"^argument 'x': expected at least 1 dim, got a scalar"):
        mod.rows_and_shapes(torch.tensor(1.0), torch.randn(1), out, half)
    with pytest.raises(ValueError, match=r"^argument 'y': expected stride 1 in the last dim"):
        mod.rows_and_shapes(x, torch.randn(8, 5).t(), out, half)


def test_same_shape_as_prints_the_expected_shape(mod):
    x, y = torch.randn(2, 3, 8), torch.randn(8)
    with pytest.raises(
        ValueError,
        match=r"^argument 'out': expected shape \[2, 3, 8\] \(the shape of 'x'\) but got "
        r"\[2, 8\]",
    ):
        mod.rows_and_shapes(x, y, torch.empty(2, 8), torch.empty(2, 3, 4))
    with pytest.raises(
        ValueError,
        match=r"^argument 'half_out': expected shape \[2, 3, 4\] \(the shape of 'x' with the "
        r"last dim replaced\) but got \[2, 3, 8\]",
    ):
        mod.rows_and_shapes(x, y, torch.empty(2, 3, 8), torch.empty(2, 3, 8))


def test_as_rows_collapses_leading_dims_into_one_stride(mod):
    assert mod.row_stride(torch.empty(3, 4)) == 4
    assert mod.row_stride(torch.empty(3, 10)[:, 2:6]) == 10
    assert mod.row_stride(torch.empty(1, 1, 5)) == 5  # a single row
    assert mod.row_stride(torch.empty(3, 2, 4).transpose(0, 1)[:1]) == 8
    with pytest.raises(
        ValueError,
        match=r"^argument 'x': its leading dims must collapse into one evenly strided row "
        r"index, but shape \[4, 3, 6\] has strides \[30, 6, 1\]",
    ):
        mod.row_stride(torch.empty(4, 5, 6)[:, :3])


def test_rank_mismatch(mod):
    x, w, out = torch.randn(2, 3, 1), torch.randn(3), torch.empty(2)
    with pytest.raises(ValueError, match=r"argument 'x': expected 2 dims .* got 3 dims"):
        mod.row_dot(out, x, w)


def test_last_dim_contiguity(mod):
    x = torch.randn(3, 2).t()  # [2, 3] with last-dim stride 2
    with pytest.raises(ValueError, match=r"argument 'x': expected stride 1 in the last dim"):
        mod.row_dot(torch.empty(2), x, torch.randn(3))


def test_contiguous_required(mod):
    w = torch.randn(6)[::2]
    with pytest.raises(ValueError, match=r"argument 'w': expected a contiguous tensor"):
        mod.row_dot(torch.empty(2), torch.randn(2, 3), w)


def test_literal_dims_and_strides(mod):
    mod.fixed_strides(torch.empty(3, 4))
    with pytest.raises(ValueError, match=r"argument 'x': expected dim 1 to be 4 but got 5"):
        mod.fixed_strides(torch.empty(3, 5))
    with pytest.raises(ValueError, match=r"argument 'x': expected stride 0 to be 4 but got 8"):
        mod.fixed_strides(torch.empty(3, 8)[:, :4])


def test_device_type_mismatch(mod):
    with pytest.raises(
        ValueError, match=r"argument 'x': expected a tensor on cuda.*got one on cpu"
    ):
        mod.needs_cuda(torch.empty(1))


def test_empty_matcher_accepts_anything(mod):
    assert mod.any_rank(torch.empty(())) == 0
    assert mod.any_rank(torch.empty(2, 0, 3, dtype=torch.int8)) == 3


def test_runtime_check_value_check_and_panic(mod):
    mod.runtime_check(1)
    with pytest.raises(RuntimeError, match=r"value must be >= 0, got -3 \[at .*:\d+\]"):
        mod.runtime_check(-3)
    mod.value_check(2)
    with pytest.raises(ValueError, match=r"value must be even, got 3"):
        mod.value_check(3)
    with pytest.raises(RuntimeError, match=r"panic with code 7 \[at .*tensor_checks\.cpp:\d+\]"):
        mod.panic(7)


def _special_floats() -> torch.Tensor:
    torch.manual_seed(2)
    values = [0.0, -0.0, 1.0, -2.5, 65504.0, 65520.0, 1e-8, 6e-8, 3e-5, 1e30, -1e30]
    values += [float("inf"), float("-inf")]
    return torch.cat([torch.tensor(values), torch.randn(1000) * 100, torch.randn(100) * 1e-6])


@pytest.mark.parametrize(
    ("export", "dtype"), [("round_trip_fp16", torch.float16), ("round_trip_bf16", torch.bfloat16)]
)
def test_host_half_conversions_round_like_torch(mod, export, dtype):
    x = _special_floats()
    out = torch.empty(x.shape, dtype=dtype)
    getattr(mod, export)(out, x)
    assert torch.equal(out.view(torch.int16), x.to(dtype).view(torch.int16))


def test_host_half_widening_is_exact(mod):
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    x = bits.view(torch.float16)
    out = torch.empty(x.shape, dtype=torch.float32)
    mod.widen_fp16(out, x)
    expected = x.float()
    finite = ~torch.isnan(expected)
    assert torch.equal(out[finite], expected[finite])
    assert torch.isnan(out[~finite]).all()


def _fused(tokens=5, heads=3, dim=8):
    """A fused [T, 3 H D] projection buffer with row padding (a slice of a wider one)."""
    return torch.randn(tokens, 3 * heads * dim + 4)[:, : 3 * heads * dim]


@pytest.mark.parametrize(
    "views",
    [
        # q and k as [T, H, D] views of their column blocks
        lambda qkv: (qkv[:, :24].view(5, 3, 8), qkv[:, 24:48].view(5, 3, 8)),
        # the same blocks through a [T, 3, H, D] view
        lambda qkv: (qkv.view(5, 3, 3, 8)[:, 0], qkv.view(5, 3, 3, 8)[:, 2]),
        # a KV cache [slots, 2, H, D] split into its K and V halves
        lambda qkv: (qkv[:, :48].view(5, 2, 3, 8)[:, 0], qkv[:, :48].view(5, 2, 3, 8)[:, 1]),
        # column blocks of one row-major buffer, 2-D
        lambda qkv: (qkv[:, :24], qkv[:, 24:48]),
        # one head of every token beside another
        lambda qkv: (qkv.view(5, 9, 8)[:, 1], qkv.view(5, 9, 8)[:, 7]),
    ],
    ids=["3d-blocks", "4d-index", "kv-halves", "2d-blocks", "one-head"],
)
def test_disjoint_views_of_one_buffer_are_written_beside_each_other(mod, views):
    """Views that share a buffer but no element: the overlap test tells them apart, in
    either role."""
    first, second = views(_fused())
    mod.write_beside(first, second)
    mod.write_beside(second, first)


@pytest.mark.parametrize(
    "views",
    [
        lambda qkv: (qkv[:, :16].view(5, 2, 8), qkv[:, 8:24].view(5, 2, 8)),  # a shared head
        lambda qkv: (qkv[:, :24].view(5, 3, 8), qkv[:, 23:24]),  # one shared element
        lambda qkv: (qkv.view(5, 9, 8)[:, :, :4], qkv.view(5, 9, 8)[:, 2, 3:5]),
    ],
    ids=["shared-head", "shared-element", "strided-heads"],
)
def test_overlapping_views_are_refused(mod, views):
    first, second = views(_fused())
    with pytest.raises(ValueError, match=r"^argument 'out': overlaps argument 'input'"):
        mod.write_beside(first, second)


@pytest.mark.parametrize(
    ("make", "overlaps"),
    [
        (lambda: torch.empty(10).as_strided((4, 4), (1, 1)), True),
        (lambda: torch.empty(20).unfold(0, 4, 2), True),  # windows sharing elements
        (lambda: torch.empty(30).as_strided((3, 4), (3, 1)), True),  # rows overlap by one
        (lambda: torch.empty(30).as_strided((3, 4), (4, 1)), False),
        (lambda: torch.empty(4, 5).t(), False),
        (lambda: torch.empty(2, 3, 4).permute(2, 0, 1), False),
        (lambda: torch.empty(6, 1, 4)[:, :, ::2], False),
        # 18 dims of size 2, the last two both of stride 1 (past the 16 once looked at).
        (
            lambda: torch.empty(2**17 + 8).as_strided(
                [2] * 18, [2**i for i in range(16, 0, -1)] + [1, 1]
            ),
            True,
        ),
        (lambda: torch.empty(2**18).view([2] * 18).permute(*range(17, -1, -1)), False),
    ],
    ids=[
        "diagonal",
        "unfold",
        "rows-overlap",
        "rows-touch",
        "transposed",
        "permuted",
        "every-2nd",
        "18-dims-overlap",
        "18-dims",
    ],
)
def test_an_output_whose_elements_share_memory_is_refused(mod, make, overlaps):
    out = make()
    if not overlaps:
        mod.write_beside(out, torch.empty(3))
        return
    with pytest.raises(ValueError, match=r"^argument 'out': its elements share memory"):
        mod.write_beside(out, torch.empty(3))
