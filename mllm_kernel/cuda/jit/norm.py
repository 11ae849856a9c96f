"""RMSNorm: plain, fused with the residual add (in place), and gated by silu(z)."""

from __future__ import annotations

import torch

from mllm_kernel.cuda.jit.device_module import module_for
from mllm_kernel.jit_utils import cache_once, load_cuda_jit, op_inputs, register_kernel


@register_kernel("norm", device="cuda", variants=[()])
@cache_once
def _module():
    return load_cuda_jit(
        "norm",
        cuda_files=["norm.cu"],
        cuda_wrappers=[
            ("rmsnorm", "mllm_kernel::cuda::rmsnorm"),
            ("fused_add_rmsnorm", "mllm_kernel::cuda::fused_add_rmsnorm"),
            ("rms_norm_gated", "mllm_kernel::cuda::rms_norm_gated"),
        ],
    )


def rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``input * rsqrt(mean(input**2, -1) + eps) * weight`` over the last dim.

    fp32/fp16/bf16, any hidden size and leading shape, fp32 accumulation;
    ``weight`` has the dtype of ``input`` and shape ``[hidden]``. ``out``: ``input``'s
    shape and dtype, no zero strides; it may be ``input`` itself, but not overlap
    ``input`` or ``weight`` otherwise.

    >>> x = torch.randn(4, 4096, dtype=torch.bfloat16, device="cuda")
    >>> rmsnorm(x, torch.ones(4096, dtype=torch.bfloat16, device="cuda")).shape
    torch.Size([4, 4096])
    """
    input = op_inputs.tensor(input, "input")
    weight = op_inputs.tensor(weight, "weight")
    eps = op_inputs.number(eps, "eps")
    try:
        out = torch.empty_like(input) if out is None else op_inputs.output(out, "out")
        module_for(_module, input).rmsnorm(out, input, weight, eps)
    except Exception as error:
        op_inputs.explain(error, "cuda", input=input, weight=weight, out=out)
        raise
    return out


def fused_add_rmsnorm(
    input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> None:
    """In place: ``residual += input``, then ``input = rmsnorm(residual) * weight``.

    The output is the norm of ``residual`` as stored (rounded to its dtype). Both
    are written, so neither may have a zero stride or overlap the other or ``weight``.

    >>> fused_add_rmsnorm(hidden, residual, weight)  # doctest: +SKIP
    """
    input = op_inputs.output(input, "input")
    residual = op_inputs.output(residual, "residual")
    weight = op_inputs.tensor(weight, "weight")
    eps = op_inputs.number(eps, "eps")
    try:
        module_for(_module, input).fused_add_rmsnorm(input, residual, weight, eps)
    except Exception as error:
        op_inputs.explain(error, "cuda", input=input, residual=residual, weight=weight)
        raise


def rms_norm_gated(
    x: torch.Tensor,
    weight: torch.Tensor,
    z: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``rmsnorm(x) * weight * silu(z)`` over the last dim (``z`` shaped like ``x``);
    with ``z=None``, plain :func:`rmsnorm` (``rmsnorm(x) * weight``). The argument
    order is the original mllm-kernel's. ``out`` as for :func:`rmsnorm`: it may be
    ``x`` itself, but overlap neither ``x`` nor ``z`` otherwise.

    >>> rms_norm_gated(x, weight, z=gate, eps=1e-6).shape == x.shape  # doctest: +SKIP
    True
    """
    x = op_inputs.tensor(x, "x")
    weight = op_inputs.tensor(weight, "weight")
    z = op_inputs.optional_tensor(z, "z")
    eps = op_inputs.number(eps, "eps")
    try:
        out = torch.empty_like(x) if out is None else op_inputs.output(out, "out")
        module = module_for(_module, x)
        if z is None:
            module.rmsnorm(out, x, weight, eps)
        else:
            module.rms_norm_gated(out, x, z, weight, eps)
    except Exception as error:
        op_inputs.explain(error, "cuda", x=x, z=z, weight=weight, out=out)
        raise
    return out
