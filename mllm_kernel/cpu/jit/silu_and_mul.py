"""silu_and_mul: the SwiGLU gate ``silu(x[..., :d]) * x[..., d:]`` on the CPU."""

from __future__ import annotations

import torch

from mllm_kernel.cpu.jit.compile_flags import CXX_FLAGS, LDFLAGS
from mllm_kernel.jit_utils import cache_once, load_cpu_jit, op_inputs, register_kernel


@register_kernel("silu_and_mul", device="cpu", variants=[()])
@cache_once
def _module():
    return load_cpu_jit(
        "silu_and_mul",
        cpp_files=["silu_and_mul.cpp"],
        cpp_wrappers=[("silu_and_mul", "mllm_kernel::cpu::silu_and_mul")],
        extra_cxx_flags=CXX_FLAGS,
        extra_ldflags=LDFLAGS,
    )


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Returns ``silu(x[..., :d]) * x[..., d:]`` for ``x`` of shape ``[..., 2 * d]``.

    float32, bfloat16 or float16, computed in float32; each row of ``x``
    contiguous (rows may be strided). ``out``: ``[..., d]``, ``x``'s dtype, no zero
    strides, not overlapping ``x``.

    >>> silu_and_mul(torch.tensor([[0.0, 3.0]]))
    tensor([[0.]])
    """
    x = op_inputs.tensor(x, "x")
    try:
        if out is None:
            shape = (*x.shape[:-1], x.shape[-1] // 2) if x.dim() else ()
            out = x.new_empty(shape)
        else:
            out = op_inputs.output(out, "out")
        _module().silu_and_mul(out, x, torch.get_num_threads())
    except Exception as error:
        op_inputs.explain(error, "cpu", x=x, out=out)
        raise
    return out
