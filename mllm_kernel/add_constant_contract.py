"""What ``add_constant``'s CPU and CUDA ops both accept for ``c``: one contract, one check."""

from __future__ import annotations

import numbers

ALLOWED_CONSTANTS = (1, 2, 4, 8, 16)


def checked_constant(c: object) -> int:
    """``c`` as an int when it is an integer (not a bool) in ALLOWED_CONSTANTS.

    TypeError when ``c`` is not a number (``bool`` and ``str`` included); ValueError
    for any other number, pointing at ``add_constant_runtime``. ``1.0`` is refused
    although it equals 1: ``c`` becomes a C++ template argument, and a float there
    would be a silent conversion.

    >>> checked_constant(8)
    8
    """
    if isinstance(c, bool) or not isinstance(c, numbers.Real):
        raise TypeError(f"add_constant: argument 'c': expected an int but got {type(c).__name__}")
    if not isinstance(c, numbers.Integral) or c not in ALLOWED_CONSTANTS:
        raise ValueError(
            f"add_constant: c must be one of {ALLOWED_CONSTANTS} (one compiled kernel each), "
            f"got {c!r}; for any other value call add_constant_runtime(x, c)"
        )
    return int(c)
