"""add_constant: ``src + constant`` element-wise, the constant compile-time or run-time."""

from __future__ import annotations

import numbers

import torch

from mllm_kernel.ops.op import Op, like

ALLOWED_CONSTANTS = (1, 2, 4, 8, 16)


def checked_constant(constant: object) -> int:
    """``constant`` as an int when it is an integer (not a bool) in ALLOWED_CONSTANTS.

    TypeError when ``constant`` is not a number (``bool`` and ``str`` included); ValueError
    for any other number, pointing at ``add_constant_runtime``. ``1.0`` is refused
    although it equals 1: ``constant`` becomes a C++ template argument, and a float there
    would be a silent conversion.

    >>> checked_constant(8)
    8
    """
    if isinstance(constant, bool) or not isinstance(constant, numbers.Real):
        raise TypeError(
            f"add_constant: argument 'constant': expected an int but got {type(constant).__name__}"
        )
    if not isinstance(constant, numbers.Integral) or constant not in ALLOWED_CONSTANTS:
        raise ValueError(
            f"add_constant: constant must be one of {ALLOWED_CONSTANTS} (one compiled kernel "
            f"each), got {constant!r}; for any other value call add_constant_runtime(src, constant)"
        )
    return int(constant)


def add_constant(src: torch.Tensor, constant: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Returns ``src + constant`` for ``constant`` in {1, 2, 4, 8, 16}, one compiled kernel
    per value.

    ``out``: written in place if given (``src``'s shape and dtype, no zero strides); it
    may be ``src`` itself, but not overlap ``src`` otherwise. For other constants use
    ``add_constant_runtime``. Any DLPack tensor (a numpy array, a CuPy array) is taken;
    the result is a torch tensor.
    """


def add_constant_runtime(
    src: torch.Tensor, constant: float, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Returns ``src + constant`` for any number ``constant`` (one kernel for every value).

    ``constant``: an int or float (not a bool or str). ``out`` as for ``add_constant``.
    """


# A hot exact int skips the call (the generated fast path); only the values the
# kernels are compiled for pass, so the module memo never sees another.
ADD_CONSTANT = Op(add_constant, out="out", fake=like("src"), convert={"constant": checked_constant})
ADD_CONSTANT_RUNTIME = Op(add_constant_runtime, out="out", fake=like("src"))
