"""Gated activations: ``act(x[..., :d]) * x[..., d:]`` for silu, gelu and gelu-tanh."""

from __future__ import annotations

import torch

from mllm_kernel.cuda.jit.device_module import module_for
from mllm_kernel.jit_utils import cache_once, load_cuda_jit, op_inputs, register_kernel

_OPS = ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul")


@register_kernel("activation", device="cuda", variants=[()])
@cache_once
def _module():
    return load_cuda_jit(
        "activation",
        cuda_files=["activation.cu"],
        cuda_wrappers=[(op, f"mllm_kernel::cuda::{op}") for op in _OPS],
    )


def _run(op: str, input: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """``out`` (``[..., d]``, ``input``'s dtype, no zero strides, not overlapping ``input``)
    or a new tensor, written by ``op``."""
    input = op_inputs.tensor(input, "input")
    try:
        if out is None:
            out = input.new_empty((*input.shape[:-1], input.shape[-1] // 2))
        else:
            out = op_inputs.output(out, "out")
        getattr(module_for(_module, input), op)(out, input)
    except Exception as error:
        op_inputs.explain(error, "cuda", input=input, out=out)
        raise
    return out


def silu_and_mul(input: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(input[..., :d]) * input[..., d:]`` for ``input`` of shape ``[..., 2d]``.

    >>> silu_and_mul(torch.randn(8, 2 * 11008, device="cuda", dtype=torch.bfloat16)).shape
    torch.Size([8, 11008])
    """
    return _run("silu_and_mul", input, out)


def gelu_and_mul(input: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``gelu(input[..., :d]) * input[..., d:]`` with the exact (erf) gelu.

    >>> gelu_and_mul(torch.randn(2, 8, device="cuda")).shape
    torch.Size([2, 4])
    """
    return _run("gelu_and_mul", input, out)


def gelu_tanh_and_mul(input: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``gelu(input[..., :d]) * input[..., d:]`` with gelu's tanh approximation.

    >>> gelu_tanh_and_mul(torch.randn(2, 8, device="cuda")).shape
    torch.Size([2, 4])
    """
    return _run("gelu_tanh_and_mul", input, out)
