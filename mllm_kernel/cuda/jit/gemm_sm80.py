"""The GEMMs' kernels for GPUs without wgmma: ``gemm`` (bf16/fp16) and ``int8_scaled_mm``
on sm_80 and newer (Ampere, Ada, Jetson Orin, Blackwell until it has a native kernel),
through cp.async, ldmatrix and mma.sync (``csrc/gemm_sm80.cu``).

Which kernels a GPU runs is decided in one place,
:func:`mllm_kernel.cuda.device_facts.matmul_path`; the ops (``jit/gemm.py``,
``jit/int8_scaled_mm.py``) then launch the tile :func:`choose_sm80_tile` picks here.
Every configuration is registered under the kernel names ``gemm_sm80`` and
``int8_scaled_mm_sm80`` (ops ``gemm`` and ``int8_scaled_mm``), so ``python -m
mllm_kernel precompile --device cuda --arch 8.0,8.6,8.7,8.9 --kernel gemm`` builds them
with the op's other kernels, for the archs each supports.

On an H100/H200 the tests run these kernels as ``compute_80`` PTX, which the driver
compiles for the GPU: ``MLLM_KERNEL_CUDA_ARCH_LIST=8.0+PTX`` (no sm_90a code, so
:func:`~mllm_kernel.cuda.device_facts.matmul_path` picks these kernels there).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from mllm_kernel.jit_utils.cuda_arch import AMPERE_OR_NEWER
from mllm_kernel.jit_utils.kernel_module import KernelModule

_DTYPES = (torch.bfloat16, torch.float16)
# A k-block is 128 bytes of each row (csrc/gemm_sm80.cu: kKBlockBytes).
_K_BLOCK_BYTES = 128
_A100_SMS = 108
# The kernel's most slices of K (kMaxSplit) and the fewest k-blocks a slice keeps (2 KB
# of each row) so that pipeline fill stays small (M = 16, N = K = 4096: split 4 beat 8).
_MAX_SPLIT = 16
_MIN_SLICE_BLOCKS = 16
# Decode splits K until the CTAs fill the SMs once: on an H100 through compute_80 PTX,
# splitting further lost (M = 1, N = 14336: split 2 took 1.25x unsplit's time).
_DECODE_CTAS_PER_SM = 1


@dataclass(frozen=True)
class Sm80Tile:
    """A compiled kernel shape (the template arguments of ``csrc/gemm_sm80.cu`` after
    the element type): ``tile_m x tile_n`` outputs per CTA, ``warps_m x warps_n`` warps
    each holding ``tile_m / warps_m x tile_n / warps_n``, ``stages`` k-blocks of
    128 bytes of K in the cp.async ring."""

    name: str
    tile_m: int
    tile_n: int
    warps_m: int
    warps_n: int
    stages: int

    @cached_property
    def shape_args(self) -> tuple[int, int, int, int, int]:
        """The template arguments after the element type (``int8_scaled_mm`` has none)."""
        return (self.tile_m, self.tile_n, self.warps_m, self.warps_n, self.stages)

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory a CTA needs: its stages (``kSharedBytes``)."""
        return self.stages * (self.tile_m + self.tile_n) * _K_BLOCK_BYTES


SM80_TILES = (
    # Decode: a few tokens by 128 weight rows, 4 warps; 72 KB of stages.
    Sm80Tile("16x128", tile_m=16, tile_n=128, warps_m=1, warps_n=4, stages=4),
    Sm80Tile("64x128", tile_m=64, tile_n=128, warps_m=2, warps_n=2, stages=3),
    # Larger M: 8 warps of 64 x 32, 96 KB (fits every sm_80+ GPU; two CTAs an SM where
    # it has 192 KB, as Hopper does). On an H100 through compute_80 PTX it beat 128 x 256
    # tiles (8 warps of 64 x 64, one CTA an SM) and 128 x 128 tiles of 4 warps at every
    # shape timed, bf16 and int8 (benchmarks/RESULTS.md).
    Sm80Tile("128x128", tile_m=128, tile_n=128, warps_m=2, warps_n=4, stages=3),
)
_BY_NAME = {tile.name: tile for tile in SM80_TILES}


@dataclass(frozen=True)
class Sm80Choice:
    """The configuration a problem shape runs with, and its split of K."""

    tile: Sm80Tile
    split: int = 1

    def __str__(self) -> str:
        return self.tile.name + (f", split-K {self.split}" if self.split > 1 else "")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def choose_sm80_tile(
    m: int, n: int, k: int, num_sms: int = _A100_SMS, element_bytes: int = 2
) -> Sm80Choice:
    """The sm_80 kernels' tile for an ``m x n x k`` problem on ``num_sms`` SMs, with
    operands of ``element_bytes`` (2: bf16/fp16; 1: int8).

    - ``m <= 64`` (decode, small batches): the time is reading the weights. 16 or 64
      tokens by 128 weight rows a CTA; while those tiles give at most half as many CTAs
      as SMs, K is split in two (up to 16 slices), each slice keeping at least 16
      k-blocks (2 KB of each row).
    - Larger ``m``: 128 x 128 tiles.

    Tuned on an H100 running these kernels as compute_80 PTX (a proxy); not yet timed
    on an sm_80-89 GPU (see ``csrc/gemm_sm80.cu``'s note).
    """
    if m > 64:
        return Sm80Choice(_BY_NAME["128x128"])
    tile = _BY_NAME["16x128" if m <= 16 else "64x128"]
    tiles = _ceil_div(m, tile.tile_m) * _ceil_div(n, tile.tile_n)
    k_blocks = _ceil_div(k * element_bytes, _K_BLOCK_BYTES)
    split = 1
    while (
        split * 2 <= _MAX_SPLIT
        and tiles * split * 2 <= _DECODE_CTAS_PER_SM * num_sms
        and k_blocks // (split * 2) >= _MIN_SLICE_BLOCKS
    ):
        split *= 2
    return Sm80Choice(tile, split)


def workspace_bytes(choice: Sm80Choice, m: int, n: int) -> int:
    """Bytes of split-K workspace a launch needs (``csrc/gemm_sm80.cu``'s
    ``workspace_bytes``): a counter per tile, then every slice's fp32/int32 sums."""
    tile = choice.tile
    tiles = _ceil_div(m, tile.tile_m) * _ceil_div(n, tile.tile_n)
    return _ceil_div(tiles * 4, 16) * 16 + choice.split * tiles * tile.tile_m * tile.tile_n * 4


def _workspace(choice: Sm80Choice, m: int, n: int, device: torch.device) -> torch.Tensor | None:
    """The split-K workspace of a launch (None unsplit), from torch's allocator: one per
    call, so calls on different streams never share one."""
    if choice.split == 1 or m == 0:
        return None
    return torch.empty(workspace_bytes(choice, m, n), dtype=torch.uint8, device=device)


def _refuse_dtype(dtype: torch.dtype, *shape_args: Any) -> None:
    """The variant check of ``_GEMM_SM80``: one module per operand dtype."""
    if dtype not in _DTYPES:
        raise TypeError(f"argument 'a': expected dtype bfloat16 or float16 but got {dtype}")


_GEMM_SM80 = KernelModule(
    "gemm_sm80",
    device="cuda",
    op="gemm",
    sources=["gemm_sm80.cu"],
    exports=[("gemm_sm80", "mllm_kernel::cuda::sm80_gemm::gemm<{args}>")],
    variants=[(dtype, *tile.shape_args) for dtype in _DTYPES for tile in SM80_TILES],
    check_variant=_refuse_dtype,
    archs=AMPERE_OR_NEWER,
)
_INT8_SM80 = KernelModule(
    "int8_scaled_mm_sm80",
    device="cuda",
    op="int8_scaled_mm",
    sources=["gemm_sm80.cu"],
    exports=[("int8_scaled_mm_sm80", "mllm_kernel::cuda::sm80_gemm::int8_scaled_mm<{args}>")],
    variants=[tile.shape_args for tile in SM80_TILES],
    archs=AMPERE_OR_NEWER,
)


def bind_gemm(choice: Sm80Choice, index: int, dtype: torch.dtype) -> Callable[..., None]:
    """``launch(out, a, b, bias, out_dtype)``: ``choice``'s kernel for ``dtype`` operands on
    GPU ``index``, looked up here, once: ``out = a @ b.T (+ bias)`` in ``out_dtype``; the C++
    entry point checks every tensor."""
    kernel = _GEMM_SM80[(index, dtype, *choice.tile.shape_args)].gemm_sm80
    split = choice.split

    def launch(out, a, b, bias, out_dtype):
        # Sized from the operands (2-D: the op checked their ranks), so that an out of
        # another rank meets the C++ check, which names it.
        workspace = _workspace(choice, a.shape[0], b.shape[0], a.device)
        kernel(out, a, b, bias, out_dtype, split, workspace)

    return launch


def launch_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    bias: torch.Tensor | None,
    choice: Sm80Choice,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``choice``'s kernel on ``a``'s GPU (:func:`bind_gemm`): ``out = a @ b.T (+ bias)``,
    ``out`` in ``out_dtype`` (default: ``out``'s dtype), returned: a tile of the caller's
    choosing, for tests and benchmarks."""
    launch = bind_gemm(choice, a.get_device(), a.dtype)
    launch(out, a, b, bias, out.dtype if out_dtype is None else out_dtype)
    return out


def bind_int8_scaled_mm(choice: Sm80Choice, index: int) -> Callable[..., None]:
    """``launch(out, mat_a, mat_b, scales_a, scales_b, bias)``: ``choice``'s int8 kernel on
    GPU ``index``, looked up here, once; the C++ entry point checks every tensor
    (``mat_b`` as the caller passes it: ``[K, N]``, column-major)."""
    kernel = _INT8_SM80[(index, *choice.tile.shape_args)].int8_scaled_mm_sm80
    split = choice.split

    def launch(out, mat_a, mat_b, scales_a, scales_b, bias):
        workspace = _workspace(choice, mat_a.shape[0], mat_b.shape[1], mat_a.device)
        kernel(out, mat_a, mat_b, scales_a, scales_b, bias, split, workspace)

    return launch


def launch_int8_scaled_mm(
    out: torch.Tensor,
    mat_a: torch.Tensor,
    mat_b: torch.Tensor,
    scales_a: torch.Tensor,
    scales_b: torch.Tensor,
    bias: torch.Tensor | None,
    choice: Sm80Choice,
) -> torch.Tensor:
    """``choice``'s int8 kernel on ``mat_a``'s GPU (:func:`bind_int8_scaled_mm`), into
    ``out``, returned: a tile of the caller's choosing, for tests and benchmarks."""
    bind_int8_scaled_mm(choice, mat_a.get_device())(out, mat_a, mat_b, scales_a, scales_b, bias)
    return out
