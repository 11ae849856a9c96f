"""CUDA silu_and_mul, gelu_and_mul, gelu_tanh_and_mul against a float64 reference."""

from __future__ import annotations

import math

import pytest
import torch

pytestmark = pytest.mark.cuda

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
HALF_WIDTHS = [1, 7, 8, 9, 127, 128, 4095, 4096, 5120, 11008]
TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 2e-2}


def _silu(x):
    return x * torch.sigmoid(x)


def _gelu(x):
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def _gelu_tanh(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


OPS = {"silu_and_mul": _silu, "gelu_and_mul": _gelu, "gelu_tanh_and_mul": _gelu_tanh}


def _reference(op, x):
    xd = x.double()
    d = x.shape[-1] // 2
    return OPS[op](xd[..., :d]) * xd[..., d:]


def _close(out, ref):
    tol = TOL[out.dtype]
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)


def test_reference_matches_torch():
    x = torch.randn(1000, dtype=torch.float64)
    torch.testing.assert_close(_silu(x), torch.nn.functional.silu(x))
    torch.testing.assert_close(_gelu(x), torch.nn.functional.gelu(x))
    torch.testing.assert_close(_gelu_tanh(x), torch.nn.functional.gelu(x, approximate="tanh"))


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", HALF_WIDTHS)
@pytest.mark.parametrize("rows", [1, 5, 300])
def test_act_and_mul(op, dtype, d, rows):
    import mllm_kernel.cuda.jit as ops

    x = (3 * torch.randn(rows, 2 * d, device="cuda")).to(dtype)
    out = torch.full((rows, d), float("nan"), dtype=dtype, device="cuda")
    assert getattr(ops, op)(x, out=out) is out
    _close(out, _reference(op, x))


@pytest.mark.parametrize("op", list(OPS))
def test_many_rows_strided_and_batched(op):
    import mllm_kernel.cuda.jit as ops

    x = torch.randn(70000, 16, device="cuda", dtype=torch.bfloat16)  # rows > grid.y limit
    _close(getattr(ops, op)(x), _reference(op, x))
    big = torch.randn(9, 2 * 256 + 8, device="cuda", dtype=torch.float16)
    strided = big[:, : 2 * 256]
    _close(getattr(ops, op)(strided), _reference(op, strided))
    x3 = torch.randn(2, 3, 2 * 40, device="cuda")
    out = getattr(ops, op)(x3)
    assert out.shape == (2, 3, 40)
    _close(out, _reference(op, x3))


def test_bad_inputs():
    from mllm_kernel.cuda.jit import silu_and_mul

    x = torch.randn(4, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match=r"'input'.*even"):
        silu_and_mul(torch.randn(4, 63, device="cuda"))
    with pytest.raises(TypeError, match="'input'"):
        silu_and_mul(x.double())
    with pytest.raises(ValueError, match="'out'"):
        silu_and_mul(x, out=torch.empty(4, 64, device="cuda", dtype=x.dtype))
    with pytest.raises(TypeError, match="'out'"):
        silu_and_mul(x, out=torch.empty(4, 32, device="cuda"))
    with pytest.raises(ValueError, match="'out'"):
        silu_and_mul(x, out=torch.empty(4, 32, dtype=x.dtype))
