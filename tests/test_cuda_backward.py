"""The CUDA backward kernels (rmsnorm_backward, silu_and_mul_backward) against float64
torch autograd, called through the ops' own modules (their C++ contract: workspace,
in place, errors); and both modules compiled for sm_90a without a GPU. The public
functions and .backward() are in test_autograd.py."""

from __future__ import annotations

import importlib
import math

import pytest
import torch
import torch.nn.functional as F

from mllm_kernel.jit_utils import cuda_arch_override

# The op modules (their package attributes are the functions of the same name).
cuda_rmsnorm = importlib.import_module("mllm_kernel.cuda.jit.rmsnorm")
cuda_activation = importlib.import_module("mllm_kernel.cuda.jit.activation")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {
    torch.float32: {"rtol": 1e-4, "atol": 1e-5},
    torch.bfloat16: {"rtol": 1.6e-2, "atol": 2e-2},
    torch.float16: {"rtol": 2e-3, "atol": 2e-3},
}
# Across the kernel tiers: 1..512 vectors per row (1 per thread), 2 and 4 per thread,
# rows too long for registers; and lengths that are no multiple of a vector.
HIDDEN = [1, 7, 8, 9, 64, 127, 1000, 4096, 4100, 8192, 12288, 16392]
NORM_WRAPPERS = [
    ("rmsnorm_backward", "mllm_kernel::cuda::rmsnorm_backward"),
    ("rmsnorm_backward_workspace_rows", "mllm_kernel::cuda::rmsnorm_backward_workspace_rows"),
]
ACTIVATION_WRAPPERS = [("silu_and_mul_backward", "mllm_kernel::cuda::silu_and_mul_backward")]

SAME_AS_INPUT = r"^argument 'grad_input': is the same memory as argument 'input'"


def _norm_module():
    return cuda_rmsnorm._RMSNORM.load()


def _activation_module():
    return cuda_activation._ACTIVATION.load()


def norm_module():
    return cuda_rmsnorm._RMSNORM.current()


def activation_module():
    return cuda_activation._ACTIVATION.current()


@pytest.mark.nvcc
@pytest.mark.parametrize(
    "build",
    [
        _norm_module,
        # its host code has no rule to check; its compile is part of the grid
        pytest.param(_activation_module, marks=pytest.mark.compile_grid),
    ],
    ids=["norm", "activation"],
)
def test_backward_modules_compile_for_sm90a(build):
    with cuda_arch_override("9.0a"):
        module = build()
    for name, _ in NORM_WRAPPERS if build is _norm_module else ACTIVATION_WRAPPERS:
        assert module.implements_function(name)
    if build is _norm_module:
        # The workspace rule as a caller (or a fake implementation) computes it without
        # the module: clamp(ceil(rows / 8), 1, 264). Host code: no GPU needed.
        rows = [0, 1, 8, 9, 300, 2112, 2113, 10**9]
        assert [module.rmsnorm_backward_workspace_rows(r) for r in rows] == [
            min(max(math.ceil(r / 8), 1), 264) for r in rows
        ]
        with pytest.raises(ValueError, match=r"^argument 'rows': expected >= 0, got -1"):
            module.rmsnorm_backward_workspace_rows(-1)


def randn(*shape, dtype, scale=1.0):
    return (torch.randn(shape, dtype=torch.float64, device="cuda") * scale).to(dtype)


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


def workspace_for(x: torch.Tensor) -> torch.Tensor:
    rows = x.numel() // x.shape[-1] if x.shape[-1] else math.prod(x.shape[:-1])
    partials = norm_module().rmsnorm_backward_workspace_rows(rows)
    return torch.full((partials, x.shape[-1]), math.nan, device="cuda")


def rmsnorm_backward(grad, x, weight, eps=1e-6, grad_input=None):
    if grad_input is None:
        grad_input = torch.full_like(x, math.nan)
    grad_weight = torch.full(weight.shape, math.nan, device="cuda")
    norm_module().rmsnorm_backward(grad_input, grad_weight, workspace_for(x), grad, x, weight, eps)
    return grad_input, grad_weight


def check_rmsnorm_backward(x, weight, grad, eps=1e-6):
    grad_input, grad_weight = rmsnorm_backward(grad, x, weight, eps)
    expected_input, expected_weight, term = rmsnorm_grads(x, weight, grad, eps)
    assert_grad_input_close(grad_input, expected_input, term, x.dtype)
    assert grad_weight.dtype == torch.float32
    torch.testing.assert_close(grad_weight.double(), expected_weight, rtol=1e-4, atol=1e-4)


@pytest.mark.cuda
@pytest.mark.parametrize("rows", [1, 5, 300])
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rmsnorm_backward_matches_autograd(dtype, hidden, rows):
    torch.manual_seed(hidden + rows)
    x = randn(rows, hidden, dtype=dtype, scale=2.0)
    weight = randn(hidden, dtype=dtype)
    check_rmsnorm_backward(x, weight, randn(rows, hidden, dtype=dtype))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rmsnorm_backward_layouts(dtype):
    torch.manual_seed(1)
    hidden = 1024
    weight = randn(hidden, dtype=dtype)
    wide = randn(4, 6, hidden + 8, dtype=dtype)
    grads = randn(6, 4, hidden, dtype=dtype)
    cases = {
        "strided rows": (wide[:, 2, 8:], grads[0]),
        "1-d": (wide[0, 0, :hidden], grads[0, 0]),
        "rows offset by one element (no vectors)": (wide[:, 2, 1 : hidden + 1], grads[0]),
    }
    for name, (x, grad) in cases.items():
        try:
            check_rmsnorm_backward(x, weight, grad)
        except AssertionError as error:
            raise AssertionError(f"{name}: {error}") from None


@pytest.mark.cuda
def test_rmsnorm_backward_in_place_and_deterministic():
    torch.manual_seed(2)
    x, grad = randn(3000, 4096, dtype=torch.bfloat16), randn(3000, 4096, dtype=torch.bfloat16)
    weight = randn(4096, dtype=torch.bfloat16)
    first = rmsnorm_backward(grad, x, weight)
    second = rmsnorm_backward(grad, x, weight)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    in_place = grad.clone()
    _, grad_weight = rmsnorm_backward(in_place, x, weight, grad_input=in_place)
    assert torch.equal(in_place, first[0]) and torch.equal(grad_weight, first[1])


@pytest.mark.cuda
def test_rmsnorm_backward_empty():
    weight = randn(16, dtype=torch.float32)
    empty = torch.empty(0, 16, device="cuda")
    _, grad_weight = rmsnorm_backward(empty, empty, weight)
    assert torch.equal(grad_weight, torch.zeros(16, device="cuda"))  # overwritten with zeros
    # Zero width, up to many rows (the workspace is sized from the rows, not numel / 0).
    for rows in (3, 16, 1000):
        zero_width = torch.empty(rows, 0, device="cuda")
        grad_input, grad_weight = rmsnorm_backward(
            zero_width, zero_width, torch.empty(0, device="cuda")
        )
        assert grad_input.shape == (rows, 0) and grad_weight.shape == (0,)


@pytest.mark.cuda
def test_rmsnorm_backward_errors():
    x, weight, grad = (randn(4, 8, dtype=torch.float32), randn(8, dtype=torch.float32), None)
    grad = randn(4, 8, dtype=torch.float32)
    module = norm_module()

    def call(grad_input=None, workspace=None, grad=grad, x=x, weight=weight):
        grad_input = torch.empty_like(x) if grad_input is None else grad_input
        workspace = torch.empty(1, 8, device="cuda") if workspace is None else workspace
        module.rmsnorm_backward(
            grad_input, torch.empty(8, device="cuda"), workspace, grad, x, weight, 1e-6
        )

    with pytest.raises(
        ValueError,
        match=r"^argument 'workspace': expected dim 0 \(num_partials\) to be 1 as in "
        r"'rmsnorm_backward_workspace_rows\(input rows\)' but got 2",
    ):
        call(workspace=torch.empty(2, 8, device="cuda"))
    with pytest.raises(TypeError, match=r"^argument 'workspace': expected dtype in \{float32\}"):
        call(workspace=torch.empty(1, 8, device="cuda", dtype=torch.float16))
    with pytest.raises(TypeError, match=r"^argument 'grad_output': .*float32 as in 'input'"):
        call(grad=grad.half())
    with pytest.raises(ValueError, match=r"^argument 'grad_output': expected a tensor on cuda"):
        call(grad=grad.cpu())
    with pytest.raises(ValueError, match=r"^argument 'grad_input': expected shape \[4, 8\]"):
        call(grad_input=torch.empty(4, 9, device="cuda"))
    with pytest.raises(ValueError, match=SAME_AS_INPUT):
        call(grad_input=x)
    with pytest.raises(ValueError, match=r"^argument 'weight': .*\(hidden\) to be 8"):
        call(weight=randn(7, dtype=torch.float32))


# --- silu_and_mul_backward ----------------------------------------------------


def silu_and_mul_grad(x, grad):
    x64 = x.double().requires_grad_()
    gate, up = x64.chunk(2, dim=-1)
    (expected,) = torch.autograd.grad(F.silu(gate) * up, x64, grad.double())
    return expected


def silu_and_mul_backward(grad, x):
    grad_input = torch.full_like(x, math.nan)
    activation_module().silu_and_mul_backward(grad_input, grad, x)
    return grad_input


@pytest.mark.cuda
@pytest.mark.parametrize("d", [1, 7, 8, 9, 33, 1000, 4096, 14336, 14337])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_silu_and_mul_backward_matches_autograd(dtype, d):
    torch.manual_seed(d)
    x = randn(3, 2 * d, dtype=dtype, scale=4.0)
    grad = randn(3, d, dtype=dtype)
    got = silu_and_mul_backward(grad, x)
    torch.testing.assert_close(got.double(), silu_and_mul_grad(x, grad), **TOL[dtype])


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_silu_and_mul_backward_layouts_and_extremes(dtype):
    torch.manual_seed(4)
    d = 512
    wide = randn(4, 6, 2 * d + 8, dtype=dtype, scale=4.0)
    gate = torch.tensor([-200.0, -90.0, -20.0, -1.0, 0.0, 1.0, 20.0, 90.0, 200.0], device="cuda")
    gate = gate.repeat(2, 1)
    cases = {
        "strided rows": wide[:, 2, 8:],
        "1-d": wide[0, 0, : 2 * d],
        "rows offset by one element (no vectors)": wide[:, 2, 1 : 2 * d + 1],
        "many rows (grid y wraps)": randn(70000, 8, dtype=dtype, scale=4.0),
        "saturated gates": torch.cat([gate, torch.ones_like(gate)], -1).to(dtype),
    }
    for name, x in cases.items():
        grad = randn(*x.shape[:-1], x.shape[-1] // 2, dtype=dtype)
        got = silu_and_mul_backward(grad, x)
        try:
            torch.testing.assert_close(got.double(), silu_and_mul_grad(x, grad), **TOL[dtype])
        except AssertionError as error:
            raise AssertionError(f"{name}: {error}") from None


@pytest.mark.cuda
def test_silu_and_mul_backward_errors():
    x, grad = randn(2, 8, dtype=torch.float32), randn(2, 4, dtype=torch.float32)
    module = activation_module()

    def call(grad_input=None, grad=grad, x=x):
        grad_input = torch.empty_like(x) if grad_input is None else grad_input
        module.silu_and_mul_backward(grad_input, grad, x)

    with pytest.raises(ValueError, match=r"^argument 'input': .*even last dim \(2 \* d\), got 7"):
        call(x=randn(2, 7, dtype=torch.float32))
    with pytest.raises(
        ValueError, match=r"^argument 'grad_output': expected shape \[2, 4\] .* but got \[2, 8\]"
    ):
        call(grad=randn(2, 8, dtype=torch.float32))
    with pytest.raises(TypeError, match=r"^argument 'grad_input': .*float32 as in 'input'"):
        call(grad_input=torch.empty(2, 8, device="cuda", dtype=torch.float16))
    with pytest.raises(ValueError, match=r"^argument 'grad_input': expected a tensor on cuda"):
        call(grad_input=torch.empty(2, 8))
    with pytest.raises(ValueError, match=SAME_AS_INPUT):
        call(grad_input=x)


@pytest.mark.cuda
def test_leading_dims_that_do_not_collapse_are_refused_saying_what_to_do():
    # On the GPU a tensor's rows are one evenly strided index (as for the forward ops).
    x = randn(4, 6, 1032, dtype=torch.float32)[..., :1024].transpose(0, 1)
    grad = randn(6, 4, 1024, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"argument 'input': its leading dims must collapse"):
        cuda_rmsnorm.rmsnorm_backward(grad, x, randn(1024, dtype=torch.float32))
    with pytest.raises(ValueError, match=r"argument 'input': its leading dims must collapse"):
        cuda_activation.silu_and_mul_backward(grad[..., :512], x)
