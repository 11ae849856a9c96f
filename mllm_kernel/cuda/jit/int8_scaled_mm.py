"""W8A8 int8 GEMM for Hopper: ``int8_scaled_mm``, the original mllm-kernel's signature.

The kernel is the dense GEMM's (``csrc/gemm.cu``) instantiated for int8 operands:
int8 wgmma (m64nNk32) into int32 accumulators, then an epilogue that scales each
output by its token's and its channel's fp32 scale, adds the bias and casts to
bf16/fp16. Tiles are chosen by :func:`mllm_kernel.cuda.jit.gemm.choose_tile` from the
same configurations, counted in bytes of K. Every configuration is registered under
the kernel name ``int8_scaled_mm``, so ``python -m mllm_kernel precompile --device
cuda --arch 9.0a --kernel int8_scaled_mm`` builds them all ahead of time.
"""

from __future__ import annotations

import threading

import torch

from mllm_kernel.cuda.device_facts import require_hopper
from mllm_kernel.cuda.jit.gemm import TILES, TileChoice, choose_tile
from mllm_kernel.jit_utils import op_inputs
from mllm_kernel.jit_utils.cuda_arch import HOPPER_ONLY
from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.jit_utils.torch_op import refuse_grad, torch_op

_tracing = torch.compiler.is_dynamo_compiling

_OUT_DTYPES = (torch.bfloat16, torch.float16)


_INT8_GEMM = KernelModule(
    "int8_scaled_mm",
    device="cuda",
    sources=["gemm.cu"],
    exports=["int8_scaled_mm"],
    variants=[tile.shape_args for tile in TILES],
    archs=HOPPER_ONLY,
)


_choices: dict[tuple[int, int, int, int], TileChoice] = {}
_lock = threading.Lock()


def _choice(m: int, n: int, k: int, index: int) -> TileChoice:
    key = (m, n, k, index)
    choice = _choices.get(key)
    if choice is None:
        sms = require_hopper(index, "int8_scaled_mm").sm_count
        choice = choose_tile(m, n, k, sms, element_bytes=1)
        with _lock:
            _choices[key] = choice
    return choice


def _weight_rows(mat_a: torch.Tensor, mat_b: torch.Tensor) -> torch.Tensor:
    """``mat_b`` ([K, N], column-major) as the [N, K] row-major view the kernel reads."""
    for arg, value, shape in (("mat_a", mat_a, "[M, K]"), ("mat_b", mat_b, "[K, N]")):
        if value.dim() != 2:
            raise ValueError(
                f"argument '{arg}': expected a 2-D tensor {shape} but got shape {list(value.shape)}"
            )
    if mat_b.shape[0] != mat_a.shape[1]:
        raise ValueError(
            f"argument 'mat_b': expected K = {mat_a.shape[1]} rows (mat_a's columns) but got "
            f"shape {list(mat_b.shape)}"
        )
    if mat_b.shape[0] > 1 and mat_b.stride(0) != 1:
        raise ValueError(
            f"argument 'mat_b': expected a column-major [K, N] tensor (stride(0) == 1) but got "
            f"strides {list(mat_b.stride())}; pass weight.t() of a contiguous [N, K] weight"
        )
    return mat_b.t()


def _scale_vector(scales: torch.Tensor, arg: str, count: str) -> torch.Tensor:
    """``scales`` as a 1-D vector: [n], [n, 1], [1, n], [1] or a 0-d tensor."""
    if scales.dim() == 1:
        return scales
    if scales.dim() == 0 or (scales.dim() == 2 and 1 in scales.shape):
        return scales.reshape(-1)
    raise ValueError(
        f"argument '{arg}': expected [{count}], [{count}, 1] or [1] but got shape "
        f"{list(scales.shape)}"
    )


def _launch(
    out: torch.Tensor,
    mat_a: torch.Tensor,
    b_rows: torch.Tensor,
    scales_a: torch.Tensor,
    scales_b: torch.Tensor,
    bias: torch.Tensor | None,
    choice: TileChoice,
) -> torch.Tensor:
    module = _INT8_GEMM[(mat_a.get_device(), *choice.tile.shape_args)]
    module.int8_scaled_mm(
        out, mat_a, b_rows, scales_a, scales_b, bias, choice.split, choice.group_rows
    )
    return out


def int8_scaled_mm(
    mat_a: torch.Tensor,
    mat_b: torch.Tensor,
    scales_a: torch.Tensor,
    scales_b: torch.Tensor,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(mat_a @ mat_b) * scales_a[:, None] * scales_b[None, :] (+ bias)`` with int32
    accumulation, on a Hopper GPU (compute capability 9.0).

    ``mat_a`` is int8 ``[M, K]`` row-major (a row stride that is a multiple of 16 is
    fine); ``mat_b`` is int8 ``[K, N]`` column-major, that is ``weight.t()`` of a
    contiguous ``[N, K]`` weight. ``K`` must be a multiple of 16 and ``N`` of 8; any
    ``M``. ``scales_a`` holds one fp32 scale per row of ``mat_a`` (``[M]`` or
    ``[M, 1]``, as :func:`per_token_quant_int8` returns it) or one for all (``[1]``);
    ``scales_b`` one per column of ``mat_b`` (``[N]``) or ``[1]``. ``out_dtype`` is
    ``torch.bfloat16`` or ``torch.float16``; ``bias`` (``[N]``, ``out_dtype``) is added
    after the scaling. Returns a new ``[M, N]`` tensor on torch's current stream.

    Raises TypeError/ValueError naming the argument for bad inputs, and
    NotImplementedError on a GPU other than sm_90.

    >>> x_q, x_scale = per_token_quant_int8(x)  # x: [M, K] bf16
    >>> int8_scaled_mm(x_q, w_q.t(), x_scale, w_scale, torch.bfloat16).shape
    torch.Size([M, N])
    """
    if _tracing():
        return INT8_SCALED_MM_OP(mat_a, mat_b, scales_a, scales_b, out_dtype, bias)
    mat_a, mat_b = op_inputs.tensor(mat_a, "mat_a"), op_inputs.tensor(mat_b, "mat_b")
    scales_a = op_inputs.tensor(scales_a, "scales_a")
    scales_b = op_inputs.tensor(scales_b, "scales_b")
    bias = op_inputs.optional_tensor(bias, "bias")
    refuse_grad("int8_scaled_mm", scales_a, scales_b, bias)
    if out_dtype not in _OUT_DTYPES:
        raise ValueError(
            f"argument 'out_dtype': expected torch.bfloat16 or torch.float16 but got {out_dtype!r}"
        )
    # Shapes and layouts are wrong on any device: refused before the device is looked at.
    b_rows = _weight_rows(mat_a, mat_b)
    scales_a = _scale_vector(scales_a, "scales_a", "M")
    scales_b = _scale_vector(scales_b, "scales_b", "N")
    try:
        index = mat_a.get_device()
        if index < 0:
            op_inputs.check_device("cuda", mat_a=mat_a)
        m, k = mat_a.shape
        n = b_rows.shape[0]
        choice = _choices.get((m, n, k, index)) or _choice(m, n, k, index)
        out = torch.empty((m, n), dtype=out_dtype, device=mat_a.device)
        return _launch(out, mat_a, b_rows, scales_a, scales_b, bias, choice)
    except Exception as error:
        op_inputs.explain(
            error,
            "cuda",
            mat_a=mat_a,
            mat_b=mat_b,
            scales_a=scales_a,
            scales_b=scales_b,
            bias=bias,
        )
        raise


INT8_SCALED_MM_OP = torch_op(
    "int8_scaled_mm",
    "(Tensor mat_a, Tensor mat_b, Tensor scales_a, Tensor scales_b, ScalarType out_dtype, "
    "Tensor? bias=None) -> Tensor",
    fake=lambda mat_a, mat_b, scales_a, scales_b, out_dtype, bias=None: mat_a.new_empty(
        (mat_a.shape[0], mat_b.shape[1]), dtype=out_dtype
    ),
).implement("cuda", int8_scaled_mm)
