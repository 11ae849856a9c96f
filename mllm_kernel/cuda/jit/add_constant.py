"""add_constant: ``src + constant`` on the GPU, the constant compile-time (one module per
value) or run-time."""

from __future__ import annotations

import torch

from mllm_kernel.cpu.jit.add_constant_contract import ALLOWED_CONSTANTS, checked_constant
from mllm_kernel.jit_utils import op_inputs
from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.jit_utils.torch_op import refuse_grad, torch_op

_tracing = torch.compiler.is_dynamo_compiling

_ADD_CONSTANT = KernelModule(
    "add_constant",
    device="cuda",
    sources=["add_constant.cu"],
    exports=["add_constant"],
    variants=[(c,) for c in ALLOWED_CONSTANTS],
    check_variant=checked_constant,
)
_ADD_CONSTANT_RUNTIME = KernelModule(
    "add_constant_runtime",
    device="cuda",
    sources=["add_constant.cu"],
    exports=[("add_constant_runtime", "mllm_kernel::cuda::add_constant_runtime<>")],
)


def add_constant(src: torch.Tensor, constant: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """``src + constant`` for ``constant`` in {1, 2, 4, 8, 16}, a compile-time constant of
    the kernel.

    int32, float32, float16 or bfloat16; any shape (contiguous). ``out``: ``src``'s
    shape and dtype, contiguous; it may be ``src`` itself, but not overlap it otherwise.
    For other constants use :func:`add_constant_runtime`.

    >>> add_constant(torch.zeros(4, dtype=torch.int32, device="cuda"), 8)
    tensor([8, 8, 8, 8], device='cuda:0', dtype=torch.int32)
    """
    if _tracing():
        return ADD_CONSTANT_OP(src, constant, out=out)
    # Hot path: an exact int is looked up as it is (True and 2.0 hash like 1 and 2, so
    # any other type goes through the full check); the module refuses other values.
    if type(constant) is not int:
        constant = checked_constant(constant)
    src = op_inputs.tensor(src, "src")
    refuse_grad("add_constant", src, out)
    try:
        # src must be contiguous: the kernel says so if not
        out = torch.empty_like(src) if out is None else op_inputs.output(out, "out")
        _ADD_CONSTANT[src.get_device(), constant].add_constant(out, src)
    except Exception as error:
        op_inputs.explain(error, "cuda", src=src, out=out)
        raise
    return out


def add_constant_runtime(
    src: torch.Tensor, constant: float, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``src + constant`` with ``constant`` passed at run time (an integer for int32 tensors).

    >>> add_constant_runtime(torch.zeros(2, device="cuda", dtype=torch.float16), 0.5)
    tensor([0.5000, 0.5000], device='cuda:0', dtype=torch.float16)
    """
    if _tracing():
        return ADD_CONSTANT_RUNTIME_OP(src, constant, out=out)
    src = op_inputs.tensor(src, "src")
    constant = op_inputs.number(constant, "constant")
    refuse_grad("add_constant_runtime", src, out)
    try:
        out = torch.empty_like(src) if out is None else op_inputs.output(out, "out")
        _ADD_CONSTANT_RUNTIME[src.get_device()].add_constant_runtime(out, src, constant)
    except Exception as error:
        op_inputs.explain(error, "cuda", src=src, out=out)
        raise
    return out


ADD_CONSTANT_OP = torch_op(
    "add_constant",
    "(Tensor src, int constant) -> Tensor",
    fake=lambda src, constant: torch.empty_like(src),
    out="out",
).implement("cuda", add_constant)
ADD_CONSTANT_RUNTIME_OP = torch_op(
    "add_constant_runtime",
    "(Tensor src, float constant) -> Tensor",
    fake=lambda src, constant: torch.empty_like(src),
    out="out",
).implement("cuda", add_constant_runtime)
