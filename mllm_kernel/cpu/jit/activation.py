"""Gated activations on the CPU: the SwiGLU gate ``silu(input[..., :d]) * input[..., d:]``."""

from __future__ import annotations

from typing import Any

import torch

from mllm_kernel.jit_utils import op_inputs
from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.jit_utils.torch_op import refuse_grad, torch_op

_tracing = torch.compiler.is_dynamo_compiling

_ACTIVATION = KernelModule(
    "activation",
    device="cpu",
    sources=["activation.cpp"],
    exports=["silu_and_mul", "silu_and_mul_backward"],
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
    if (input.requires_grad or getattr(out, "requires_grad", False)) and torch.is_grad_enabled():
        return SILU_AND_MUL_OP(input, out=out)  # autograd's path (see SILU_AND_MUL_OP)
    try:
        out = _gated_output(input) if out is None else op_inputs.output(out, "out")
        _ACTIVATION[()].silu_and_mul(out, input, torch.get_num_threads())
    except Exception as error:
        op_inputs.explain(error, "cpu", input=input, out=out)
        raise
    return out


def silu_and_mul_backward(grad_output: torch.Tensor, input: torch.Tensor) -> torch.Tensor:
    """The gradient of :func:`silu_and_mul` with respect to ``input`` (``[..., 2 * d]``)
    for ``grad_output`` (``[..., d]``, ``input``'s dtype): with ``s = sigmoid(gate)``,
    ``[grad_output * up * s * (1 + gate * (1 - s)) | grad_output * silu(gate)]``, in
    float32. What ``silu_and_mul(...).backward()`` runs.

    >>> silu_and_mul_backward(torch.ones(1, 1), torch.tensor([[0.0, 3.0]]))
    tensor([[1.5000, 0.0000]])
    """
    if _tracing():
        return SILU_AND_MUL_BACKWARD_OP(grad_output, input)
    grad_output = op_inputs.tensor(grad_output, "grad_output")
    input = op_inputs.tensor(input, "input")
    refuse_grad("silu_and_mul_backward", grad_output, input)
    try:
        grad_input = torch.empty_like(input)
        _ACTIVATION[()].silu_and_mul_backward(
            grad_input, grad_output, input, torch.get_num_threads()
        )
    except Exception as error:
        op_inputs.explain(error, "cpu", grad_output=grad_output, input=input)
        raise
    return grad_input


def _save_for_backward(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    ctx.save_for_backward(inputs[0])


def _backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
    """silu_and_mul_backward on the device of the tensors (either device's op)."""
    (input,) = ctx.saved_tensors
    return torch.ops.mllm_kernel.silu_and_mul_backward(grad.contiguous(), input)


# The one declaration of silu_and_mul's autograd on both devices (the CUDA file imports it).
SILU_AND_MUL_AUTOGRAD = (_backward, _save_for_backward)
SILU_AND_MUL_OP = torch_op(
    "silu_and_mul",
    "(Tensor input) -> Tensor",
    fake=_gated_output,
    out="out",
    autograd=SILU_AND_MUL_AUTOGRAD,
).implement("cpu", silu_and_mul)
SILU_AND_MUL_BACKWARD_OP = torch_op(
    "silu_and_mul_backward",
    "(Tensor grad_output, Tensor input) -> Tensor",
    fake=lambda grad_output, input: torch.empty_like(input),
).implement("cpu", silu_and_mul_backward)
