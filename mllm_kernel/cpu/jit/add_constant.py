"""add_constant: ``x + c`` element-wise, with ``c`` a compile-time or run-time constant."""

from __future__ import annotations

from collections.abc import Callable

import torch

from mllm_kernel.add_constant_contract import ALLOWED_CONSTANTS, checked_constant
from mllm_kernel.cpu.jit.compile_flags import CXX_FLAGS, LDFLAGS
from mllm_kernel.jit_utils import (
    cache_once,
    load_cpu_jit,
    make_cpp_args,
    op_inputs,
    register_kernel,
)


@register_kernel("add_constant", device="cpu", variants=[(c,) for c in ALLOWED_CONSTANTS])
@cache_once
def _module(c: int):
    args = make_cpp_args(c)
    return load_cpu_jit(
        "add_constant",
        *args,
        cpp_files=["add_constant.cpp"],
        cpp_wrappers=[("add_constant", f"mllm_kernel::cpu::add_constant<{args}>")],
        extra_cxx_flags=CXX_FLAGS,
        extra_ldflags=LDFLAGS,
    )


@register_kernel("add_constant_runtime", device="cpu", variants=[()])
@cache_once
def _runtime_module():
    return load_cpu_jit(
        "add_constant_runtime",
        cpp_files=["add_constant.cpp"],
        cpp_wrappers=[("add_constant_runtime", "mllm_kernel::cpu::add_constant_runtime")],
        extra_cxx_flags=CXX_FLAGS,
        extra_ldflags=LDFLAGS,
    )


_kernels: dict[int, Callable[..., None]] = {}


def _kernel_for(c: object) -> Callable[..., None]:
    """The compiled function for ``c``, after checking ``c`` (a template argument)."""
    c = checked_constant(c)
    kernel = _kernels[c] = _module(c).add_constant
    return kernel


def add_constant(x: torch.Tensor, c: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Returns ``x + c`` for ``c`` in {1, 2, 4, 8, 16}, one compiled kernel per ``c``.

    ``x``: any shape and strides; float32, float64, bfloat16, float16, int32 or
    int64. ``out``: written in place if given (``x``'s shape and dtype, any strides
    but zero ones); it may be ``x`` itself, but not overlap ``x`` otherwise. For
    other values of ``c`` use :func:`add_constant_runtime`.

    >>> add_constant(torch.zeros(3), 8)
    tensor([8., 8., 8.])
    """
    # Hot path: one dict lookup, valid only for exact ints (True == 1 and 2.0 == 2
    # hash alike, so anything else goes through the checks in _kernel_for).
    kernel = _kernels.get(c) if type(c) is int else None
    if kernel is None:
        kernel = _kernel_for(c)
    x = op_inputs.tensor(x, "x")
    try:
        out = torch.empty_like(x) if out is None else op_inputs.output(out, "out")
        kernel(out, x, torch.get_num_threads())
    except Exception as error:
        op_inputs.explain(error, "cpu", x=x, out=out)
        raise
    return out


def add_constant_runtime(
    x: torch.Tensor, c: float, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Returns ``x + c`` for any float ``c`` (one kernel for every value).

    ``x``: any shape and strides; float32, float64, bfloat16 or float16, computed
    in float32 for the 16-bit types. Unlike torch, ``c`` is not first rounded to
    ``x``'s dtype, so 16-bit results may differ from torch's by one unit in the
    last place (they are closer to the exact sum). ``c``: an int or float (not a
    bool or str). ``out`` as for :func:`add_constant`.

    >>> add_constant_runtime(torch.zeros(2), 0.5)
    tensor([0.5000, 0.5000])
    """
    x = op_inputs.tensor(x, "x")
    c = op_inputs.number(c, "c")
    try:
        out = torch.empty_like(x) if out is None else op_inputs.output(out, "out")
        _runtime_module().add_constant_runtime(out, x, c, torch.get_num_threads())
    except Exception as error:
        op_inputs.explain(error, "cpu", x=x, out=out)
        raise
    return out
