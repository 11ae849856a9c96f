"""Turning Python values into C++ template-argument text."""

from __future__ import annotations

import math
import numbers
import re
from typing import Any

_QUALIFIED_NAME = re.compile(r"(::)?[A-Za-z_]\w*(::[A-Za-z_]\w*)*")

# torch dtype name -> the alias defined in include/mllm_kernel/utils.hpp.
_DTYPE_ALIASES = {
    "float32": "fp32_t",
    "float64": "fp64_t",
    "float16": "fp16_t",
    "bfloat16": "bf16_t",
    "bool": "bool_t",
    "int8": "int8_t",
    "int16": "int16_t",
    "int32": "int32_t",
    "int64": "int64_t",
    "uint8": "uint8_t",
    "uint16": "uint16_t",
    "uint32": "uint32_t",
    "uint64": "uint64_t",
    "float8_e4m3fn": "fp8_e4m3_t",
    "float8_e5m2": "fp8_e5m2_t",
}

_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1


class CppArgs(list):
    """A list of C++ template arguments whose ``str()`` joins them with ``", "``.

    >>> import torch
    >>> args = make_cpp_args(16, torch.float16)
    >>> args == ["16", "fp16_t"], str(args)
    (True, '16, fp16_t')
    """

    def __str__(self) -> str:
        return ", ".join(self)


def dtype_to_cpp(dtype: Any) -> str:
    """The C++ alias of a torch dtype (``torch.float16`` -> ``"fp16_t"``)."""
    name = str(dtype).removeprefix("torch.")
    try:
        return _DTYPE_ALIASES[name]
    except KeyError:
        raise TypeError(
            f"make_cpp_args: torch dtype {dtype} has no C++ alias; supported: "
            f"{', '.join('torch.' + n for n in _DTYPE_ALIASES)}"
        ) from None


def _int_literal(value: int) -> str:
    if _INT64_MIN <= value <= _INT64_MAX:
        # Beyond int32 the literal needs a suffix to keep its value in every context.
        return str(value) if -(2**31) <= value < 2**31 else f"{value}LL"
    if 0 <= value <= _UINT64_MAX:
        return f"{value}ULL"
    raise ValueError(f"make_cpp_args: integer {value} does not fit in 64 bits")


def _float_literal(value: float) -> str:
    if math.isnan(value):
        return '__builtin_nan("")'
    if math.isinf(value):
        return "__builtin_huge_val()" if value > 0 else "-__builtin_huge_val()"
    text = repr(float(value))
    return text if any(c in text for c in ".en") else text + ".0"


def to_cpp_arg(value: Any) -> str:
    """One value as C++ text; see :func:`make_cpp_args`."""
    import torch

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, torch.dtype):
        return dtype_to_cpp(value)
    if isinstance(value, numbers.Integral):
        return _int_literal(int(value))
    if isinstance(value, numbers.Real):
        return _float_literal(float(value))
    if isinstance(value, str):
        if _QUALIFIED_NAME.fullmatch(value):
            return value
        raise ValueError(
            f"make_cpp_args: string {value!r} is not a C++ identifier or qualified name "
            "(letters, digits, '_' and '::' only); pass numbers and dtypes as such"
        )
    raise TypeError(
        f"make_cpp_args: cannot turn {value!r} (type {type(value).__name__}) into a C++ "
        "template argument; use bool, int, float, torch.dtype or a C++ identifier string"
    )


def make_cpp_args(*args: Any) -> CppArgs:
    """Template-argument text for ``args``, one string each.

    ``bool`` -> ``true``/``false``; ``int`` and ``float`` -> C++ literals;
    a ``torch.dtype`` -> its alias (``fp32_t``, ``fp16_t``, ``bf16_t``,
    ``int8_t`` ... ``uint64_t``, ``bool_t``, ``fp8_e4m3_t``, ``fp8_e5m2_t``);
    a ``str`` only if it is a C++ identifier or qualified name (``my_ns::Op``).
    Anything else raises TypeError, a malformed string ValueError.

    >>> import torch
    >>> str(make_cpp_args(16, torch.float16, True))
    '16, fp16_t, true'
    """
    return CppArgs(to_cpp_arg(a) for a in args)
