"""Gated activations: ``act(input[..., :d]) * input[..., d:]`` for silu (differentiable),
gelu and gelu-tanh, and silu's backward."""

from __future__ import annotations

from typing import Any

import torch

from mllm_kernel.ops.op import Op, like


def gated_output(input: torch.Tensor) -> torch.Tensor:
    """A new ``[..., d]`` tensor for an ``[..., 2 * d]`` input (the fake implementation
    too)."""
    shape = (*input.shape[:-1], input.shape[-1] // 2) if input.dim() else ()
    return input.new_empty(shape)


def silu_and_mul(input: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Returns ``silu(input[..., :d]) * input[..., d:]`` for ``input`` of shape
    ``[..., 2 * d]``, computed in float32.

    float32, bfloat16 or float16. ``out``: ``[..., d]``, ``input``'s dtype, no zero
    strides, not overlapping ``input``. Any DLPack tensor is taken; the result is a
    torch tensor. Differentiable (``silu_and_mul_backward``).
    """


def gelu_and_mul(input: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``gelu(input[..., :d]) * input[..., d:]`` with the exact (erf) gelu; ``out`` as for
    ``silu_and_mul``."""


def gelu_tanh_and_mul(input: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``gelu(input[..., :d]) * input[..., d:]`` with gelu's tanh approximation; ``out`` as
    for ``silu_and_mul``."""


def silu_and_mul_backward(grad_output: torch.Tensor, input: torch.Tensor) -> torch.Tensor:
    """The gradient of ``silu_and_mul`` with respect to ``input`` (``[..., 2 * d]``) for
    ``grad_output`` (``[..., d]``, ``input``'s dtype): with ``s = sigmoid(gate)``,
    ``[grad_output * up * s * (1 + gate * (1 - s)) | grad_output * silu(gate)]``, in
    float32. What ``silu_and_mul(...).backward()`` runs.
    """


def _save_for_backward(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    ctx.save_for_backward(inputs[0])


def _backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
    """silu_and_mul_backward on the device of the tensors."""
    (input,) = ctx.saved_tensors
    return SILU_AND_MUL_BACKWARD.torch_op(grad.contiguous(), input)


SILU_AND_MUL = Op(
    silu_and_mul, out="out", fake=gated_output, autograd=(_backward, _save_for_backward)
)
GELU_AND_MUL = Op(gelu_and_mul, out="out", fake=gated_output)
GELU_TANH_AND_MUL = Op(gelu_tanh_and_mul, out="out", fake=gated_output)
SILU_AND_MUL_BACKWARD = Op(silu_and_mul_backward, fake=like("input"))
