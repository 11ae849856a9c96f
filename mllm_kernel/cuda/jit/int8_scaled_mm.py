"""W8A8 int8 GEMM: ``int8_scaled_mm`` (declared in :mod:`mllm_kernel.ops.gemm`), the
original mllm-kernel's signature; wgmma on Hopper, mma.sync elsewhere from sm_80 on
(:mod:`mllm_kernel.cuda.jit.gemm_sm80`, as
:func:`mllm_kernel.cuda.device_facts.matmul_path` decides).

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

from mllm_kernel.cuda.device_facts import matmul_path
from mllm_kernel.cuda.jit.gemm import TILES, Launch, Plan, TileChoice, choose_tile, not_matrices
from mllm_kernel.cuda.jit.gemm_sm80 import bind_int8_scaled_mm, choose_sm80_tile
from mllm_kernel.jit_utils.cuda_arch import HOPPER_ONLY
from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.ops.gemm import INT8_SCALED_MM

_INT8_GEMM = KernelModule(
    "int8_scaled_mm",
    device="cuda",
    sources=["gemm.cu"],
    exports=["int8_scaled_mm"],
    variants=[tile.shape_args for tile in TILES],
    archs=HOPPER_ONLY,
)


# (M, N, K, GPU index) -> the launch of its plan, its kernel looked up once: a call that has
# run before costs one dictionary lookup.
_plans: dict[tuple[int, int, int, int], Launch] = {}
_lock = threading.Lock()


def _plan(m: int, n: int, k: int, index: int) -> Plan:
    """The kernel and tile of an int8 ``m x n x k`` product on GPU ``index``
    (NotImplementedError below sm_80)."""
    path = matmul_path(index, "int8_scaled_mm")
    sms = path.facts.sm_count
    if path.wgmma:
        return Plan(_bind, choose_tile(m, n, k, sms, element_bytes=1))
    return Plan(bind_int8_scaled_mm, choose_sm80_tile(m, n, k, sms, element_bytes=1))


def _planned(key: tuple[int, int, int, int]) -> Launch:
    """The launch of ``key``'s plan, made once (on the first call of a shape)."""
    bind, choice = _plan(*key)
    launch = bind(choice, key[3])
    with _lock:
        _plans[key] = launch
    return launch


def _bind(choice: TileChoice, index: int) -> Launch:
    """``launch(out, mat_a, mat_b, scales_a, scales_b, bias)``: ``choice``'s kernel on GPU
    ``index``, looked up here, once; the C++ entry point checks every tensor (``mat_b`` as
    the caller passes it: ``[K, N]``, column-major)."""
    kernel = _INT8_GEMM[(index, *choice.tile.shape_args)].int8_scaled_mm
    split, group_rows = choice.split, choice.group_rows

    def launch(out, mat_a, mat_b, scales_a, scales_b, bias):
        kernel(out, mat_a, mat_b, scales_a, scales_b, bias, split, group_rows)

    return launch


def _launch(
    out: torch.Tensor,
    mat_a: torch.Tensor,
    mat_b: torch.Tensor,
    scales_a: torch.Tensor,
    scales_b: torch.Tensor,
    bias: torch.Tensor | None,
    choice: TileChoice,
) -> torch.Tensor:
    """``choice``'s kernel on ``mat_a``'s GPU (:func:`_bind`), into ``out``, returned: a
    tile of the caller's choosing, for tests and benchmarks."""
    _bind(choice, mat_a.get_device())(out, mat_a, mat_b, scales_a, scales_b, bias)
    return out


@INT8_SCALED_MM.kernel("cuda")
def int8_scaled_mm(mat_a, mat_b, scales_a, scales_b, out_dtype, bias):
    """GPUs of compute capability 8.0 and newer (NotImplementedError on an older one):
    wgmma on Hopper with sm_90a code, mma.sync elsewhere; on torch's current stream of
    ``mat_a``'s GPU.

    >>> x_q, x_scale = per_token_quant_int8(x)  # x: [M, K] bf16
    >>> int8_scaled_mm(x_q, w_q.t(), x_scale, w_scale, torch.bfloat16).shape
    torch.Size([M, N])
    """
    try:  # unpacking the sizes the plan is chosen from checks their ranks
        (m, k), (_, n) = mat_a.shape, mat_b.shape
    except ValueError:
        not_matrices(mat_a=(mat_a, "[M, K]"), mat_b=(mat_b, "[K, N]"))
    key = (m, n, k, mat_a.get_device())
    launch = _plans.get(key) or _planned(key)
    out = mat_a.new_empty(size=(m, n), dtype=out_dtype)
    launch(out, mat_a, mat_b, scales_a, scales_b, bias)
    return out
