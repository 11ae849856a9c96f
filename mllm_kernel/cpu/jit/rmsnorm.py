"""rmsnorm and fused_add_rmsnorm (sglang / FlashInfer semantics) on the CPU."""

from __future__ import annotations

import torch

from mllm_kernel.cpu.jit.compile_flags import CXX_FLAGS, LDFLAGS
from mllm_kernel.jit_utils import cache_once, load_cpu_jit, op_inputs, register_kernel


@register_kernel("rmsnorm", device="cpu", variants=[()])
@cache_once
def _module():
    return load_cpu_jit(
        "rmsnorm",
        cpp_files=["rmsnorm.cpp"],
        cpp_wrappers=[
            ("rmsnorm", "mllm_kernel::cpu::rmsnorm"),
            ("fused_add_rmsnorm", "mllm_kernel::cpu::fused_add_rmsnorm"),
        ],
        extra_cxx_flags=CXX_FLAGS,
        extra_ldflags=LDFLAGS,
    )


def rmsnorm(
    x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Returns ``x / sqrt(mean(x**2, -1) + eps) * weight``, computed in float32.

    ``x``: ``[..., hidden]`` float32, bfloat16 or float16, each row contiguous
    (rows may be strided). ``weight``: ``[hidden]``, ``x``'s dtype. ``eps``: a
    number. ``out``: written in place if given (``x``'s shape and dtype, no zero
    strides); it may be ``x`` itself, but not overlap ``x`` or ``weight`` otherwise.

    >>> rmsnorm(torch.full((1, 4), 2.0), torch.ones(4))
    tensor([[1.0000, 1.0000, 1.0000, 1.0000]])
    """
    x = op_inputs.tensor(x, "x")
    weight = op_inputs.tensor(weight, "weight")
    eps = op_inputs.number(eps, "eps")
    try:
        out = torch.empty_like(x) if out is None else op_inputs.output(out, "out")
        _module().rmsnorm(out, x, weight, eps, torch.get_num_threads())
    except Exception as error:
        op_inputs.explain(error, "cpu", x=x, weight=weight, out=out)
        raise
    return out


def fused_add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> None:
    """In place: ``residual += x``, then ``x = rmsnorm(residual, weight, eps)``.

    The norm uses the float32 sum, not its rounding stored in ``residual``
    (as FlashInfer). ``residual`` has ``x``'s shape and dtype; rows of both may
    be strided. Both are written, so neither may have a zero stride or overlap
    the other or ``weight``.

    >>> x, residual = torch.ones(1, 4), torch.ones(1, 4)
    >>> fused_add_rmsnorm(x, residual, torch.ones(4))
    >>> residual
    tensor([[2., 2., 2., 2.]])
    """
    x = op_inputs.output(x, "x")
    residual = op_inputs.output(residual, "residual")
    weight = op_inputs.tensor(weight, "weight")
    eps = op_inputs.number(eps, "eps")
    try:
        _module().fused_add_rmsnorm(x, residual, weight, eps, torch.get_num_threads())
    except Exception as error:
        op_inputs.explain(error, "cpu", x=x, residual=residual, weight=weight)
        raise
