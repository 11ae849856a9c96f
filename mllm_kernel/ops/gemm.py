"""The GEMM family: dense ``gemm``, W8A8 ``int8_scaled_mm``, and the per-token int8
quantiser that feeds it."""

from __future__ import annotations

from typing import Any

import torch

from mllm_kernel.ops.op import Op, named

DTYPE_NAMES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
}


def named_dtype(value: Any, arg: str) -> torch.dtype:
    """``value`` as a torch dtype: a dtype, or anything whose ``str`` is one of
    :data:`DTYPE_NAMES` in any case (``"BF16"``, ``numpy.dtype("float16")``);
    TypeError naming ``arg`` for anything else (a wrong dtype is a TypeError throughout
    the package).

    >>> named_dtype("BF16", "dtype")
    torch.bfloat16
    """
    if isinstance(value, torch.dtype):
        return value
    dtype = DTYPE_NAMES.get(str(value).lower())
    if dtype is None:
        raise TypeError(
            f"argument '{arg}': unknown dtype {value!r}; use one of {list(DTYPE_NAMES)}"
        )
    return dtype


def gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``a @ b.T (+ bias)``, accumulated in fp32.

    ``a`` is ``[M, K]`` and ``b`` ``[N, K]`` (the ``nn.Linear`` weight layout), both
    bf16 or both fp16, with a contiguous last dim; a larger row stride (a slice of a
    bigger buffer) is fine when it is a multiple of 8 elements. ``N`` and ``K`` must
    be multiples of 8 (16-byte rows); any ``M``. Returns ``[M, N]`` in ``out_dtype``
    (the input dtype by default, or ``torch.float32``; in eager calls a dtype name such
    as ``"float32"`` is taken too, under torch.compile a dtype only), written into
    ``out`` if given (which must then have that dtype). ``bias`` (``[N]``, the output
    dtype) is added before the cast. The torch op ``torch.ops.mllm_kernel.gemm`` takes
    ``bias`` and ``out_dtype`` after ``b``, and ``out`` in its ``.out`` overload.

    Raises TypeError/ValueError naming the argument for bad inputs.
    """


def _gemm_out_dtype(value: Any) -> torch.dtype | None:
    return None if value is None else named_dtype(value, "out_dtype")


def int8_scaled_mm(
    mat_a: torch.Tensor,
    mat_b: torch.Tensor,
    scales_a: torch.Tensor,
    scales_b: torch.Tensor,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(mat_a @ mat_b) * scales_a[:, None] * scales_b[None, :] (+ bias)`` with int32
    accumulation, the original mllm-kernel's signature.

    ``mat_a`` is int8 ``[M, K]`` row-major (a row stride that is a multiple of 16 is
    fine); ``mat_b`` is int8 ``[K, N]`` column-major, that is ``weight.t()`` of a
    contiguous ``[N, K]`` weight. ``K`` must be a multiple of 16 and ``N`` of 8; any
    ``M``. ``scales_a`` holds one fp32 scale per row of ``mat_a`` (``[M]`` or
    ``[M, 1]``, as :func:`per_token_quant_int8` returns it) or one for all (``[1]``);
    ``scales_b`` one per column of ``mat_b`` (``[N]``) or ``[1]``. ``out_dtype`` is
    ``torch.bfloat16`` or ``torch.float16``; ``bias`` (``[N]``, ``out_dtype``) is added
    after the scaling. Returns a new ``[M, N]`` tensor. The int32 sums wrap, as the
    tensor cores' do, past 2^31: at K above 131071 with int8 values of -128 throughout
    (133144 with ``per_token_quant_int8``'s, whose magnitudes stop at 127).

    Raises TypeError/ValueError naming the argument for bad inputs.
    """


def per_token_quant_int8(
    x: torch.Tensor, scale_dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantises each row of ``x``'s last dim to int8 with its own scale, in one pass.

    ``scales = max(|row|) / 127`` (at least ``1e-10 / 127``) and ``x_q = round(row *
    127 / max(|row|))``, rounding halves away from zero, so ``x ~ x_q * scales`` with
    ``|x_q| <= 127``. A row holding a NaN gets a NaN scale and zeros, one holding an
    infinity an infinite scale and zeros: every product of either is NaN, not a finite
    value that hides it. ``x``: fp32, fp16 or bf16, any leading shape, any hidden size,
    the last dim contiguous. Returns ``x_q`` (int8, ``x``'s shape) and ``scales``
    (``scale_dtype``, which must be float32: ``x.shape[:-1] + (1,)``), the original
    mllm-kernel's shapes.
    """


GEMM = Op(
    gemm,
    out="out",
    fake=named(
        lambda a, b, out_dtype: a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype or a.dtype)
    ),
    convert={"out_dtype": _gemm_out_dtype},
)
# The output dtypes are refused here, on any device: the kernels see only the
# tensors these ops allocate.
INT8_SCALED_MM = Op(
    int8_scaled_mm,
    fake=named(
        lambda mat_a, mat_b, out_dtype: mat_a.new_empty(
            (mat_a.shape[0], mat_b.shape[1]), dtype=out_dtype
        )
    ),
    dtypes={"out_dtype": (torch.bfloat16, torch.float16)},
)
PER_TOKEN_QUANT_INT8 = Op(
    per_token_quant_int8,
    # New contiguous tensors, as the eager op allocates them (x's strides are not kept).
    fake=named(
        lambda x, scale_dtype: (
            x.new_empty(x.shape, dtype=torch.int8),
            x.new_empty((*x.shape[:-1], 1), dtype=scale_dtype),
        )
    ),
    dtypes={"scale_dtype": (torch.float32,)},  # the scales int8_scaled_mm reads
)
