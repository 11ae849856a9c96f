"""softmax against a float64 torch reference."""

from __future__ import annotations

import math

import pytest
import torch

from mllm_kernel.cpu.jit import softmax

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-6},
    torch.bfloat16: {"rtol": 1.6e-2, "atol": 1e-3},
    torch.float16: {"rtol": 2e-3, "atol": 1e-4},
}
SIZES = [1, 7, 8, 15, 16, 17, 33, 2048, 4097]


def randn(*shape, dtype, scale=3.0):
    return (torch.randn(shape, dtype=torch.float64) * scale).to(dtype)


def reference(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return torch.softmax(x.double(), dim)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_softmax_last_dim(dtype, n):
    torch.manual_seed(n)
    x = randn(3, n, dtype=dtype)
    result = softmax(x)
    assert result.dtype == dtype and result.shape == x.shape
    torch.testing.assert_close(result.double(), reference(x), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_softmax_any_dim_and_layout(dtype):
    torch.manual_seed(1)
    x = randn(5, 33, 17, dtype=dtype)
    for dim in (0, 1, 2, -1, -2, -3):
        torch.testing.assert_close(softmax(x, dim).double(), reference(x, dim), **TOL[dtype])
    inputs = {
        "transposed": x.transpose(0, 2),
        "sliced": x[:, 3:30:2, 1:],
        "many rows (threads)": randn(40, 4096, dtype=dtype),
        "1-d": randn(1000, dtype=dtype),
        "large logits": randn(4, 300, dtype=dtype, scale=80.0),
    }
    for name, t in inputs.items():
        torch.testing.assert_close(softmax(t).double(), reference(t), **TOL[dtype], msg=name)


def test_softmax_masking_and_special_values():
    x = torch.randn(4, 100)
    x[:, ::3] = -math.inf
    result = softmax(x)
    assert (result[:, ::3] == 0).all(), "masked logits must get exactly 0"
    torch.testing.assert_close(result.double(), reference(x))
    # Rows torch answers with NaN: all masked, or holding a NaN / +inf.
    y = torch.tensor([[-math.inf] * 3, [0.0, math.nan, 1.0], [0.0, math.inf, 1.0]])
    torch.testing.assert_close(softmax(y), torch.softmax(y, -1), equal_nan=True)


def test_softmax_0d_and_empty():
    torch.testing.assert_close(softmax(torch.tensor(3.0)), torch.tensor(1.0))
    assert softmax(torch.empty(0, 5)).shape == (0, 5)
    assert softmax(torch.empty(5, 0)).shape == (5, 0)
    assert softmax(torch.empty(2, 0, 3), dim=1).shape == (2, 0, 3)


def test_softmax_errors():
    with pytest.raises(TypeError, match=r"'x'.*float64"):
        softmax(torch.randn(2, 3, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"'x'.*int64"):
        softmax(torch.ones(2, 3, dtype=torch.int64))
    with pytest.raises(IndexError):
        softmax(torch.randn(2, 3), dim=2)


# The CUDA op's signature (issue 17, point 6): temperature and out on the CPU too.
@pytest.mark.parametrize("temperature", [0.25, 0.7, 1.0, 3.0])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_softmax_temperature(dtype, temperature):
    torch.manual_seed(int(temperature * 100))
    x = randn(4, 1031, dtype=dtype)
    result = softmax(x, temperature=temperature)
    torch.testing.assert_close(result.double(), reference(x.double() / temperature), **TOL[dtype])
    strided = randn(9, 5, dtype=dtype).t()  # dim 0 strided, with temperature
    torch.testing.assert_close(
        softmax(strided, 0, temperature).double(),
        reference(strided.double() / temperature, 0),
        **TOL[dtype],
    )


@pytest.mark.parametrize("dim", [-1, 0])
def test_softmax_writes_into_out(dim):
    x = randn(6, 40, dtype=torch.float32)
    out = torch.full_like(x, float("nan"))
    assert softmax(x, dim, 0.5, out=out) is out
    torch.testing.assert_close(out.double(), reference(x.double() * 2, dim), **TOL[torch.float32])
    in_place = x.clone()
    assert softmax(in_place, dim, out=in_place) is in_place
    torch.testing.assert_close(in_place.double(), reference(x, dim), **TOL[torch.float32])


def tiny_temperature_reference(x: torch.Tensor, temperature: float, dim: int = -1):
    """softmax(x / t) in float64 as (x - max) / t: finite for any t > 0, where x / t
    itself overflows (the limit: the maxima share 1, ties alike)."""
    x = x.double()
    return torch.softmax((x - x.amax(dim, keepdim=True)) / temperature, dim)


@pytest.mark.parametrize("temperature", [1e-30, 2e-39, 1e-45, 5e-324])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_softmax_tiny_temperature_is_the_limit_not_nan(dtype, temperature):
    """Below t = 1 / FLT_MAX the float scale 1 / t overflowed: the max's term was
    0 * inf = NaN and every output NaN."""
    x = torch.tensor([[1.0, 2.0, 3.0], [3.0, 3.0, -1.0], [0.5, 0.5 + 2**-20, 0.0]], dtype=dtype)
    x = torch.cat([x, randn(5, 3, dtype=dtype)])
    for got, dim in ((softmax(x, -1, temperature), -1), (softmax(x.t(), 0, temperature).t(), -1)):
        torch.testing.assert_close(
            got.double(), tiny_temperature_reference(x, temperature, dim), **TOL[dtype]
        )


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("inf"), float("nan")])
def test_softmax_temperature_must_be_finite_and_positive(temperature):
    with pytest.raises(ValueError, match=r"argument 'temperature': expected a finite value > 0"):
        softmax(torch.randn(2, 8), temperature=temperature)


def test_softmax_out_must_match_and_not_overlap():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match=r"'out'"):
        softmax(x, out=torch.empty(4, 7))
    square = torch.randn(8, 8)
    with pytest.raises(ValueError, match=r"^argument 'out': overlaps argument 'x'"):
        softmax(square, out=square.t())
    # Along another dim the views are moved to the last: the error names them as passed.
    shape = r"^argument 'out': expected shape \[2, 3(, 4)?\] \(the shape of 'x'\) but got \[{}\]"
    with pytest.raises(ValueError, match=shape.format("3, 2")):
        softmax(torch.randn(2, 3), 0, out=torch.empty(3, 2))
    with pytest.raises(ValueError, match=shape.format("5")):
        softmax(torch.randn(2, 3, 4), 1, out=torch.empty(5))
