"""The CPU backward kernels (rmsnorm_backward, silu_and_mul_backward) against float64
torch autograd, called through the ops' own modules (their C++ contract: in place,
thread counts, errors); the public functions and .backward() are in test_autograd.py."""

from __future__ import annotations

import importlib
import math

import pytest
import torch
import torch.nn.functional as F

# The op modules (their package attributes are the functions of the same name).
cpu_rmsnorm = importlib.import_module("mllm_kernel.cpu.jit.rmsnorm")
cpu_activation = importlib.import_module("mllm_kernel.cpu.jit.activation")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# The outputs' rounding to their dtype, over values of size ~1-10.
TOL = {
    torch.float32: {"rtol": 1e-4, "atol": 1e-5},
    torch.bfloat16: {"rtol": 1.6e-2, "atol": 2e-2},
    torch.float16: {"rtol": 2e-3, "atol": 2e-3},
}
HIDDEN = [1, 7, 8, 15, 16, 17, 33, 1000, 4097]

SAME_AS_INPUT = r"^argument 'grad_input': is the same memory as argument 'input'"


def _rmsnorm_module():
    return cpu_rmsnorm._RMSNORM[()]


def _silu_module():
    return cpu_activation._ACTIVATION[()]


def randn(*shape, dtype, scale=1.0):
    return (torch.randn(shape, dtype=torch.float64) * scale).to(dtype)


# --- rmsnorm_backward ---------------------------------------------------------


def rmsnorm_grads(x, weight, grad, eps):
    """(grad_input, grad_weight) of x * rsqrt(mean(x^2) + eps) * weight, in float64, and
    |r * grad * weight|: grad_input is that term minus another of about its size."""
    x64 = x.double().requires_grad_()
    w64 = weight.double().requires_grad_()
    r = torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    grads = torch.autograd.grad(x64 * r * w64, (x64, w64), grad.double())
    return *grads, (r * grad.double() * weight.double()).abs().detach()


def assert_grad_input_close(got, expected, term, dtype):
    """Within the dtype's tolerance, relative to the larger of |expected| and the term it
    is computed as a difference from (a row dominated by one element cancels)."""
    tol = TOL[dtype]
    excess = (got.double() - expected).abs() - tol["rtol"] * torch.maximum(expected.abs(), term)
    assert (excess <= tol["atol"]).all(), f"max error over the bound: {excess.max().item():.3g}"


def rmsnorm_backward(grad, x, weight, eps=1e-6, grad_input=None, num_threads=None):
    if grad_input is None:
        grad_input = torch.full_like(x, math.nan)
    grad_weight = torch.full(weight.shape, math.nan)
    threads = torch.get_num_threads() if num_threads is None else num_threads
    _rmsnorm_module().rmsnorm_backward(grad_input, grad_weight, grad, x, weight, eps, threads)
    return grad_input, grad_weight


def check_rmsnorm_backward(x, weight, grad, eps=1e-6, **kwargs):
    grad_input, grad_weight = rmsnorm_backward(grad, x, weight, eps, **kwargs)
    expected_input, expected_weight, term = rmsnorm_grads(x, weight, grad, eps)
    assert_grad_input_close(grad_input, expected_input, term, x.dtype)
    # grad_weight is float32 from the exact (already rounded) inputs: float32 accuracy
    # for every input dtype.
    assert grad_weight.dtype == torch.float32
    torch.testing.assert_close(grad_weight.double(), expected_weight, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rmsnorm_backward_matches_autograd(dtype, hidden):
    torch.manual_seed(hidden)
    x = randn(5, hidden, dtype=dtype, scale=2.0)
    weight = randn(hidden, dtype=dtype)
    check_rmsnorm_backward(x, weight, randn(5, hidden, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rmsnorm_backward_layouts(dtype):
    torch.manual_seed(1)
    hidden = 520
    weight = randn(hidden, dtype=dtype)
    wide = randn(4, 6, hidden + 8, dtype=dtype)
    grads = randn(6, 4, hidden, dtype=dtype)
    cases = {
        "strided rows": (wide[:, 2, 8:], grads[0]),
        "leading dims transposed": (wide[..., :hidden].transpose(0, 1), grads),
        "1-d": (wide[0, 0, :hidden], grads[0, 0]),
        "many rows (several partial sums over threads)": (
            randn(300, hidden, dtype=dtype),
            randn(300, hidden, dtype=dtype),
        ),
    }
    for name, (x, grad) in cases.items():
        try:
            check_rmsnorm_backward(x, weight, grad)
        except AssertionError as error:
            raise AssertionError(f"{name}: {error}") from None


def test_rmsnorm_backward_in_place_over_grad_output():
    torch.manual_seed(2)
    x, weight, grad = randn(7, 300, dtype=torch.float32), randn(300, dtype=torch.float32), None
    grad = randn(7, 300, dtype=torch.float32)
    expected_input, expected_weight, _ = rmsnorm_grads(x, weight, grad, 1e-6)
    grad_input, grad_weight = rmsnorm_backward(grad, x, weight, grad_input=grad)
    assert grad_input is grad
    torch.testing.assert_close(grad.double(), expected_input, **TOL[torch.float32])
    torch.testing.assert_close(grad_weight.double(), expected_weight, rtol=1e-4, atol=1e-4)


def test_rmsnorm_backward_does_not_depend_on_the_thread_count():
    torch.manual_seed(3)
    x, grad = randn(257, 1024, dtype=torch.bfloat16), randn(257, 1024, dtype=torch.bfloat16)
    weight = randn(1024, dtype=torch.bfloat16)
    one = rmsnorm_backward(grad, x, weight, num_threads=1)
    four = rmsnorm_backward(grad, x, weight, num_threads=4)
    assert torch.equal(one[0], four[0]) and torch.equal(one[1], four[1])


def test_rmsnorm_backward_empty():
    weight = randn(16, dtype=torch.float32)
    empty = torch.empty(0, 16)
    _, grad_weight = rmsnorm_backward(empty, empty, weight)
    assert torch.equal(grad_weight, torch.zeros(16))  # no rows: overwritten with zeros
    rmsnorm_backward(torch.empty(3, 0), torch.empty(3, 0), torch.empty(0))


def test_rmsnorm_backward_errors():
    x, weight, grad = torch.randn(4, 8), torch.randn(8), torch.randn(4, 8)
    module = _rmsnorm_module()

    def call(grad_input=None, grad_weight=None, grad=grad, x=x, weight=weight, eps=1e-6):
        grad_input = torch.empty_like(x) if grad_input is None else grad_input
        grad_weight = torch.empty(8) if grad_weight is None else grad_weight
        module.rmsnorm_backward(grad_input, grad_weight, grad, x, weight, eps, 1)

    with pytest.raises(
        TypeError,
        match=r"^argument 'grad_output': expected dtype float32 as in 'input' but got float16",
    ):
        call(grad=grad.half())
    with pytest.raises(
        ValueError,
        match=r"^argument 'grad_output': expected shape \[4, 8\] \(the shape of 'input'\) "
        r"but got \[4, 9\]",
    ):
        call(grad=torch.randn(4, 9))
    with pytest.raises(ValueError, match=r"^argument 'weight': .*\(hidden\) to be 8 as in 'input'"):
        call(weight=torch.randn(7))
    with pytest.raises(TypeError, match=r"^argument 'grad_weight': expected dtype in \{float32\}"):
        call(grad_weight=torch.empty(8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"^argument 'grad_weight': .*\(hidden\) to be 8"):
        call(grad_weight=torch.empty(9))
    with pytest.raises(TypeError, match=r"^argument 'input': expected dtype in \{float32, bf"):
        call(x=x.double(), grad=grad.double(), weight=weight.double())
    with pytest.raises(ValueError, match=r"^argument 'input': expected at least 1 dim, got a"):
        call(x=torch.tensor(1.0), grad=torch.tensor(1.0), weight=torch.randn(1))
    with pytest.raises(ValueError, match=r"^argument 'input': expected stride 1 in the last dim"):
        call(x=torch.randn(8, 4).t(), grad=torch.randn(8, 4).t())
    with pytest.raises(ValueError, match=r"^argument 'eps': expected a finite value >= 0, got -1"):
        call(eps=-1.0)
    with pytest.raises(ValueError, match=SAME_AS_INPUT):
        call(grad_input=x)


# --- silu_and_mul_backward ----------------------------------------------------


def silu_and_mul_grad(x, grad):
    x64 = x.double().requires_grad_()
    gate, up = x64.chunk(2, dim=-1)
    (expected,) = torch.autograd.grad(F.silu(gate) * up, x64, grad.double())
    return expected


def silu_and_mul_backward(grad, x):
    grad_input = torch.full_like(x, math.nan)
    _silu_module().silu_and_mul_backward(grad_input, grad, x, torch.get_num_threads())
    return grad_input


@pytest.mark.parametrize("d", HIDDEN)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_silu_and_mul_backward_matches_autograd(dtype, d):
    torch.manual_seed(d)
    x = randn(3, 2 * d, dtype=dtype, scale=4.0)
    grad = randn(3, d, dtype=dtype)
    got = silu_and_mul_backward(grad, x)
    torch.testing.assert_close(got.double(), silu_and_mul_grad(x, grad), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_silu_and_mul_backward_layouts_and_extremes(dtype):
    torch.manual_seed(4)
    d = 260
    wide = randn(4, 6, 2 * d + 8, dtype=dtype, scale=4.0)
    extremes = torch.tensor([-200.0, -90.0, -20.0, -1.0, 0.0, 1.0, 20.0, 90.0, 200.0])
    gate = extremes.repeat(2, 1)
    cases = {
        "strided rows": wide[:, 2, 8:],
        "leading dims transposed": wide[..., : 2 * d].transpose(0, 1),
        "1-d": wide[0, 0, : 2 * d],
        "many rows (threads)": randn(300, 2 * d, dtype=dtype, scale=4.0),
        "saturated gates": torch.cat([gate, torch.ones_like(gate)], -1).to(dtype),
    }
    for name, x in cases.items():
        grad = randn(*x.shape[:-1], x.shape[-1] // 2, dtype=dtype)
        got = silu_and_mul_backward(grad, x)
        try:
            torch.testing.assert_close(got.double(), silu_and_mul_grad(x, grad), **TOL[dtype])
        except AssertionError as error:
            raise AssertionError(f"{name}: {error}") from None


def test_silu_and_mul_backward_empty():
    assert silu_and_mul_backward(torch.empty(0, 4), torch.empty(0, 8)).shape == (0, 8)
    assert silu_and_mul_backward(torch.empty(3, 0), torch.empty(3, 0)).shape == (3, 0)


def test_silu_and_mul_backward_errors():
    x, grad = torch.randn(2, 8), torch.randn(2, 4)
    module = _silu_module()

    def call(grad_input=None, grad=grad, x=x):
        grad_input = torch.empty_like(x) if grad_input is None else grad_input
        module.silu_and_mul_backward(grad_input, grad, x, 1)

    with pytest.raises(ValueError, match=r"^argument 'input': expected an even last dim.*\[2, 7\]"):
        call(x=torch.randn(2, 7))
    with pytest.raises(
        ValueError,
        match=r"^argument 'grad_output': expected shape \[2, 4\] \(the shape of 'input' with "
        r"the last dim replaced\) but got \[2, 8\]",
    ):
        call(grad=torch.randn(2, 8))
    with pytest.raises(
        ValueError, match=r"^argument 'grad_input': expected shape \[2, 8\] .* but got \[2, 4\]"
    ):
        call(grad_input=torch.empty(2, 4))
    with pytest.raises(TypeError, match=r"^argument 'grad_input': .*float32 as in 'input'.*16"):
        call(grad_input=torch.empty(2, 8, dtype=torch.float16))
    with pytest.raises(ValueError, match=SAME_AS_INPUT):
        call(grad_input=x)
