"""softmax along any dim on the CPU, computed in float32."""

from __future__ import annotations

import torch

from mllm_kernel.cpu.jit.compile_flags import CXX_FLAGS, LDFLAGS
from mllm_kernel.jit_utils import cache_once, load_cpu_jit, op_inputs, register_kernel


@register_kernel("softmax", device="cpu", variants=[()])
@cache_once
def _module():
    return load_cpu_jit(
        "softmax",
        cpp_files=["softmax.cpp"],
        cpp_wrappers=[("softmax", "mllm_kernel::cpu::softmax")],
        extra_cxx_flags=CXX_FLAGS,
        extra_ldflags=LDFLAGS,
    )


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Returns ``exp(x) / exp(x).sum(dim, keepdim=True)`` in ``x``'s dtype.

    float32, bfloat16 or float16, any shape and strides. Fastest along a
    contiguous dim (the last one, usually); other dims are read strided. A
    ``dim`` out of range raises IndexError, as torch.softmax does.

    >>> softmax(torch.zeros(2, 2))
    tensor([[0.5000, 0.5000],
            [0.5000, 0.5000]])
    """
    x = op_inputs.tensor(x, "x")
    if type(dim) is not int or dim != -1:
        dim = op_inputs.dim(dim, x.dim())
    try:
        out = torch.empty_like(x)
        if dim in (-1, x.dim() - 1):
            _module().softmax(out, x, torch.get_num_threads())
        else:  # the kernel normalises the last dim: move `dim` there (views, no copies)
            _module().softmax(out.movedim(dim, -1), x.movedim(dim, -1), torch.get_num_threads())
    except Exception as error:
        op_inputs.explain(error, "cpu", x=x)
        raise
    return out
