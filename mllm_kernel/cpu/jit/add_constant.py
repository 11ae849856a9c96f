"""add_constant: ``x + c`` with ``c`` a compile-time constant."""

from __future__ import annotations

import torch

from mllm_kernel.jit_utils import cache_once, load_cpu_jit, make_cpp_args, register_kernel

ALLOWED_CONSTANTS = (1, 2, 4, 8, 16)


@register_kernel("add_constant", device="cpu", variants=[(c,) for c in ALLOWED_CONSTANTS])
@cache_once
def _module(c: int):
    args = make_cpp_args(c)
    return load_cpu_jit(
        "add_constant",
        *args,
        cpp_files=["add_constant.cpp"],
        cpp_wrappers=[("add_constant", f"mllm_kernel::cpu::add_constant<{args}>")],
    )


def add_constant(x: torch.Tensor, c: int) -> torch.Tensor:
    """Returns ``x + c`` for ``c`` in {1, 2, 4, 8, 16} (one compiled kernel per ``c``).

    >>> add_constant(torch.zeros(3), 8)
    tensor([8., 8., 8.])
    """
    if c not in ALLOWED_CONSTANTS or isinstance(c, bool):
        raise ValueError(f"add_constant: c must be one of {ALLOWED_CONSTANTS}, got {c!r}")
    out = torch.empty_like(x)
    _module(c).add_constant(out, x)
    return out
