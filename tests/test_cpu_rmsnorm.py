"""rmsnorm / fused_add_rmsnorm against a float64 torch reference."""

from __future__ import annotations

import math

import pytest
import torch

from mllm_kernel.cpu.jit import fused_add_rmsnorm, rmsnorm

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    torch.bfloat16: {"rtol": 1.6e-2, "atol": 1e-2},
    torch.float16: {"rtol": 2e-3, "atol": 2e-3},
}
# Crossing the vector tails and the 128-float blocks fp16 is converted in.
HIDDEN = [1, 7, 8, 15, 16, 17, 33, 127, 129, 2048, 4097]


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x, weight = x.double(), weight.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def randn(*shape, dtype):
    return torch.randn(shape, dtype=torch.float64).to(dtype)


def fused_reference(x, residual, weight, eps):
    """fused_add_rmsnorm's definition: the new residual is the sum rounded to the dtype,
    and the output is the norm (here in float64) of that residual as stored."""
    stored = (x.double() + residual.double()).to(x.dtype)
    return stored, reference(stored, weight, eps)


def assert_rounded(out, expected):
    """`out` is `expected` (float64) rounded to out's dtype, up to float32 arithmetic:
    within half an ulp plus 1e-5 relative. Tight enough that normalising the unrounded
    sum instead (up to an ulp off for fp16 / bf16) fails."""
    eps = torch.finfo(out.dtype).eps  # the ulp of 1
    # |expected| in [2^(e-1), 2^e) has ulp eps * 2^(e-1); subnormals have the smallest normal's.
    e = torch.frexp(expected.abs().clamp_min(torch.finfo(out.dtype).smallest_normal)).exponent
    half_ulp = eps * torch.ldexp(torch.ones_like(expected), e - 2)
    excess = (out.double() - expected).abs() / (half_ulp + 1e-5 * expected.abs())
    worst = int(excess.argmax())
    assert excess.max() <= 1, (
        f"{int((excess > 1).sum())} of {out.numel()} elements off by more than half an ulp; "
        f"worst: {out.flatten()[worst].item()} for {expected.flatten()[worst].item()}"
    )


@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rmsnorm(dtype, hidden):
    torch.manual_seed(hidden)
    x, weight = randn(5, hidden, dtype=dtype) * 3, randn(hidden, dtype=dtype)
    out = torch.full_like(x, math.nan)
    assert rmsnorm(x, weight, 1e-6, out=out) is out
    torch.testing.assert_close(out.double(), reference(x, weight, 1e-6), **TOL[dtype])
    torch.testing.assert_close(
        rmsnorm(x, weight, 0.5).double(), reference(x, weight, 0.5), **TOL[dtype]
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rmsnorm_layouts(dtype):
    torch.manual_seed(1)
    hidden = 2048
    weight = randn(hidden, dtype=dtype)
    wide = randn(6, 4, hidden + 64, dtype=dtype)
    inputs = {
        "strided rows": wide[:, 1, 32 : 32 + hidden],
        "3-d, leading dims transposed": wide[..., :hidden].transpose(0, 1),
        "1-d": wide[0, 0, :hidden],
        "many rows (threads)": randn(97, hidden, dtype=dtype),
    }
    for name, x in inputs.items():
        torch.testing.assert_close(
            rmsnorm(x, weight).double(), reference(x, weight, 1e-6), **TOL[dtype], msg=name
        )
    # A strided out, and in place.
    x = inputs["strided rows"]
    storage = torch.full((6, hidden + 5), math.nan, dtype=dtype)
    rmsnorm(x, weight, out=storage[:, 5:])
    torch.testing.assert_close(storage[:, 5:].double(), reference(x, weight, 1e-6), **TOL[dtype])
    assert storage[:, :5].isnan().all()
    y = x.clone()
    rmsnorm(y, weight, out=y)
    torch.testing.assert_close(y.double(), reference(x, weight, 1e-6), **TOL[dtype])


@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_add_rmsnorm(dtype, hidden):
    torch.manual_seed(hidden + 1)
    x, residual = randn(5, hidden, dtype=dtype), randn(5, hidden, dtype=dtype)
    weight = randn(hidden, dtype=dtype)
    stored, expected = fused_reference(x, residual, weight, 1e-5)
    assert fused_add_rmsnorm(x, residual, weight, 1e-5) is None
    torch.testing.assert_close(residual, stored, rtol=0, atol=0)
    assert_rounded(x, expected)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_add_rmsnorm_strided_rows_and_threads(dtype):
    torch.manual_seed(2)
    hidden = 4096
    weight = randn(hidden, dtype=dtype)
    x_storage = randn(80, hidden + 16, dtype=dtype)
    res_storage = randn(80, 2, hidden, dtype=dtype)
    x, residual = x_storage[:, 16:], res_storage[:, 1]
    x_before, res_before = x_storage.clone(), res_storage.clone()
    stored, expected = fused_reference(x, residual, weight, 1e-6)
    fused_add_rmsnorm(x, residual, weight)
    torch.testing.assert_close(residual, stored, rtol=0, atol=0)
    assert_rounded(x, expected)
    assert torch.equal(x_storage[:, :16], x_before[:, :16]), "wrote outside x"
    assert torch.equal(res_storage[:, 0], res_before[:, 0]), "wrote outside residual"


def test_empty():
    weight = torch.randn(16)
    assert rmsnorm(torch.empty(0, 16), weight).shape == (0, 16)
    assert rmsnorm(torch.empty(3, 0), torch.empty(0)).shape == (3, 0)
    x, residual = torch.empty(0, 16), torch.empty(0, 16)
    fused_add_rmsnorm(x, residual, weight)


def test_rmsnorm_errors():
    x, weight = torch.randn(4, 8), torch.randn(8)
    with pytest.raises(TypeError, match=r"'input'.*float64"):
        rmsnorm(x.double(), weight.double())
    with pytest.raises(TypeError, match=r"'weight'.*bfloat16"):
        rmsnorm(x, weight.bfloat16())
    with pytest.raises(ValueError, match=r"'weight'.*hidden"):
        rmsnorm(x, torch.randn(7))
    with pytest.raises(ValueError, match=r"'input'.*stride"):
        rmsnorm(torch.randn(8, 4).t(), weight)
    with pytest.raises(ValueError, match=r"'out'.*\[4, 8\]"):
        rmsnorm(x, weight, out=torch.empty(4, 9))
    with pytest.raises(TypeError, match=r"'out'.*float16"):
        rmsnorm(x, weight, out=torch.empty(4, 8, dtype=torch.float16))
    with pytest.raises(ValueError, match="'input'"):
        rmsnorm(torch.tensor(1.0), torch.randn(1))


def test_fused_add_rmsnorm_errors():
    x, weight = torch.randn(4, 8), torch.randn(8)
    with pytest.raises(ValueError, match=r"'residual'.*\[4, 8\]"):
        fused_add_rmsnorm(x, torch.randn(5, 8), weight)
    with pytest.raises(TypeError, match=r"'residual'.*bfloat16"):
        fused_add_rmsnorm(x, torch.randn(4, 8).bfloat16(), weight)
    with pytest.raises(TypeError, match=r"'input'.*int32"):
        fused_add_rmsnorm(x.int(), x.int(), weight.int())
    with pytest.raises(ValueError, match="'weight'"):
        fused_add_rmsnorm(x, torch.randn(4, 8), torch.randn(4))


@pytest.mark.parametrize("eps", [-1.0, math.nan, math.inf])
def test_eps_must_be_finite_and_not_negative(eps):
    """As on CUDA: a negative eps inflates the result, NaN makes it NaN, inf zeros it,
    all silently; each is refused naming the argument, before anything is written."""
    x, weight = torch.randn(4, 8), torch.randn(8)
    residual = torch.randn(4, 8)
    x_before, residual_before = x.clone(), residual.clone()
    message = r"^argument 'eps': expected a finite value >= 0"
    with pytest.raises(ValueError, match=message):
        rmsnorm(x, weight, eps)
    with pytest.raises(ValueError, match=message):
        fused_add_rmsnorm(x, residual, weight, eps)
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before)
