"""Scalar types of quantized weights and their integer ids (``b_q_type_id``).

A quantized weight type is described by its exponent and mantissa widths, a sign,
a bias (stored value = value + bias: ``uint4b8`` stores -8..7 as 0..15), whether it
has infinities and how it encodes NaN. ``ScalarType.id`` packs those fields into one
int64, least significant first: exponent (8 bits), mantissa (8), signed (1),
bias (32), finite_values_only (1), nan_repr (8); the ids therefore equal those of
vLLM's and the original mllm-kernel's ``ScalarType``, and kernels take them as
``b_q_type_id``.

>>> from mllm_kernel.cuda.jit.scalar_type import scalar_types
>>> scalar_types.uint4b8.id
1125899907892224
>>> scalar_types.uint4b8.size_bits, scalar_types.uint4b8.bias
(4, 8)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from types import SimpleNamespace


class NanRepr(IntEnum):
    """How a floating-point type encodes NaN."""

    NONE = 0  # no NaN
    IEEE_754 = 1  # exponent all ones, mantissa not all zeros
    EXTD_RANGE_MAX_MIN = 2  # exponent and mantissa all ones


# (field, width in bits) in the order the id packs them, least significant first.
_ID_FIELDS = (
    ("exponent", 8),
    ("mantissa", 8),
    ("signed", 1),
    ("bias", 32),
    ("finite_values_only", 1),
    ("nan_repr", 8),
)


@dataclass(frozen=True)
class ScalarType:
    """One scalar type; ``mantissa`` counts the value bits of an integer type (sign excluded)."""

    exponent: int
    mantissa: int
    signed: bool
    bias: int
    finite_values_only: bool = False
    nan_repr: NanRepr = NanRepr.IEEE_754

    @property
    def id(self) -> int:
        """The packed id kernels take as ``b_q_type_id``."""
        value, offset = 0, 0
        for field, width in _ID_FIELDS:
            value |= (int(getattr(self, field)) & ((1 << width) - 1)) << offset
            offset += width
        return value

    @classmethod
    def from_id(cls, type_id: int) -> ScalarType:
        """The type whose :attr:`id` is ``type_id``."""
        fields, offset = {}, 0
        for field, width in _ID_FIELDS:
            fields[field] = (type_id >> offset) & ((1 << width) - 1)
            offset += width
        if fields["bias"] >= 1 << 31:  # a signed 32-bit field
            fields["bias"] -= 1 << 32
        return cls(
            fields["exponent"],
            fields["mantissa"],
            bool(fields["signed"]),
            fields["bias"],
            bool(fields["finite_values_only"]),
            NanRepr(fields["nan_repr"]) if fields["nan_repr"] < 3 else fields["nan_repr"],
        )

    @classmethod
    def int_(cls, size_bits: int, bias: int = 0) -> ScalarType:
        """A signed integer of ``size_bits`` bits."""
        return cls(0, size_bits - 1, True, bias)

    @classmethod
    def uint(cls, size_bits: int, bias: int = 0) -> ScalarType:
        """An unsigned integer of ``size_bits`` bits, stored as value + ``bias``."""
        return cls(0, size_bits, False, bias)

    @property
    def size_bits(self) -> int:
        """Storage width in bits."""
        return self.exponent + self.mantissa + int(self.signed)

    @property
    def is_integer(self) -> bool:
        return self.exponent == 0

    def __str__(self) -> str:
        if not self.is_integer:
            name = f"float{self.size_bits}_e{self.exponent}m{self.mantissa}"
            if self.finite_values_only or self.nan_repr != NanRepr.IEEE_754:
                name += ("f" if self.finite_values_only else "") + (
                    "n" if self.nan_repr != NanRepr.NONE else ""
                )
            return name
        name = f"{'int' if self.signed else 'uint'}{self.size_bits}"
        return name + (f"b{self.bias}" if self.bias else "")


scalar_types = SimpleNamespace(
    int4=ScalarType.int_(4),
    uint4=ScalarType.uint(4),
    int8=ScalarType.int_(8),
    uint8=ScalarType.uint(8),
    # GPTQ's symmetric types: value + 8 (resp. + 128) stored unsigned.
    uint4b8=ScalarType.uint(4, 8),
    uint8b128=ScalarType.uint(8, 128),
    float8_e4m3fn=ScalarType(4, 3, True, 0, True, NanRepr.EXTD_RANGE_MAX_MIN),
    float8_e5m2=ScalarType(5, 2, True, 0),
    float16_e8m7=ScalarType(8, 7, True, 0),
    float16_e5m10=ScalarType(5, 10, True, 0),
    float4_e2m1f=ScalarType(2, 1, True, 0, True, NanRepr.NONE),
)
scalar_types.bfloat16 = scalar_types.float16_e8m7
scalar_types.float16 = scalar_types.float16_e5m10

__all__ = ["NanRepr", "ScalarType", "scalar_types"]
