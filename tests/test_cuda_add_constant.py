"""CUDA add_constant / add_constant_runtime against torch (exact: one rounding each)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.cuda

DTYPES = [torch.int32, torch.float32, torch.float16, torch.bfloat16]
SHAPES = [(1,), (7,), (8,), (9,), (127,), (4095,), (4096,), (3, 5, 7), (513, 4097)]


def _random(shape, dtype, device="cuda"):
    if dtype == torch.int32:
        return torch.randint(-1000, 1000, shape, dtype=dtype, device=device)
    return torch.randn(shape, device=device).to(dtype)


def _poisoned_like(x):
    return torch.full_like(x, -7) if x.dtype == torch.int32 else torch.full_like(x, float("nan"))


def _reference(x, c):
    if x.dtype == torch.int32:
        return x + int(c)
    return (x.double() + c).to(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("c", [1, 2, 4, 8, 16])
def test_add_constant(dtype, shape, c):
    from mllm_kernel.cuda.jit import add_constant

    x = _random(shape, dtype)
    out = _poisoned_like(x)
    result = add_constant(x, c, out=out)
    assert result is out
    torch.testing.assert_close(out, _reference(x, c), rtol=0, atol=0)
    torch.testing.assert_close(add_constant(x, c), _reference(x, c), rtol=0, atol=0)


def test_readme_example():
    from mllm_kernel.cuda.jit import add_constant

    x = torch.arange(10, dtype=torch.int32, device="cuda")
    assert torch.equal(add_constant(x, 8), x + 8)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("numel", [1, 9, 4097])
def test_misaligned_buffers_take_the_scalar_path(dtype, numel):
    from mllm_kernel.cuda.jit import add_constant

    x = _random((numel + 1,), dtype)[1:]  # one element past a 16-byte boundary
    out = _poisoned_like(torch.empty(numel + 1, dtype=dtype, device="cuda"))[1:]
    add_constant(x, 4, out=out)
    torch.testing.assert_close(out, _reference(x, 4), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_constant_runtime(dtype):
    from mllm_kernel.cuda.jit import add_constant_runtime

    x = _random((3, 1000), dtype)
    c = 3 if dtype == torch.int32 else 0.5
    torch.testing.assert_close(add_constant_runtime(x, c), _reference(x, c), rtol=0, atol=0)


def test_runtime_int32_needs_an_integer():
    from mllm_kernel.cuda.jit import add_constant_runtime

    x = torch.zeros(4, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="'constant'"):
        add_constant_runtime(x, 0.5)


@pytest.mark.parametrize("c", [0, 3, 32, -1, 1.0, 2.5])
def test_constant_outside_the_allowed_set(c):
    from mllm_kernel.cuda.jit import add_constant

    with pytest.raises(ValueError, match=r"\(1, 2, 4, 8, 16\).*call add_constant_runtime"):
        add_constant(torch.zeros(4, device="cuda"), c)


@pytest.mark.parametrize("c", [True, "1", None])
def test_constant_that_is_not_a_number(c):
    from mllm_kernel.cuda.jit import add_constant

    with pytest.raises(TypeError, match=r"argument 'constant': expected an int"):
        add_constant(torch.zeros(4, device="cuda"), c)


def test_constant_of_another_integer_type():
    import numpy as np

    from mllm_kernel.cuda.jit import add_constant

    x = torch.randn(37, device="cuda")
    torch.testing.assert_close(add_constant(x, np.int32(16)), x + 16)


def test_bad_inputs():
    from mllm_kernel.cuda.jit import add_constant

    x = torch.zeros(8, device="cuda")
    with pytest.raises(TypeError, match=r"'src'.*float64"):
        add_constant(x.double(), 8)
    with pytest.raises(ValueError, match="'out'"):
        add_constant(x, 8, out=torch.zeros(9, device="cuda"))
    with pytest.raises(TypeError, match="'out'"):
        add_constant(x, 8, out=torch.zeros(8, device="cuda", dtype=torch.float16))
    with pytest.raises(ValueError, match="'out'"):
        add_constant(x, 8, out=torch.zeros(8))
    with pytest.raises(ValueError, match="'src'"):
        add_constant(torch.zeros(4, 4, device="cuda").t(), 8)
