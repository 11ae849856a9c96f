"""Gated activations: ``act(input[..., :d]) * input[..., d:]`` for silu, gelu and gelu-tanh."""

from __future__ import annotations

import torch

from mllm_kernel.cpu.jit.activation import SILU_AND_MUL_AUTOGRAD, SILU_AND_MUL_BACKWARD_OP
from mllm_kernel.jit_utils import op_inputs
from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.jit_utils.torch_op import refuse_grad, torch_op

_tracing = torch.compiler.is_dynamo_compiling

_ACTIVATION = KernelModule(
    "activation",
    device="cuda",
    sources=["activation.cu"],
    exports=["silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul", "silu_and_mul_backward"],
)


def _gated_output(input: torch.Tensor) -> torch.Tensor:
    """A new ``[..., d]`` tensor for an ``[..., 2 * d]`` input (the fake implementation too)."""
    shape = (*input.shape[:-1], input.shape[-1] // 2) if input.dim() else ()
    return input.new_empty(shape)


def _run(op: str, input: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """``out`` (``[..., d]``, ``input``'s dtype, no zero strides, not overlapping ``input``)
    or a new tensor, written by ``op``."""
    input = op_inputs.tensor(input, "input")
    if (input.requires_grad or getattr(out, "requires_grad", False)) and torch.is_grad_enabled():
        return _OPS[op](input, out=out)  # autograd's path: a clear error without a backward
    try:
        out = _gated_output(input) if out is None else op_inputs.output(out, "out")
        getattr(_ACTIVATION[input.get_device()], op)(out, input)
    except Exception as error:
        op_inputs.explain(error, "cuda", input=input, out=out)
        raise
    return out


def silu_and_mul(input: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(input[..., :d]) * input[..., d:]`` for ``input`` of shape ``[..., 2d]``.

    >>> silu_and_mul(torch.randn(8, 2 * 11008, device="cuda", dtype=torch.bfloat16)).shape
    torch.Size([8, 11008])
    """
    if _tracing():
        return SILU_AND_MUL_OP(input, out=out)
    return _run("silu_and_mul", input, out)


def gelu_and_mul(input: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``gelu(input[..., :d]) * input[..., d:]`` with the exact (erf) gelu.

    >>> gelu_and_mul(torch.randn(2, 8, device="cuda")).shape
    torch.Size([2, 4])
    """
    if _tracing():
        return GELU_AND_MUL_OP(input, out=out)
    return _run("gelu_and_mul", input, out)


def gelu_tanh_and_mul(input: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``gelu(input[..., :d]) * input[..., d:]`` with gelu's tanh approximation.

    >>> gelu_tanh_and_mul(torch.randn(2, 8, device="cuda")).shape
    torch.Size([2, 4])
    """
    if _tracing():
        return GELU_TANH_AND_MUL_OP(input, out=out)
    return _run("gelu_tanh_and_mul", input, out)


def silu_and_mul_backward(grad_output: torch.Tensor, input: torch.Tensor) -> torch.Tensor:
    """The gradient of :func:`silu_and_mul` with respect to ``input`` (``[..., 2d]``) for
    ``grad_output`` (``[..., d]``, ``input``'s dtype), in float32 (the formula is
    :func:`mllm_kernel.cpu.jit.silu_and_mul_backward`'s). What
    ``silu_and_mul(...).backward()`` runs.

    >>> silu_and_mul_backward(torch.ones(8, 11008, device="cuda"),
    ...                       torch.randn(8, 2 * 11008, device="cuda")).shape
    torch.Size([8, 22016])
    """
    if _tracing():
        return SILU_AND_MUL_BACKWARD_OP(grad_output, input)
    grad_output = op_inputs.tensor(grad_output, "grad_output")
    input = op_inputs.tensor(input, "input")
    refuse_grad("silu_and_mul_backward", grad_output, input)
    try:
        grad_input = torch.empty_like(input)
        _ACTIVATION[input.get_device()].silu_and_mul_backward(grad_input, grad_output, input)
    except Exception as error:
        op_inputs.explain(error, "cuda", grad_output=grad_output, input=input)
        raise
    return grad_input


SILU_AND_MUL_OP = torch_op(
    "silu_and_mul",
    "(Tensor input) -> Tensor",
    fake=_gated_output,
    out="out",
    autograd=SILU_AND_MUL_AUTOGRAD,
).implement("cuda", silu_and_mul)
# The CPU file declares the op (schema, fake); this is its CUDA kernel.
SILU_AND_MUL_BACKWARD_OP.implement("cuda", silu_and_mul_backward)
GELU_AND_MUL_OP = torch_op(
    "gelu_and_mul", "(Tensor input) -> Tensor", fake=_gated_output, out="out"
).implement("cuda", gelu_and_mul)
GELU_TANH_AND_MUL_OP = torch_op(
    "gelu_tanh_and_mul", "(Tensor input) -> Tensor", fake=_gated_output, out="out"
).implement("cuda", gelu_tanh_and_mul)
_OPS = {
    "silu_and_mul": SILU_AND_MUL_OP,
    "gelu_and_mul": GELU_AND_MUL_OP,
    "gelu_tanh_and_mul": GELU_TANH_AND_MUL_OP,
}
