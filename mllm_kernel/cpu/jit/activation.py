"""Gated activations on the CPU: the SwiGLU gate ``silu(input[..., :d]) * input[..., d:]``."""

from __future__ import annotations

import torch

from mllm_kernel.jit_utils import op_inputs
from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.jit_utils.torch_op import torch_op

_tracing = torch.compiler.is_dynamo_compiling

_ACTIVATION = KernelModule(
    "activation", device="cpu", sources=["activation.cpp"], exports=["silu_and_mul"]
)


def _gated_output(input: torch.Tensor) -> torch.Tensor:
    """A new ``[..., d]`` tensor for an ``[..., 2 * d]`` input (the fake implementation too)."""
    shape = (*input.shape[:-1], input.shape[-1] // 2) if input.dim() else ()
    return input.new_empty(shape)


def silu_and_mul(input: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Returns ``silu(input[..., :d]) * input[..., d:]`` for ``input`` of shape ``[..., 2 * d]``.

    float32, bfloat16 or float16, computed in float32; each row of ``input``
    contiguous (rows may be strided). ``out``: ``[..., d]``, ``input``'s dtype, no zero
    strides, not overlapping ``input``. Any DLPack tensor (a numpy array) is taken;
    the result is a torch tensor.

    >>> silu_and_mul(torch.tensor([[0.0, 3.0]]))
    tensor([[0.]])
    """
    if _tracing():
        return SILU_AND_MUL_OP(input, out=out)
    input = op_inputs.tensor(input, "input")
    if input.requires_grad and torch.is_grad_enabled():
        return SILU_AND_MUL_OP(input, out=out)  # autograd's path (see SILU_AND_MUL_OP)
    try:
        out = _gated_output(input) if out is None else op_inputs.output(out, "out")
        _ACTIVATION[()].silu_and_mul(out, input, torch.get_num_threads())
    except Exception as error:
        op_inputs.explain(error, "cpu", input=input, out=out)
        raise
    return out


# Without a backward yet (its kernels are their own change), a grad required of
# silu_and_mul is a RuntimeError that says so; the backward is passed as torch_op(...,
# autograd=).
SILU_AND_MUL_OP = torch_op(
    "silu_and_mul", "(Tensor input) -> Tensor", fake=_gated_output, out="out"
).implement("cpu", silu_and_mul)
