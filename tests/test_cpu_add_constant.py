"""add_constant / add_constant_runtime against a float64 torch reference."""

from __future__ import annotations

import math

import pytest
import torch

from mllm_kernel.cpu.jit import add_constant, add_constant_runtime
from mllm_kernel.cpu.jit.add_constant import ALLOWED_CONSTANTS

FLOAT_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
ALL_DTYPES = [*FLOAT_DTYPES, torch.int32, torch.int64]
SIZES = [1, 7, 8, 15, 16, 17, 31, 33, 4097]


def random(shape, dtype, scale=10.0):
    if dtype.is_floating_point:
        return (torch.randn(shape, dtype=torch.float64) * scale).to(dtype)
    return torch.randint(
        -1000, 1000, torch.Size([shape] if isinstance(shape, int) else shape), dtype=dtype
    )


def poisoned_like(x):
    return torch.full_like(x, math.nan) if x.dtype.is_floating_point else torch.full_like(x, -7)


def ulp_tolerance(dtype):
    """One unit in the last place, relative (the result is rounded once or twice)."""
    if not dtype.is_floating_point:
        return {"rtol": 0, "atol": 0}
    return {"rtol": torch.finfo(dtype).eps, "atol": 0}


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_add_constant_every_constant(dtype):
    torch.manual_seed(0)
    for c in ALLOWED_CONSTANTS:
        for n in SIZES:
            x = random(n, dtype)
            out = poisoned_like(x)
            result = add_constant(x, c, out=out)
            assert result is out
            expected = (x.double() + c).to(dtype) if dtype.is_floating_point else x + c
            torch.testing.assert_close(result, expected, **ulp_tolerance(dtype))


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_add_constant_shapes_and_layouts(dtype):
    torch.manual_seed(1)
    base = random((6, 10, 12), dtype)
    inputs = {
        "0-d": random((), dtype),
        "3-d": base,
        "transposed": base.transpose(0, 2),  # dense, not contiguous
        "sliced": base[:, 1:9:3, ::2],  # not dense, strided last dim
        "permuted slice": base.permute(2, 0, 1)[1:, :, 3:],
        "expanded": random((1, 12), dtype).expand(5, 12),
        "big (threads)": random((300, 1001), dtype),
        "big transposed": random((1001, 300), dtype).t(),
    }
    for name, x in inputs.items():
        expected = (x.double() + 4).to(dtype) if dtype.is_floating_point else x + 4
        result = add_constant(x, 4)
        assert result.shape == x.shape, name
        torch.testing.assert_close(result, expected, **ulp_tolerance(dtype), msg=name)


def test_add_constant_out_with_other_strides():
    torch.manual_seed(2)
    x = torch.randn(64, 48)
    storage = torch.full((48, 128), math.nan)
    out = storage[:, :64].t()  # x's shape, transposed and row-strided
    add_constant(x, 16, out=out)
    torch.testing.assert_close(out, x + 16)
    assert storage[:, 64:].isnan().all(), "wrote outside out"


def test_add_constant_in_place():
    torch.manual_seed(3)
    x = torch.randn(1000)
    expected = x + 2
    assert add_constant(x, 2, out=x) is x
    torch.testing.assert_close(x, expected)


def test_add_constant_integer_wraps_like_torch():
    x = torch.tensor([2**31 - 1, -(2**31), 0], dtype=torch.int32)
    torch.testing.assert_close(add_constant(x, 1), x + 1)
    y = torch.tensor([2**63 - 1], dtype=torch.int64)
    torch.testing.assert_close(add_constant(y, 16), y + 16)


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 5, 2)])
def test_add_constant_empty(shape):
    x = torch.empty(shape)
    assert add_constant(x, 8).shape == shape
    assert add_constant_runtime(x, 0.5).shape == shape


@pytest.mark.parametrize("c", [0, 3, 32, -1, 1.0, 2.5])
def test_add_constant_rejects_other_constants(c):
    # The error says the fix: add_constant_runtime takes any value.
    with pytest.raises(
        ValueError, match=r"\(1, 2, 4, 8, 16\).*for any other value call add_constant_runtime"
    ):
        add_constant(torch.zeros(3), c)


@pytest.mark.parametrize(("c", "kind"), [(True, "bool"), ("1", "str"), (None, "NoneType")])
def test_add_constant_rejects_constants_that_are_not_numbers(c, kind):
    with pytest.raises(TypeError, match=rf"argument 'constant': expected an int but got {kind}"):
        add_constant(torch.zeros(3), c)


def test_add_constant_takes_any_integer_type():
    import numpy as np

    x = torch.randn(5)
    torch.testing.assert_close(add_constant(x, np.int64(4)), x + 4)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.bool, torch.int8], ids=str)
def test_add_constant_rejects_dtype(dtype):
    name = str(dtype).removeprefix("torch.")
    with pytest.raises(TypeError, match=rf"'src'.*{name}"):
        add_constant(torch.zeros(4, dtype=dtype), 1)


def test_add_constant_rejects_bad_out():
    x = torch.zeros(4, 3)
    with pytest.raises(ValueError, match=r"'out'.*\[4, 3\].*\[3, 4\]"):
        add_constant(x, 1, out=torch.zeros(3, 4))
    with pytest.raises(ValueError, match="'out'"):
        add_constant(x, 1, out=torch.zeros(12))
    with pytest.raises(TypeError, match=r"'out'.*float64"):
        add_constant(x, 1, out=torch.zeros(4, 3, dtype=torch.float64))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_add_constant_runtime(dtype):
    torch.manual_seed(4)
    for c in [0.3, -1.75, 1e-3, 12345.678, -0.0]:
        for n in SIZES:
            x = random(n, dtype)
            out = poisoned_like(x)
            assert add_constant_runtime(x, c, out=out) is out
            expected = x.double() + (c if dtype == torch.float64 else float(torch.tensor(c)))
            torch.testing.assert_close(out, expected.to(dtype), **ulp_tolerance(dtype))
    x = random((40, 30), dtype)[::3, 1::2].t()
    torch.testing.assert_close(
        add_constant_runtime(x, 2.5), (x.double() + 2.5).to(dtype), **ulp_tolerance(dtype)
    )


def test_add_constant_runtime_special_values():
    x = torch.tensor([math.inf, -math.inf, math.nan, 0.0])
    torch.testing.assert_close(add_constant_runtime(x, 1.5), x + 1.5, equal_nan=True)
    torch.testing.assert_close(add_constant(x, 1), x + 1, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8], ids=str)
def test_add_constant_runtime_rejects_dtype(dtype):
    name = str(dtype).removeprefix("torch.")
    with pytest.raises(TypeError, match=rf"'src'.*{name}"):
        add_constant_runtime(torch.zeros(4, dtype=dtype), 1.0)
