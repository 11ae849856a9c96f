"""What the CPU and CUDA ``add_constant`` ops accept for ``constant``: one contract, one check."""

from __future__ import annotations

import numbers

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
