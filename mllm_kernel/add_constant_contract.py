"""What ``add_constant``'s CPU and CUDA ops both accept for ``c``: one contract, one check."""

from __future__ import annotations

import numbers

ALLOWED_CONSTANTS = (1, 2, 4, 8, 16)


def checked_constant(c: object) -> int:
    """``c`` as an int when it is an integer (not a bool) in ALLOWED_CONSTANTS; else
    ValueError. ``1.0`` and ``True`` are refused although they compare equal to 1: ``c``
    becomes a C++ template argument, and a float there would be a silent conversion.

    >>> checked_constant(8)
    8
    """
    is_integer = type(c) is int or (isinstance(c, numbers.Integral) and not isinstance(c, bool))
    if not is_integer or c not in ALLOWED_CONSTANTS:
        raise ValueError(f"add_constant: c must be one of {ALLOWED_CONSTANTS}, got {c!r}")
    return int(c)
