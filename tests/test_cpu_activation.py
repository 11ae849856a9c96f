"""silu_and_mul against a float64 torch reference."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from mllm_kernel.cpu.jit import silu_and_mul

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    torch.bfloat16: {"rtol": 1.6e-2, "atol": 1e-2},
    torch.float16: {"rtol": 2e-3, "atol": 2e-3},
}
HALF = [1, 7, 8, 15, 16, 17, 33, 2048, 4097]


def reference(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.double().chunk(2, dim=-1)
    return F.silu(gate) * up


def randn(*shape, dtype, scale=4.0):
    return (torch.randn(shape, dtype=torch.float64) * scale).to(dtype)


@pytest.mark.parametrize("d", HALF)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_silu_and_mul(dtype, d):
    torch.manual_seed(d)
    x = randn(3, 2 * d, dtype=dtype)
    out = torch.full((3, d), math.nan, dtype=dtype)
    assert silu_and_mul(x, out=out) is out
    torch.testing.assert_close(out.double(), reference(x), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_silu_and_mul_layouts_and_extremes(dtype):
    torch.manual_seed(1)
    d = 1024
    wide = randn(4, 6, 2 * d + 8, dtype=dtype)
    inputs = {
        "strided rows": wide[:, 2, 8:],
        "3-d, leading dims transposed": wide[..., : 2 * d].transpose(0, 1),
        "1-d": wide[0, 0, : 2 * d],
        "many rows (threads)": randn(70, 2 * d, dtype=dtype),
        "large gates": randn(4, 2 * d, dtype=dtype, scale=60.0),
    }
    for name, x in inputs.items():
        torch.testing.assert_close(silu_and_mul(x).double(), reference(x), **TOL[dtype], msg=name)
    storage = torch.full((4, d + 3), math.nan, dtype=dtype)
    silu_and_mul(inputs["strided rows"], out=storage[:, 3:])
    torch.testing.assert_close(
        storage[:, 3:].double(), reference(inputs["strided rows"]), **TOL[dtype]
    )
    assert storage[:, :3].isnan().all()


def test_silu_and_mul_special_values():
    gate = torch.tensor([0.0, -0.0, 100.0, -100.0, -1000.0, math.inf, math.nan, 1.0])
    up = torch.tensor([1.0, 1.0, 2.0, 2.0, 2.0, 1.0, 1.0, math.nan])
    x = torch.cat([gate, up])
    torch.testing.assert_close(silu_and_mul(x), F.silu(gate) * up, equal_nan=True)


def test_silu_and_mul_empty():
    assert silu_and_mul(torch.empty(0, 8)).shape == (0, 4)
    assert silu_and_mul(torch.empty(3, 0)).shape == (3, 0)


def test_silu_and_mul_errors():
    with pytest.raises(ValueError, match=r"'input'.*even.*\[2, 7\]"):
        silu_and_mul(torch.randn(2, 7))
    with pytest.raises(ValueError, match=r"'out'.*\[2, 4\]"):
        silu_and_mul(torch.randn(2, 8), out=torch.empty(2, 8))
    with pytest.raises(TypeError, match=r"'out'.*bfloat16"):
        silu_and_mul(torch.randn(2, 8), out=torch.empty(2, 4, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match=r"'input'.*float64"):
        silu_and_mul(torch.randn(2, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"'input'.*stride"):
        silu_and_mul(torch.randn(8, 2).t())
    with pytest.raises(ValueError, match="'input'"):
        silu_and_mul(torch.tensor(1.0))
