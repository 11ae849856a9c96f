"""CUDA rmsnorm, fused_add_rmsnorm and rms_norm_gated against a float64 reference."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.cuda

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Crossing every vector width and tail; 33024/33025 exceed the register-cached rows.
HIDDEN = [1, 7, 8, 9, 127, 128, 4095, 4096, 5120, 33024, 33025]
TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 2e-2}


def _rms_ref(x, weight, eps):
    xd = x.double()
    return xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


def _close(out, ref):
    tol = TOL[out.dtype]
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)


def _inputs(rows, hidden, dtype):
    x = torch.randn(rows, hidden, device="cuda").to(dtype)
    weight = (1 + 0.5 * torch.randn(hidden, device="cuda")).to(dtype)
    return x, weight


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("rows", [1, 3, 257])
def test_rmsnorm(dtype, hidden, rows):
    from mllm_kernel.cuda.jit import rmsnorm

    x, weight = _inputs(rows, hidden, dtype)
    out = torch.full_like(x, float("nan"))
    assert rmsnorm(x, weight, 1e-6, out=out) is out
    _close(out, _rms_ref(x, weight, 1e-6))
    _close(rmsnorm(x, weight, eps=1e-2), _rms_ref(x, weight, 1e-2))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [8, 9, 4096])
def test_rmsnorm_strided_and_batched(dtype, hidden):
    from mllm_kernel.cuda.jit import rmsnorm

    big, weight = _inputs(6, hidden + 16, dtype)
    weight = weight[:hidden].contiguous()
    x = big[:, :hidden]  # strided rows
    _close(rmsnorm(x, weight), _rms_ref(x, weight, 1e-6))
    x3 = torch.randn(2, 3, hidden, device="cuda").to(dtype)
    out = rmsnorm(x3, weight)
    assert out.shape == x3.shape
    _close(out, _rms_ref(x3, weight, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("rows", [1, 65])
def test_fused_add_rmsnorm(dtype, hidden, rows):
    from mllm_kernel.cuda.jit import fused_add_rmsnorm

    x, weight = _inputs(rows, hidden, dtype)
    residual = torch.randn_like(x)
    new_residual = (residual.double() + x.double()).to(dtype)
    expected = _rms_ref(new_residual, weight, 1e-6)
    assert fused_add_rmsnorm(x, residual, weight) is None
    torch.testing.assert_close(residual, new_residual)
    _close(x, expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("hidden", [7, 129, 4096, 4097, 33025])
def test_fused_add_rmsnorm_matches_cpu(dtype, hidden):
    """One definition on both devices: the same residual bit for bit, and outputs that
    differ only where float32 rounding in the norm (sum order, rsqrtf) tips a rounding
    to the dtype: at most one ulp, in a small fraction of the elements."""
    from mllm_kernel.cpu.jit import fused_add_rmsnorm as cpu_fused_add_rmsnorm
    from mllm_kernel.cuda.jit import fused_add_rmsnorm

    torch.manual_seed(hidden)
    x, residual = torch.randn(2, 65, hidden).to(dtype), torch.randn(2, 65, hidden).to(dtype)
    weight = (1 + 0.5 * torch.randn(hidden)).to(dtype)
    x_gpu, residual_gpu = x.cuda(), residual.cuda()
    cpu_fused_add_rmsnorm(x, residual, weight)
    fused_add_rmsnorm(x_gpu, residual_gpu, weight.cuda())
    assert torch.equal(residual_gpu.cpu(), residual)
    # Same signs (same residual and weight), so the bit patterns' difference counts ulps.
    ulps = (x_gpu.cpu().view(torch.int16).int() - x.view(torch.int16).int()).abs()
    assert ulps.max() <= 1
    assert (ulps != 0).double().mean() < 0.01, f"{int((ulps != 0).sum())} of {ulps.numel()} differ"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("rows", [1, 65])
def test_rms_norm_gated(dtype, hidden, rows):
    from mllm_kernel.cuda.jit import rms_norm_gated

    x, weight = _inputs(rows, hidden, dtype)
    z = torch.randn_like(x)
    out = torch.full_like(x, float("nan"))
    rms_norm_gated(x, weight, z, out=out)
    zd = z.double()
    _close(out, _rms_ref(x, weight, 1e-6) * zd * torch.sigmoid(zd))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_gated_without_z_is_rmsnorm_times_weight(dtype):
    from mllm_kernel.cuda.jit import rms_norm_gated

    x, weight = _inputs(65, 4096, dtype)
    _close(rms_norm_gated(x, weight, eps=1e-5), _rms_ref(x, weight, 1e-5))
    out = torch.full_like(x, float("nan"))
    assert rms_norm_gated(x, weight, None, 1e-6, out=out) is out
    _close(out, _rms_ref(x, weight, 1e-6))


def test_bad_inputs():
    from mllm_kernel.cuda.jit import fused_add_rmsnorm, rms_norm_gated, rmsnorm

    x, weight = _inputs(4, 64, torch.float16)
    with pytest.raises(TypeError, match=r"'input'.*int32"):
        rmsnorm(x.to(torch.int32), weight)
    with pytest.raises(TypeError, match="'weight'"):
        rmsnorm(x, weight.float())
    with pytest.raises(ValueError, match="'weight'"):
        rmsnorm(x, weight[:32])
    with pytest.raises(ValueError, match="'weight'"):
        rmsnorm(x, weight.cpu())
    with pytest.raises(ValueError, match="'out'"):
        rmsnorm(x, weight, out=torch.empty(4, 32, dtype=x.dtype, device="cuda"))
    with pytest.raises(ValueError, match="'eps'"):
        rmsnorm(x, weight, eps=-1.0)
    with pytest.raises(ValueError, match="'input'"):
        rmsnorm(torch.randn(64, 4, device="cuda", dtype=x.dtype).t(), weight)
    with pytest.raises(ValueError, match="'residual'"):
        fused_add_rmsnorm(x, x[:2].clone(), weight)
    with pytest.raises(TypeError, match="'residual'"):
        fused_add_rmsnorm(x, x.float(), weight)
    with pytest.raises(ValueError, match="'z'"):
        rms_norm_gated(x, weight, x[:2].clone())
