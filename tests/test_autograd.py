"""Training through the ops (issue 16): rmsnorm, silu_and_mul (and softmax, in
test_torch_ops.py) have backward kernels; ``.backward()`` in eager mode and under
torch.compile matches float64 torch autograd, and the public backward functions
return the gradients in the dtypes of their inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import mllm_kernel.cpu.jit as cpu
import mllm_kernel.cuda.jit as cuda

OPS = torch.ops.mllm_kernel
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# Gradients of a sum over [rows, hidden] outputs, rounded to the dtype on the way.
TOL = {
    torch.float32: {"rtol": 1e-4, "atol": 1e-4},
    torch.bfloat16: {"rtol": 3e-2, "atol": 3e-2},
    torch.float16: {"rtol": 4e-3, "atol": 4e-3},
}


def _rmsnorm64(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _silu_and_mul64(x):
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def _leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


def _reference_grads(fn, grad, *tensors):
    leaves = [t.detach().double().requires_grad_() for t in tensors]
    fn(*leaves).backward(grad.double())
    return [leaf.grad for leaf in leaves]


def _check_rmsnorm(ops, device, dtype, shape):
    torch.manual_seed(0)
    x = torch.randn(shape, device=device).to(dtype)
    w = (torch.rand(shape[-1], device=device) + 0.5).to(dtype)
    grad = torch.randn(shape, device=device).to(dtype)
    x_leaf, w_leaf = _leaves(x, w)
    out = ops.rmsnorm(x_leaf, w_leaf, 1e-5)
    assert out.grad_fn is not None
    out.backward(grad)
    ref_x, ref_w = _reference_grads(lambda a, b: _rmsnorm64(a, b, 1e-5), grad, x, w)
    assert x_leaf.grad.dtype == dtype and w_leaf.grad.dtype == dtype
    torch.testing.assert_close(x_leaf.grad.double(), ref_x, **TOL[dtype])
    # grad_weight sums over every row: its error grows with the row count.
    rows = x.numel() // shape[-1]
    tol = {k: v * max(1.0, rows**0.5 / 4) for k, v in TOL[dtype].items()}
    torch.testing.assert_close(w_leaf.grad.double(), ref_w, **tol)


def _check_silu_and_mul(ops, device, dtype, shape):
    torch.manual_seed(1)
    x = (torch.randn(shape, device=device) * 3).to(dtype)
    grad = torch.randn((*shape[:-1], shape[-1] // 2), device=device).to(dtype)
    (x_leaf,) = _leaves(x)
    out = ops.silu_and_mul(x_leaf)
    assert out.grad_fn is not None
    out.backward(grad)
    (ref,) = _reference_grads(_silu_and_mul64, grad, x)
    assert x_leaf.grad.dtype == dtype
    torch.testing.assert_close(x_leaf.grad.double(), ref, **TOL[dtype])


# -------------------------------------------------------------------------------- CPU
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 1), (5, 17), (2, 3, 64), (33, 1000)])
def test_cpu_rmsnorm_backward_matches_float64_autograd(dtype, shape):
    _check_rmsnorm(cpu, "cpu", dtype, shape)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 2), (5, 34), (2, 3, 130), (9, 2 * 1000)])
def test_cpu_silu_and_mul_backward_matches_float64_autograd(dtype, shape):
    _check_silu_and_mul(cpu, "cpu", dtype, shape)


def test_cpu_gradcheck_in_float32_steps():
    # gradcheck's finite differences need float64, which the kernels do not take: the
    # same check with a float32 step size and tolerance.
    x = torch.randn(3, 12, requires_grad=True)
    w = torch.rand(12, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, b: cpu.rmsnorm(a, b, 1e-5), (x, w), eps=1e-2, atol=2e-2, rtol=2e-2
    )
    assert torch.autograd.gradcheck(cpu.silu_and_mul, (x,), eps=1e-2, atol=2e-2, rtol=2e-2)


def test_cpu_backward_functions_return_grads_in_the_inputs_dtypes():
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    w = torch.randn(16, dtype=torch.bfloat16)
    grad_x, grad_w = cpu.rmsnorm_backward(torch.ones_like(x), x, w, 1e-6)
    assert (grad_x.dtype, grad_x.shape, grad_w.dtype, grad_w.shape) == (
        torch.bfloat16,
        x.shape,
        torch.bfloat16,
        w.shape,
    )
    grad_in = cpu.silu_and_mul_backward(torch.ones(4, 8, dtype=torch.bfloat16), x)
    assert (grad_in.dtype, grad_in.shape) == (torch.bfloat16, x.shape)


def test_cpu_backward_takes_an_expanded_grad():
    # (out).sum().backward() hands the backward an expanded (zero-stride) grad.
    x, w = torch.randn(3, 8, requires_grad=True), torch.rand(8, requires_grad=True)
    cpu.rmsnorm(x, w).sum().backward()
    cpu.silu_and_mul(x).sum().backward()
    assert x.grad is not None and w.grad is not None


def test_cpu_backward_errors_name_the_argument():
    x, w = torch.randn(3, 8), torch.randn(8)
    with pytest.raises(ValueError, match=r"argument 'grad_output'"):
        cpu.rmsnorm_backward(torch.randn(3, 9), x, w)
    with pytest.raises(ValueError, match=r"argument 'grad_output'"):
        cpu.silu_and_mul_backward(torch.randn(3, 8), x)
    with pytest.raises(TypeError, match=r"argument 'eps': expected a number but got str"):
        cpu.rmsnorm_backward(x, x, w, "a")


def test_cpu_opcheck_backward_ops():
    x, w = torch.randn(3, 16), torch.randn(16)
    torch.library.opcheck(OPS.rmsnorm_backward.default, (torch.randn_like(x), x, w, 1e-6))
    torch.library.opcheck(OPS.silu_and_mul_backward.default, (torch.randn(3, 8), x))
    for op, args in (
        (OPS.rmsnorm.default, (x.requires_grad_(), w.requires_grad_())),
        (OPS.silu_and_mul.default, (x,)),
    ):
        torch.library.opcheck(op, args, test_utils=("test_autograd_registration",))


def _block(x, w):
    h = cpu.rmsnorm(x, w, 1e-6)
    h = cpu.silu_and_mul(torch.cat([h, h * 0.5], -1))
    return cpu.softmax(h * 2.0, -1)


def test_cpu_training_step_compiles_fullgraph_and_matches_eager():
    import torch._dynamo

    torch._dynamo.reset()
    x, w = torch.randn(4, 32), torch.rand(32) + 0.5
    weights = torch.randn(4, 32)
    expected = _leaves(x, w)
    (_block(*expected) * weights).sum().backward()
    got = _leaves(x, w)
    compiled = torch.compile(_block, fullgraph=True, backend="aot_eager")
    (compiled(*got) * weights).sum().backward()
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)


# -------------------------------------------------------------------------------- CUDA
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 1), (5, 127), (2, 3, 4096), (257, 4100), (64, 16392)])
def test_cuda_rmsnorm_backward_matches_float64_autograd(dtype, shape):
    _check_rmsnorm(cuda, "cuda", dtype, shape)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 2), (5, 34), (2, 3, 2 * 4096), (257, 2 * 11008)])
def test_cuda_silu_and_mul_backward_matches_float64_autograd(dtype, shape):
    _check_silu_and_mul(cuda, "cuda", dtype, shape)


@pytest.mark.cuda
def test_cuda_opcheck_backward_ops():
    x, w = torch.randn(3, 64, device="cuda"), torch.randn(64, device="cuda")
    torch.library.opcheck(OPS.rmsnorm_backward.default, (torch.randn_like(x), x, w, 1e-6))
    torch.library.opcheck(OPS.silu_and_mul_backward.default, (torch.randn(3, 32, device="cuda"), x))


@pytest.mark.cuda
def test_cuda_training_step_compiles_fullgraph_and_matches_eager():
    import torch._dynamo

    def block(x, w):
        h = cuda.rmsnorm(x, w, 1e-6)
        h = cuda.silu_and_mul(torch.cat([h, h * 0.5], -1))
        return cuda.softmax(h * 2.0, -1)

    torch._dynamo.reset()
    x = torch.randn(8, 256, device="cuda")
    w = torch.rand(256, device="cuda") + 0.5
    weights = torch.randn(8, 256, device="cuda")
    expected = _leaves(x, w)
    (block(*expected) * weights).sum().backward()
    got = _leaves(x, w)
    compiled = torch.compile(block, fullgraph=True)
    (compiled(*got) * weights).sum().backward()
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dim", [-1, 0])
def test_cpu_softmax_backward_rounds_once(dtype, dim):
    """The CPU backward of the saved output o, o (g - sum(g o)) / t, in float32 and
    rounded once to the dtype: within half a unit of that formula in float64 on every
    element, also where g_i - sum(g o) cancels (in 16 bits it was off by up to 2000x)."""
    torch.manual_seed(7)
    x = (torch.randn(6, 300) * 3).to(dtype)
    grad = torch.randn(6, 300).to(dtype)
    leaf = x.clone().requires_grad_()
    out = cpu.softmax(leaf, dim, 0.5)
    out.backward(grad)
    o, g = out.detach().double(), grad.double()
    want = o * (g - (g * o).sum(dim, keepdim=True)) / 0.5
    info = torch.finfo(dtype)
    # one rounding to the dtype, plus float32's sum of the row (and subnormal steps)
    fp32_noise = 2.0**-20 * o * (g.abs() + (g.abs() * o).sum(dim, keepdim=True)) / 0.5
    bound = info.eps / 2 * want.abs() + fp32_noise + info.tiny * info.eps
    worst = ((leaf.grad.double() - want).abs() / bound).max().item()
    assert worst <= 1, f"{worst:.2f}x the bound"


def test_cpu_rmsnorm_backward_under_another_default_device():
    """The backward's weight-gradient buffer is made on the weight's device, not torch's
    default one (under set_default_device("meta") it was a meta tensor the kernel could
    not take: "Cannot pack tensors on meta")."""
    x, w, grad = torch.randn(2, 8), torch.rand(8), torch.randn(2, 8)
    want = cpu.rmsnorm_backward(grad, x, w)
    torch.set_default_device("meta")
    try:
        got = cpu.rmsnorm_backward(grad, x, w)
    finally:
        torch.set_default_device(None)
    for g, v in zip(got, want, strict=True):
        torch.testing.assert_close(g, v)
