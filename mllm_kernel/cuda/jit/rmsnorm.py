"""RMSNorm on the GPU: plain, fused with the residual add (in place), and gated by silu(z)."""

from __future__ import annotations

import torch

from mllm_kernel.cpu.jit.rmsnorm import RMSNORM_AUTOGRAD, RMSNORM_BACKWARD_OP
from mllm_kernel.jit_utils import op_inputs
from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.jit_utils.torch_op import refuse_grad, torch_op

_tracing = torch.compiler.is_dynamo_compiling

_RMSNORM = KernelModule(
    "rmsnorm",
    device="cuda",
    sources=["rmsnorm.cu"],
    exports=[
        "rmsnorm",
        "fused_add_rmsnorm",
        "rms_norm_gated",
        "rmsnorm_backward",
        "rmsnorm_backward_workspace_rows",
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
    ``input`` or ``weight`` otherwise. Any DLPack tensor (CuPy, JAX) is taken; the
    result is a torch tensor.

    >>> x = torch.randn(4, 4096, dtype=torch.bfloat16, device="cuda")
    >>> rmsnorm(x, torch.ones(4096, dtype=torch.bfloat16, device="cuda")).shape
    torch.Size([4, 4096])
    """
    if _tracing():
        return RMSNORM_OP(input, weight, eps, out=out)
    input = op_inputs.tensor(input, "input")
    weight = op_inputs.tensor(weight, "weight")
    if torch.is_grad_enabled() and (
        input.requires_grad or weight.requires_grad or getattr(out, "requires_grad", False)
    ):
        return RMSNORM_OP(input, weight, eps, out=out)  # autograd's path (see RMSNORM_OP)
    eps = op_inputs.number(eps, "eps")
    try:
        out = torch.empty_like(input) if out is None else op_inputs.output(out, "out")
        _RMSNORM[input.get_device()].rmsnorm(out, input, weight, eps)
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
    if _tracing():
        return FUSED_ADD_RMSNORM_OP(input, residual, weight, eps)
    input = op_inputs.output(input, "input")
    residual = op_inputs.output(residual, "residual")
    weight = op_inputs.tensor(weight, "weight")
    eps = op_inputs.number(eps, "eps")
    refuse_grad("fused_add_rmsnorm", input, residual, weight)
    try:
        _RMSNORM[input.get_device()].fused_add_rmsnorm(input, residual, weight, eps)
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
    if _tracing():
        return RMS_NORM_GATED_OP(x, weight, z, eps, out=out)
    x = op_inputs.tensor(x, "x")
    weight = op_inputs.tensor(weight, "weight")
    z = op_inputs.optional_tensor(z, "z")
    eps = op_inputs.number(eps, "eps")
    refuse_grad("rms_norm_gated", x, weight, z, out)
    try:
        out = torch.empty_like(x) if out is None else op_inputs.output(out, "out")
        module = _RMSNORM[x.get_device()]
        if z is None:
            module.rmsnorm(out, x, weight, eps)
        else:
            module.rms_norm_gated(out, x, z, weight, eps)
    except Exception as error:
        op_inputs.explain(error, "cuda", x=x, z=z, weight=weight, out=out)
        raise
    return out


def rmsnorm_backward(
    grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of :func:`rmsnorm` for ``grad_output`` (``input``'s shape and dtype):
    ``(grad_input, grad_weight)`` in ``input``'s and ``weight``'s dtypes, float32 math
    (the formulas are :func:`mllm_kernel.cpu.jit.rmsnorm_backward`'s). ``grad_weight``'s
    row sum is deterministic: per-CTA float32 partials in a workspace, added in row
    order by a second kernel (no atomics). What ``rmsnorm(...).backward()`` runs.

    >>> x = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16)
    >>> w = torch.ones(4096, device="cuda", dtype=torch.bfloat16)
    >>> [g.shape for g in rmsnorm_backward(torch.ones_like(x), x, w)]
    [torch.Size([8, 4096]), torch.Size([4096])]
    """
    if _tracing():
        return RMSNORM_BACKWARD_OP(grad_output, input, weight, eps)
    grad_output = op_inputs.tensor(grad_output, "grad_output")
    input = op_inputs.tensor(input, "input")
    weight = op_inputs.tensor(weight, "weight")
    eps = op_inputs.number(eps, "eps")
    refuse_grad("rmsnorm_backward", grad_output, input, weight)
    try:
        module = _RMSNORM[input.get_device()]
        hidden = input.shape[-1] if input.dim() else 0
        rows = input.numel() // hidden if hidden else 0
        workspace = torch.empty(
            (module.rmsnorm_backward_workspace_rows(rows), hidden),
            dtype=torch.float32,
            device=input.device,
        )
        grad_input = torch.empty_like(input)
        grad_weight = torch.empty(weight.shape, dtype=torch.float32, device=weight.device)
        module.rmsnorm_backward(grad_input, grad_weight, workspace, grad_output, input, weight, eps)
    except Exception as error:
        op_inputs.explain(error, "cuda", grad_output=grad_output, input=input, weight=weight)
        raise
    return grad_input, grad_weight.to(weight.dtype)


RMSNORM_OP = torch_op(
    "rmsnorm",
    "(Tensor input, Tensor weight, float eps=1e-06) -> Tensor",
    fake=lambda input, weight, eps=1e-6: torch.empty_like(input),
    out="out",
    autograd=RMSNORM_AUTOGRAD,
).implement("cuda", rmsnorm)
# The CPU file declares the op (schema, fake); this is its CUDA kernel.
RMSNORM_BACKWARD_OP.implement("cuda", rmsnorm_backward)
FUSED_ADD_RMSNORM_OP = torch_op(
    "fused_add_rmsnorm",
    "(Tensor(a!) input, Tensor(b!) residual, Tensor weight, float eps=1e-06) -> ()",
).implement("cuda", fused_add_rmsnorm)
RMS_NORM_GATED_OP = torch_op(
    "rms_norm_gated",
    "(Tensor x, Tensor weight, Tensor? z=None, float eps=1e-06) -> Tensor",
    fake=lambda x, weight, z=None, eps=1e-6: torch.empty_like(x),
    out="out",
).implement("cuda", rms_norm_gated)
