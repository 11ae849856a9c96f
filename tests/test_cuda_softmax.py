"""CUDA softmax and softmax_backward against a float64 reference, 1 to 256k columns."""

from __future__ import annotations

import importlib

import pytest
import torch

pytestmark = pytest.mark.cuda

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Registers (<= 2048 vectors: 8192 fp32 / 16384 half), shared memory (fits the block),
# global (longer), and unaligned lengths (scalar register and global tiers) for every
# dtype.
HIDDEN = [
    1,
    7,
    8,
    9,
    127,
    128,
    4095,
    4096,
    5120,
    8192,
    8200,
    16384,
    16385,
    32768,
    32769,
    65536,
    131072,
    262144,
]
RTOL = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 2e-2}


def _close(out, ref):
    # Entries span many magnitudes: tolerances are relative, plus a floor relative to
    # the row's largest entry.
    rtol = RTOL[out.dtype]
    torch.testing.assert_close(out.double(), ref, rtol=rtol, atol=rtol * 1e-2 * ref.abs().max())


def _rows_for(hidden):
    return 3 if hidden > 8192 else 33


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_softmax(dtype, hidden):
    from mllm_kernel.cuda.jit import softmax

    x = (4 * torch.randn(_rows_for(hidden), hidden, device="cuda")).to(dtype)
    out = torch.full_like(x, float("nan"))
    assert softmax(x, out=out) is out
    _close(out, torch.softmax(x.double(), dim=-1))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [16392, 32768, 131072])
def test_softmax_many_long_rows(dtype, hidden):
    """Few long rows go to the cluster tier; many take the shared / global tiers."""
    from mllm_kernel.cuda.jit import softmax

    x = (4 * torch.randn(40, hidden, device="cuda")).to(dtype)
    x[1, :] = float("-inf")  # a fully masked row is NaN, as in torch
    out = torch.full_like(x, 0.5)
    softmax(x, out=out)
    ref = torch.softmax(x.double(), dim=-1)
    assert torch.isnan(out[1]).all()
    _close(out[2:], ref[2:])
    _close(out[:1], ref[:1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [16392, 32768, 40000, 65544, 131072, 262144, 400000, 524288])
def test_softmax_sliced_rows(dtype, hidden):
    """Many long rows take the shared tier, split into slices over clusters of 1 to 16
    CTAs (uneven last slices; past 16 x 64 KiB, 8 bigger slices), then the global tier."""
    from mllm_kernel.cuda.jit import softmax

    rows = 150 if hidden <= 65544 else 40 if hidden <= 262144 else 12
    x = (4 * torch.randn(rows, hidden, device="cuda")).to(dtype)
    x[1, :] = float("-inf")  # a fully masked row is NaN, as in torch
    x[-1, ::3] = float("-inf")
    x[-1, 5] = 60  # one large logit
    ref = torch.softmax(x.double() / 0.7, dim=-1)
    out = torch.full_like(x, float("nan"))
    assert softmax(x, temperature=0.7, out=out) is out
    assert torch.isnan(out[1]).all()
    _close(out[2:], ref[2:])
    _close(out[:1], ref[:1])
    in_place = x.clone()
    softmax(in_place, temperature=0.7, out=in_place)
    torch.testing.assert_close(in_place[2:], out[2:], rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 3, 20])
@pytest.mark.parametrize("hidden", [65536, 262144])
def test_softmax_fully_masked_row_in_cluster_tier(dtype, rows, hidden):
    """Few rows split over clusters of registers: 16 CTAs, 8 for more rows (20 rows of
    256k fp32 fit neither and take the shared tier)."""
    from mllm_kernel.cuda.jit import softmax

    x = (4 * torch.randn(rows, hidden, device="cuda")).to(dtype)
    x[0, :] = float("-inf")
    out = softmax(x)
    assert torch.isnan(out[0]).all()
    if rows > 1:
        _close(out[1:], torch.softmax(x[1:].double(), dim=-1))


@pytest.mark.parametrize("rows", [3, 40])  # few rows: registers / clusters; many: online
@pytest.mark.parametrize("hidden", [4096, 50257, 262144])
def test_softmax_of_large_logits_keeps_fp32_accuracy(rows, hidden):
    """Logits around 1e4 (or 30 at temperature 0.01): softmax does not depend on a
    shift, so the result is as accurate as for logits around 0; each exponent is
    formed by one fma, not from x * scale rounded first (which was 4e-4 off here)."""
    from mllm_kernel.cuda.jit import softmax

    x = (torch.randn(rows, hidden, device="cuda") * 4 + 1e4).float()
    ref = torch.softmax(x.double(), dim=-1)
    out = softmax(x)
    error = ((out.double() - ref).abs() / ref).max().item()
    assert error < 1e-5, f"relative error {error:.2e}"
    cold = torch.randn(rows, hidden, device="cuda") * 0.3 + 30
    out = softmax(cold, temperature=0.01)
    ref = torch.softmax(cold.double() / 0.01, dim=-1)
    _close(out, ref)


@pytest.mark.parametrize("rows", [3, 40])
@pytest.mark.parametrize("hidden", [4096, 50257, 65536, 262144])
@pytest.mark.parametrize("masked", [False, True])
def test_softmax_row_holding_a_nan_is_nan_in_every_tier(rows, hidden, masked):
    """A NaN anywhere in a row makes the whole row NaN, as in torch, whichever tier runs
    it (odd lengths past the registers take the online global tier), also where the
    rest of its slice is -inf; the other rows are unaffected."""
    from mllm_kernel.cuda.jit import softmax

    x = 4 * torch.randn(rows, hidden, device="cuda")
    if masked:
        x[1, : hidden // 2] = float("-inf")
    x[1, 3] = float("nan")
    out = softmax(x)
    assert out[1].isnan().all()
    _close(out[[0, 2]], torch.softmax(x[[0, 2]].double(), dim=-1))


# Layouts along the last dim: rows in place (contiguous, sliced, a stepped middle dim)
# or not (transposed, permuted leading dims, a stepped last dim).
LAST_DIM_LAYOUTS = {
    "contiguous": lambda: _gpu(2, 3, 1000),
    "sliced-rows": lambda: _gpu(2, 3, 1064)[..., :1000],
    "stepped-middle": lambda: _gpu(2, 6, 1000)[:, ::2],
    "transposed": lambda: _gpu(1000, 5).t(),
    "permuted": lambda: _gpu(3, 2, 1000).permute(1, 0, 2),
    "stepped-last": lambda: _gpu(4, 2000)[:, ::2],
    "last-two-swapped": lambda: _gpu(2, 1000, 3).transpose(1, 2),
}


def _gpu(*shape):
    return torch.randn(shape, device="cuda")


@pytest.mark.parametrize("layout", list(LAST_DIM_LAYOUTS))
def test_softmax_takes_any_layout_along_the_last_dim(layout):
    """Any strides, as the contract says: rows the kernel can read where they are go
    straight in (the Python test of that agrees with the kernel's own: it takes exactly
    those), the others through a contiguous copy; the result has x's layout."""
    from mllm_kernel.cuda.jit import softmax

    # the module, not the function of the same name the package exports
    softmax_module = importlib.import_module("mllm_kernel.cuda.jit.softmax")
    x = LAST_DIM_LAYOUTS[layout]()
    result = softmax(x)
    _close(result, torch.softmax(x.double(), -1))
    assert result.stride() == torch.empty_like(x).stride()
    module = softmax_module._SOFTMAX[x.get_device()]
    direct = torch.empty(x.shape, device="cuda")
    if softmax_module._rows_in_place(x):
        module.softmax_forward(direct, x, 1.0)
    else:
        with pytest.raises(ValueError, match="argument 'x'"):
            module.softmax_forward(direct, x, 1.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [9, 4096, 65536, 262144])
def test_softmax_temperature_and_masking(dtype, hidden):
    from mllm_kernel.cuda.jit import softmax

    x = (4 * torch.randn(2, hidden, device="cuda")).to(dtype)
    x[:, ::3] = float("-inf")  # masked logits
    x[:, 1] = 50  # one large logit
    ref = torch.softmax(x.double() / 0.7, dim=-1)
    _close(softmax(x, temperature=0.7), ref)


@pytest.mark.parametrize("temperature", [1e-30, 2e-39, 1e-45, 5e-324])
@pytest.mark.parametrize("hidden", [9, 4096, 65536])
def test_softmax_tiny_temperature_is_the_limit_not_nan(hidden, temperature):
    """The scale log2(e) / t overflowed float below t = 4.2e-39: the max's term was
    0 * inf = NaN (the CPU kernel's test has the reference's derivation)."""
    from mllm_kernel.cuda.jit import softmax

    x = (4 * torch.randn(3, hidden, device="cuda")).float()
    x[1, :2] = x[1].max() + 1  # a tie at the max
    xd = x.double()
    ref = torch.softmax((xd - xd.amax(-1, keepdim=True)) / temperature, -1)
    _close(softmax(x, temperature=temperature), ref)


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_layouts(dtype):
    from mllm_kernel.cuda.jit import softmax

    big = torch.randn(5, 4096 + 64, device="cuda").to(dtype)
    strided = big[:, :4096]
    _close(softmax(strided), torch.softmax(strided.double(), -1))
    x3 = torch.randn(2, 3, 1000, device="cuda").to(dtype)
    _close(softmax(x3), torch.softmax(x3.double(), -1))
    x = torch.randn(300, 7, device="cuda").to(dtype)
    _close(softmax(x, dim=0), torch.softmax(x.double(), 0))
    out = torch.full_like(x, float("nan"))
    assert softmax(x, dim=0, out=out) is out
    _close(out, torch.softmax(x.double(), 0))
    in_place = x.clone()
    softmax(in_place, out=in_place)
    _close(in_place, torch.softmax(x.double(), -1))
    # Another dim: the result has x's layout (torch.softmax's, and the registered op's
    # fake), and x is left alone even when moving the dim last needs no copy.
    column = torch.randn(7, 1, device="cuda").to(dtype)
    before = column.clone()
    result = softmax(column, dim=0)
    assert result.stride() == torch.empty_like(column).stride()
    _close(result, torch.softmax(column.double(), 0))
    torch.testing.assert_close(column, before, rtol=0, atol=0)
    transposed = torch.randn(7, 300, device="cuda").to(dtype).t()
    result = softmax(transposed, dim=0)
    assert result.stride() == torch.empty_like(transposed).stride()
    _close(result, torch.softmax(transposed.double(), 0))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_softmax_backward(dtype, hidden):
    from mllm_kernel.cuda.jit import softmax_backward

    rows = _rows_for(hidden)
    out = torch.softmax(4 * torch.randn(rows, hidden, device="cuda"), -1).to(dtype)
    grad = torch.randn(rows, hidden, device="cuda").to(dtype)
    y, g = out.double(), grad.double()
    ref = y * (g - (g * y).sum(-1, keepdim=True))
    _close(softmax_backward(grad, out), ref)


def test_softmax_backward_into_grad_input():
    from mllm_kernel.cuda.jit import softmax_backward

    out = torch.softmax(torch.randn(3, 1000, device="cuda"), -1)
    grad = torch.randn_like(out)
    grad_input = torch.full_like(out, float("nan"))
    assert softmax_backward(grad, out, grad_input=grad_input) is grad_input
    y, g = out.double(), grad.double()
    _close(grad_input, y * (g - (g * y).sum(-1, keepdim=True)))
    with pytest.raises(ValueError, match="'grad_input'"):
        softmax_backward(grad, out, grad_input=torch.empty(3, 999, device="cuda"))
    with pytest.raises(TypeError, match="'grad_input'"):
        softmax_backward(grad, out, grad_input=torch.empty_like(out, dtype=torch.float16))


def test_softmax_backward_matches_autograd():
    from mllm_kernel.cuda.jit import softmax, softmax_backward

    x = torch.randn(4, 300, device="cuda", dtype=torch.float64).requires_grad_()
    y = torch.softmax(x, -1)
    grad = torch.randn_like(y)
    (expected,) = torch.autograd.grad(y, x, grad)
    got = softmax_backward(grad.float(), softmax(x.detach().float()))
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-6)


def test_bad_inputs():
    from mllm_kernel.cuda.jit import softmax, softmax_backward

    x = torch.randn(4, 64, device="cuda")
    with pytest.raises(ValueError, match="'temperature'"):
        softmax(x, temperature=0.0)
    with pytest.raises(ValueError, match="'x': expected at least 1 dim, got a scalar"):
        softmax(torch.tensor(1.0, device="cuda"))
    with pytest.raises(TypeError, match=r"'x'.*int32"):
        softmax(x.to(torch.int32))
    with pytest.raises(ValueError, match="'out'"):
        softmax(x, out=torch.empty(4, 32, device="cuda"))
    with pytest.raises(TypeError, match="'out'"):
        softmax(x, out=torch.empty(4, 64, device="cuda", dtype=torch.float16))
    # Another dim goes through a copy into out=: never broadcast, cast or moved there.
    for bad, error in (
        (torch.empty(2, 4, 64, device="cuda"), ValueError),
        (torch.empty(4, 64, device="cuda", dtype=torch.float16), TypeError),
        (torch.empty(4, 64), ValueError),
        (torch.empty(64, 4, device="cuda"), ValueError),
    ):
        with pytest.raises(error, match=r"^argument 'out'"):
            softmax(x, 0, out=bad)
    with pytest.raises(ValueError, match="'grad_out'"):
        softmax_backward(torch.randn(4, 32, device="cuda"), x)
    with pytest.raises(TypeError, match="'grad_out'"):
        softmax_backward(x.half(), x)
    with pytest.raises(ValueError, match="'grad_out'"):
        softmax_backward(x.cpu(), x)
