"""``gptq_marlin_gemm`` on the GPU (declared in :mod:`mllm_kernel.ops.marlin`):
fp16/bf16 activations times 4- or 8-bit integer, fp8 e4m3 or NVFP4 weights in the Marlin
format (GPTQ and AWQ checkpoints through :func:`gptq_marlin_repack` /
:func:`awq_marlin_repack`, fp8 bytes and e2m1 nibbles through :func:`gptq_marlin_repack`
with ``num_bits=8`` / ``4``), with the original mllm-kernel's module path.

Three ways to run, chosen per call by :func:`plan` (the one place that knows):

- the streaming kernel (``csrc/gptq_marlin.cu``, mma.sync, sm_80 and newer) for small
  M, where reading the weights bounds the time: each weight byte is read once;
- on Hopper (sm_90 with sm_90a code), for M from :data:`FUSED_MIN_M` up to
  :data:`FUSED_MAX_M` (from :data:`FUSED_SPLIT_MIN_M` where its split sums meet in
  memory) and 4-bit weights without act-order or float zero points: the fused kernel
  (``csrc/gptq_marlin_wgmma.cu``), which dequantizes the weights in registers as
  wgmma's A operand, since there the tensor cores bound the time and wgmma is several
  times faster than mma.sync;
- on Hopper for the other weights (fp8 and NVFP4 among them) from M =
  :data:`DEQUANT_GEMM_MIN_M`, and for all
  from :data:`FUSED_MAX_M`: the weights are dequantized into a bf16/fp16 ``[N, K]``
  scratch and multiplied by the Hopper GEMM's kernel.

Every path's C++ entry point checks all the tensors, in one function
(``marlin_layout.cuh``'s ``check_operands``). Python looks the weight type up, picks
the zero mode, act-order and the plan (computed once per shape, GPU and weight kind:
a call that has run before costs a few dictionary lookups), and refuses only what
must be known before a kernel can be chosen. The kernels' shapes the plan relies on
are mirrored below and checked against ``marlin_config.cuh`` by
``tests/test_marlin_constants.py``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from mllm_kernel.cuda.device_facts import device_facts
from mllm_kernel.cuda.jit.gemm import run_gemm
from mllm_kernel.cuda.jit.scalar_type import ScalarType, scalar_types
from mllm_kernel.jit_utils import op_inputs
from mllm_kernel.jit_utils.cuda_arch import (
    AMPERE_OR_NEWER,
    HOPPER_ONLY,
    CudaArch,
    arch_for_capability,
    resolve_cuda_archs,
)
from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.ops.marlin import GPTQ_MARLIN_GEMM

_DTYPES = (torch.float16, torch.bfloat16)
_ROWS = (8, 16, 64)  # compiled tokens per CTA of the streaming kernel
# The streaming kernel's shapes (marlin_config.cuh): output columns per CTA
# (kStreamCols), k16 tiles per turn, where K slices start (kTurnTiles), the most slices
# summed through global memory (kMaxGlobalSplit) and in a cluster (kMaxClusterSize).
_TILE_N = 256
_SLICE_ALIGN = 4
_MAX_SPLIT = 16
_MAX_CLUSTER_SPLIT = 16
# Measured, not the kernel's limit (which is _MAX_CLUSTER_SPLIT): with 64 rows per CTA
# more slices cost more than they gain.
_MAX_CLUSTER_SPLIT_64 = 8
_MIN_SLICE_TILES = 16
_CTAS_PER_SM = 3

# M from which Hopper runs dequantize + wgmma GEMM instead of the streaming kernel.
# Measured on an H100 (bf16, uint4b8, group 128; benchmarks/RESULTS.md, session 7):
# streaming / dequant+GEMM at M = 64: 23 / 28 us (4096^2), 131 / 400 us (28672x8192);
# M = 128: 37 / 32, 258 / 426; M = 256: 55 / 39, 467 / 429, and 147 / 117 at
# 14336x4096. The streaming kernel re-reads the weights per 64 rows on mma.sync; the
# other path writes and re-reads a bf16 copy of them.
DEQUANT_GEMM_MIN_M = 256

# The M for which Hopper runs the fused kernel (4-bit weights, no act-order, no float
# zero points): FUSED_MIN_M <= M < FUSED_MAX_M; and the token tiles (wgmma's N) it is
# built with. Measured on an H100 (bf16, uint4b8, group 128; benchmarks/RESULTS.md,
# session 8):
# - fused / streaming at M = 32: 21.6 / 19.3 us (4096^2), 26.0 / 39.0 (14336 x 4096),
#   92.5 / 113.2 (28672 x 8192); at M = 64 the fused kernel won on all four shapes but
#   4096^2 (21.8 / 22.8). At M = 1 and 16 the streaming kernel beat fused tiles of 16
#   and 32 tokens (10.5 / 15.0 us at 4096^2, 58.1 / 70.7 at 28672 x 8192): not built.
# - Since the 64-token build holds two CTAs an SM (H200, session 22), fused / streaming
#   at M = 17: 16.0 / 16.9 (4096^2), 28.6 / 34.3, 38.4 / 45.4 (4096 x 14336), 81.1 /
#   103.0; at M = 24: 15.9 / 17.3, 27.3 / 35.0, 38.4 / 46.1, 81.5 / 104.8. A 32-token
#   tile (also two CTAs an SM) then took M = 17-32 from 15.8 / 26.0-28.9 / 38.0-38.2 /
#   78.1-81.3 (64-token tiles) to 12.8 / 21.0-21.1 / 33.1 / 67.0-67.1.
# - fused / dequantize + GEMM, in cuBLAS speed (session 9, TMA-store epilogue): 0.91-1.01x
#   / 0.83-0.91x at M = 2048 on all four Llama shapes; 0.90-0.93x / 0.89-0.95x at
#   M = 4096, a draw, where the dequantized copy costs little against the product and
#   the bf16 GEMM (wgmma from shared memory, persistent, multicast) runs faster per
#   flop than wgmma with A from registers.
FUSED_MIN_M = 17
# From this M the fused kernel also runs where its split's sums meet in global memory
# (the narrow layers). Fused / streaming, H200 (bf16, uint4b8, RESULTS.md, session 25),
# 4096^2: M = 8 9.9 / 9.2 us, M = 9 9.9 / 10.3, M = 16 10.0 / 11.2; 4096 x 14336: M = 9
# 20.0 / 20.9, M = 16 20.0 / 21.7; the wide layers stay streaming (28672 x 8192, M = 16:
# 59.4 / 53.4).
FUSED_SPLIT_MIN_M = 9
FUSED_MAX_M = 4096
_FUSED_TOKENS = (32, 64, 128, 256)
# The fused kernel's shapes (marlin_config.cuh's FusedConfig): weight columns per CTA
# (kCols), k per k-block (kTileK), per token tile the most K slices a launch takes
# (kMaxSplit: the summing CTA of a tile stages the others' sums in its ring of stages)
# and the floats a CTA stores its sums in where they meet in global memory
# (kPartialBytes / 4: every consumer thread's accumulators).
_FUSED_COLS = 128
_FUSED_K_BLOCK = 64
_FUSED_MAX_SPLIT = {32: 5, 64: 4, 128: 3, 256: 2}
_FUSED_PARTIAL_FLOATS = {tokens: 256 * tokens // 2 for tokens in _FUSED_TOKENS}
# The most slices that sum in a cluster wherever the CTAs fit one an SM; more sum through
# global memory there (clusters elsewhere). A cluster must fit one GPC: 32 tiles split in
# 4 in clusters of 4 paired CTAs on some SMs while others idled. Measured on an H200
# (bf16, uint4b8, RESULTS.md, session 25; clusters / global memory, us): M = 17-32,
# 4096 x 14336, 32 tiles x 4: 29.5-29.9 / 20.2-21.1; 4096^2 12.0-12.1 / 10.0-10.4; 64
# tiles x 2 (M = 128, 4096^2) 14.5 / 15.6; 48 tiles x 4 at two CTAs an SM (M = 17,
# 6144 x 4096) 12.2-12.3 / 13.9.
_FUSED_CLUSTER_SPLIT = 2
# CTAs an SM holds at once, per token tile (kCtasPerSm).
_FUSED_CTAS_PER_SM = {32: 2, 64: 2, 128: 1, 256: 1}
_FUSED_MIN_SLICE_BLOCKS = 8  # k-blocks per slice
# Slices a split into an SM's second CTA slot keeps, per token tile: 64-token partners
# send twice the 32-token ones' sums, and there a split into slices of 16 k-blocks lost
# to half as many CTAs (H200, bf16, RESULTS.md, session 23: M = 64, 6144 x 4096 split 4
# 15.3 us, split 2 14.2; 32 tokens, split 4 12.5, split 2 13.0).
_FUSED_SECOND_SLOT_MIN_BLOCKS = {32: _FUSED_MIN_SLICE_BLOCKS, 64: 32}  # others: one slot


@dataclass(frozen=True)
class WeightType:
    """How the kernel decodes one ``b_q_type_id``."""

    scalar_type: ScalarType
    bits: int
    needs_zeros: bool  # uint4 / uint8: zero points come in b_zeros
    # "fp8" (float8_e4m3fn bytes) or "fp4" (NVFP4: float4_e2m1f nibbles): the weights are
    # floats, of that zero mode; "" for integers.
    floats: str = ""


_WEIGHT_TYPES = {
    t.id: WeightType(t, t.size_bits, t.bias == 0)
    for t in (scalar_types.uint4b8, scalar_types.uint8b128, scalar_types.uint4, scalar_types.uint8)
}
_WEIGHT_TYPES[scalar_types.float8_e4m3fn.id] = WeightType(
    scalar_types.float8_e4m3fn, 8, needs_zeros=False, floats="fp8"
)
_WEIGHT_TYPES[scalar_types.float4_e2m1f.id] = WeightType(
    scalar_types.float4_e2m1f, 4, needs_zeros=False, floats="fp4"
)
# The builds' zero modes (marlin_layout.cuh's ZeroMode): the type's zero, int or float
# zero points, fp8 e4m3 values, or NVFP4's e2m1 values with fp8 scales per 16 k.
_ZERO_MODE = {"bias": 0, "int": 1, "float": 2, "fp8": 3, "fp4": 4}


def _defers_scales(dtype: torch.dtype, bits: int, act_order: bool) -> bool:
    """Whether the streaming kernel applies these weights' scales once per group
    (``kDefersScales`` in marlin_config.cuh, for 8 and 16 tokens per CTA), and so has
    an 8-token build."""
    return not act_order and (bits == 4 or dtype == torch.float16)


def _stream_variants() -> list[tuple]:
    """(dtype, bits, tokens per CTA, zero mode, act-order) the streaming kernel is built
    in: float zero points and NVFP4 only for 4-bit weights, fp8 only for 8-bit ones (both
    without act-order), act-order only with the type's zero, 8 tokens only with deferred
    scales (never fp8's nor NVFP4's)."""
    floats = (_ZERO_MODE["fp8"], _ZERO_MODE["fp4"])
    variants = []
    for dtype in _DTYPES:
        for bits in (4, 8):
            modes = [(0, False), (1, False), (0, True)]
            if bits == 4:
                modes += [(_ZERO_MODE["float"], False), (_ZERO_MODE["fp4"], False)]
            else:
                modes.append((_ZERO_MODE["fp8"], False))
            for rows in _ROWS:
                variants += [
                    (dtype, bits, rows, zero, act)
                    for zero, act in modes
                    if rows != 8 or (zero not in floats and _defers_scales(dtype, bits, act))
                ]
    return variants


_STREAM = KernelModule(
    "gptq_marlin_gemm",
    device="cuda",
    sources=["gptq_marlin.cu"],
    exports=[("stream", "mllm_kernel::cuda::gptq_marlin_gemm_stream<{args}>")],
    variants=_stream_variants(),
    archs=AMPERE_OR_NEWER,
)
# Hopper's fused path for 4-bit integer weights: (dtype, tokens per CTA, zero mode), the
# type's zero or int zero points.
_FUSED_ZERO_MODES = (_ZERO_MODE["bias"], _ZERO_MODE["int"])
_FUSED = KernelModule(
    "gptq_marlin_gemm_wgmma",
    device="cuda",
    op="gptq_marlin_gemm",
    sources=["gptq_marlin_wgmma.cu"],
    exports=[("fused", "mllm_kernel::cuda::gptq_marlin_gemm_wgmma<{args}>")],
    variants=[
        (dtype, tokens, zero)
        for dtype in _DTYPES
        for tokens in _FUSED_TOKENS
        for zero in _FUSED_ZERO_MODES
    ],
    archs=HOPPER_ONLY,
)
# The dequantize + GEMM path's dequantization: the same source as the streaming
# kernel, its own (smaller) variant set.
_DEQUANTIZE = KernelModule(
    "gptq_marlin_dequantize",
    device="cuda",
    op="gptq_marlin_gemm",
    sources=["gptq_marlin.cu"],
    exports=[("dequantize", "mllm_kernel::cuda::marlin_dequantize<{args}>")],
    variants=[
        (dtype, bits, act_order)
        for dtype in _DTYPES
        for bits in (4, 8)
        for act_order in (False, True)
    ],
    archs=AMPERE_OR_NEWER,
)


@dataclass(frozen=True)
class Plan:
    """How one call runs: the fused kernel with ``fused_tokens`` tokens per CTA (when
    not 0) and K split over ``fused_split`` CTAs, whose sums meet in a cluster or
    (``fused_sums_in_memory``) through global memory, its last ``fused_tail`` output
    tiles in a second launch split in two (in a cluster); dequantize + Hopper GEMM
    (``dequant_gemm``); or the streaming kernel with
    ``rows`` tokens per CTA and K split over ``split`` CTAs of
    ``k_tiles_per_split`` k16 tiles (summed in a cluster's shared memory when
    ``cluster``, else through global memory)."""

    dequant_gemm: bool
    rows: int = 16
    split: int = 1
    k_tiles_per_split: int = 0
    cluster: bool = False
    fused_tokens: int = 0
    fused_split: int = 1
    fused_tail: int = 0
    fused_sums_in_memory: bool = False


def plan(
    m: int, n: int, k: int, sms: int, hopper: bool, counters: int, clusters: bool = False,
    fusable: bool = False, eight_rows: bool = False,
) -> Plan:  # fmt: skip
    """The way an ``m x n x k`` product runs on a GPU of ``sms`` SMs.

    - ``hopper``, ``fusable`` weights (4-bit, no act-order, no float zero points) and
      ``FUSED_MIN_M <= m < FUSED_MAX_M``: the fused kernel, tiled by
      :func:`fused_tiling`, a split's sums meeting through global memory where it has
      more than ``_FUSED_CLUSTER_SPLIT`` slices and its CTAs fit one an SM; so split, it
      runs from ``FUSED_SPLIT_MIN_M``.
    - ``hopper`` and ``m >= DEQUANT_GEMM_MIN_M``: dequantize + wgmma GEMM.
    - Otherwise the streaming kernel, 8 (m <= 8, when ``eight_rows``: the build has
      8-token CTAs), 16 (m <= 16) or 64 tokens per CTA and ``ceil(n / 256)`` column
      tiles. Each of its warps keeps 4 (deferred scales) or 8 weight tiles in flight; a
      GPU reaches its bandwidth with some 12 warps per SM, so while the column tiles give
      fewer than ``3 * sms`` CTAs, K is split (up to 16 ways, each CTA keeping at least
      16 k16 tiles: more slices cost more in partial sums than they gain).
      With ``clusters`` (sm_90 and newer) a column tile's slices form a thread-block
      cluster and sum in its shared memory (up to 16 slices, 8 with 64 rows per CTA),
      for any number of row blocks; otherwise they sum through global memory, for
      one row block, as long as the ``counters`` entries of the workspace cover the
      column tiles.
    """
    if hopper and fusable and FUSED_SPLIT_MIN_M <= m < FUSED_MAX_M:
        tokens, split, tail = fused_tiling(m, n, k, sms)
        ctas = -(-m // tokens) * -(-n // _FUSED_COLS) * split
        in_memory = split > _FUSED_CLUSTER_SPLIT and ctas <= sms
        if m >= FUSED_MIN_M or in_memory:
            return Plan(False, fused_tokens=tokens, fused_split=split, fused_tail=tail,
                        fused_sums_in_memory=in_memory)  # fmt: skip
    if hopper and m >= DEQUANT_GEMM_MIN_M:
        return Plan(dequant_gemm=True)
    rows = 8 if m <= 8 and eight_rows else 16 if m <= 16 else 64
    k_tiles = k // 16
    column_tiles = -(-n // _TILE_N)
    row_blocks = max(1, -(-m // rows))  # an empty a: the kernel checks it and returns
    split = 1
    if clusters or (row_blocks == 1 and column_tiles <= counters):
        wanted = -(-_CTAS_PER_SM * sms // (column_tiles * row_blocks))
        if clusters:
            most = _MAX_CLUSTER_SPLIT if rows <= 16 else _MAX_CLUSTER_SPLIT_64
        else:
            most = _MAX_SPLIT
        split = max(1, min(wanted, most, k_tiles // _MIN_SLICE_TILES))
    per_split = -(-k_tiles // split)
    per_split = -(-per_split // _SLICE_ALIGN) * _SLICE_ALIGN
    split = -(-k_tiles // per_split)
    return Plan(False, rows, split, per_split, clusters and split > 1)


def _can_double_split(split: int, tokens: int, ctas: int, k_blocks: int, slots: int) -> bool:
    """Whether ``ctas`` output tiles of ``tokens`` tokens, K split ``split`` ways, may
    split twice as far: within the build's most slices, ``slots`` CTAs and slices of
    ``_FUSED_MIN_SLICE_BLOCKS`` k-blocks."""
    return (
        split * 2 <= _FUSED_MAX_SPLIT[tokens]
        and ctas * split * 2 <= slots
        and k_blocks // (split * 2) >= _FUSED_MIN_SLICE_BLOCKS
    )


def fused_tiling(m: int, n: int, k: int, sms: int) -> tuple[int, int, int]:
    """The fused kernel's tokens per CTA, K slices and tail tiles for an ``m x n x k``
    product on ``sms`` SMs.

    - The widest token tile (fewest weight re-reads, widest wgmma), none wider than the
      narrowest that holds all ``m`` tokens, whose CTAs, with K split (slices of at
      least 8 k-blocks of 64), fill 90% of the SMs; failing that, the
      narrowest tile, split as far as it goes. K is split while the CTAs stay within
      one per SM, and once more where they fill less than 90% of the SMs and a build
      of two CTAs an SM (32 and 64 tokens) holds them all at once; where that would
      cut 64-token slices below 32 k-blocks, the tile is taken as it is. Measured on
      an H200 (bf16, uint4b8, RESULTS.md, sessions 22 and 23): at M = 64, 14336 x
      4096, 112 CTAs unsplit took 26.5 us and split in two 24.4; at M = 128, 4096^2, 64
      tiles split in two took 17.5 and in four (256 CTAs, two an SM) 25.4; at M = 64,
      6144 x 4096, 48 tiles split in four (slices of 16 k-blocks) took 15.3 and in two
      14.2.
    - Unsplit tiles beyond whole waves of ``sms`` that fill at most half a wave (the
      tail) run in a second launch with K split in two, so the last wave takes about
      half as long.
    """
    tiles = sorted(_FUSED_TOKENS)
    widest = next((t for t in tiles if t >= m), tiles[-1])
    k_blocks = -(-k // _FUSED_K_BLOCK)
    for tokens in reversed([t for t in tiles if t <= widest]):
        ctas = -(-m // tokens) * -(-n // _FUSED_COLS)
        split = 1
        while _can_double_split(split, tokens, ctas, k_blocks, sms):
            split *= 2
        slots = sms * _FUSED_CTAS_PER_SM[tokens]  # CTAs at once
        if ctas * split < 0.9 * sms and _can_double_split(split, tokens, ctas, k_blocks, slots):
            if k_blocks // (split * 2) < _FUSED_SECOND_SLOT_MIN_BLOCKS.get(tokens, 0):
                break  # slices too short to pay for the second slot: this tile as it is
            split *= 2
        if ctas * split >= 0.9 * sms:
            break
    tail = ctas % sms if split == 1 and ctas > sms else 0
    if 2 * tail > sms or _FUSED_MAX_SPLIT[tokens] < 2 or k_blocks // 2 < _FUSED_MIN_SLICE_BLOCKS:
        tail = 0
    return tokens, split, tail


# Per GPU index: (SM count, whether dequantize + Hopper GEMM is available, whether
# the code that runs there has thread-block clusters), as plan() takes them.
_devices: dict[int, tuple[int, bool, bool]] = {}
_lock = threading.Lock()


def _device_facts(index: int) -> tuple[int, bool, bool]:
    """SM count of GPU ``index``, whether it runs the Hopper GEMM, and whether its code
    has thread-block clusters (built for sm_90 or newer); NotImplementedError naming the
    GPU and the archs its module declares where the streaming kernel (what every GPU
    runs for small M) does not run."""
    facts = _devices.get(index)
    if facts is not None:
        return facts
    gpu = device_facts(index)
    major, minor = gpu.capability
    if not _STREAM.archs.supports(arch_for_capability(major, minor)):
        raise NotImplementedError(
            f"gptq_marlin_gemm runs on {_STREAM.archs.explain()}; cuda:{index} ({gpu.name}) "
            f"is sm_{major}{minor} (compute capability {major}.{minor})"
        )
    archs = resolve_cuda_archs(index)
    hopper = (major, minor) == (9, 0) and CudaArch(9, 0, "a") in archs
    # The driver runs the newest code not newer than the GPU; clusters need sm_90's.
    runs = max(((a.major, a.minor) for a in archs if (a.major, a.minor) <= (major, minor)),
               default=(0, 0))  # fmt: skip
    facts = (gpu.sm_count, hopper, runs >= (9, 0))
    with _lock:
        _devices[index] = facts
    return facts


class _Call(NamedTuple):
    """How the calls of one kind run: the plan, the module of its path (``fused``,
    ``dequantize`` or ``stream``), the build's zero mode, the type's zero, and the
    sizes its buffers are allocated with (size_m, size_n, size_k, a negative one as 0)."""

    plan: Plan
    module: Any
    zero_mode: int
    bias: int
    shape: tuple[int, int, int]


# Every kind of call that has run: (size_m, size_n, size_k, GPU index, dtype,
# b_q_type_id, zero points given, act-order, is_zp_float) -> _Call. A call finds its
# plan and module in one lookup.
_calls: dict[tuple, _Call] = {}


def _planned(key: tuple, a: torch.Tensor) -> _Call:
    """The _Call of ``key``, made once: the weight type and the build (dtype, zero mode,
    act-order: each a module, so what has none is refused here, before any kernel), then
    the plan, which needs a GPU. The sizes and the tensors are the kernel's to check
    (``marlin_layout.cuh``'s ``check_operands``), before it uses the plan or the buffers:
    sizes it refuses are planned as at least one tile and allocated as empty where
    negative, so that its error, which names the argument, is the one raised."""
    m, n, k, index, dtype, type_id, zeros, act_order, is_zp_float = key
    weight_type = _weight_type(type_id)
    zero_mode = _zero_mode(weight_type, zeros, act_order, is_zp_float)
    # The dtype picks the build (there are fp16 and bf16 ones only).
    if dtype not in _DTYPES:
        raise TypeError(f"argument 'a': expected dtype float16 or bfloat16 but got {dtype}")
    if index < 0:
        op_inputs.check_device("cuda", a=a)
    sms, hopper, clusters = _devices.get(index) or _device_facts(index)
    bits = weight_type.bits
    shape = (max(m, 0), max(n, 0), max(k, 0))
    # The workspace holds a split-K counter per SM at least (the kernel checks that).
    how = plan(
        shape[0], max(n, 64), max(k, 16), sms, hopper, sms, clusters,
        fusable=bits == 4 and not act_order and zero_mode in _FUSED_ZERO_MODES,
        eight_rows=not weight_type.floats and _defers_scales(dtype, bits, act_order),
    )  # fmt: skip
    if how.fused_tokens:
        module = _FUSED[index, dtype, how.fused_tokens, zero_mode]
    elif how.dequant_gemm:
        module = _DEQUANTIZE[index, dtype, bits, act_order]
    else:
        module = _STREAM[index, dtype, bits, how.rows, zero_mode, act_order]
    call = _Call(how, module, zero_mode, weight_type.scalar_type.bias, shape)
    with _lock:
        _calls[key] = call
    return call


def _weight_type(type_id: int) -> WeightType:
    """The weight type of ``b_q_type_id`` (a ValueError listing the supported ones)."""
    weight_type = _WEIGHT_TYPES.get(type_id)
    if weight_type is None:
        names = ", ".join(f"scalar_types.{w.scalar_type}.id" for w in _WEIGHT_TYPES.values())
        raise ValueError(
            f"argument 'b_q_type_id': {type_id} is not a supported weight type; use one of "
            f"{names} (mllm_kernel.cuda.jit.scalar_type)"
        )
    return weight_type


def _zero_mode(weight_type: WeightType, zeros: bool, act_order: bool, is_zp_float: bool) -> int:
    """The zero mode of the build: the type's zero, int or float zero points, fp8 or
    NVFP4."""
    if weight_type.floats:
        # The original's fp8 and NVFP4 builds: no zero points, no act-order.
        if zeros:
            raise ValueError(
                f"argument 'b_zeros': {weight_type.scalar_type} weights take no zero points; "
                "pass None or an empty b_zeros"
            )
        if act_order:
            raise ValueError(
                "argument 'g_idx': act-order (g_idx/perm) is not supported for "
                f"{weight_type.scalar_type} weights; pass None or empty tensors"
            )
        return _ZERO_MODE[weight_type.floats]
    if not weight_type.needs_zeros:
        if zeros:
            raise ValueError(
                f"argument 'b_zeros': {weight_type.scalar_type} weights carry their zero "
                f"({weight_type.scalar_type.bias}); pass an empty b_zeros or use uint4/uint8"
            )
        return _ZERO_MODE["bias"]
    if not zeros:
        raise ValueError(
            f"argument 'b_zeros': {weight_type.scalar_type} weights need zero points; "
            "pass them or use the biased type (uint4b8 / uint8b128)"
        )
    if act_order:
        raise ValueError(
            "argument 'b_zeros': act-order (g_idx/perm) with zero points is not supported; "
            "pass an empty b_zeros (uint4b8 / uint8b128) or no g_idx and perm"
        )
    if not is_zp_float:
        return _ZERO_MODE["int"]
    if weight_type.bits != 4:
        raise ValueError("argument 'is_zp_float': float zero points need uint4 weights")
    return _ZERO_MODE["float"]


@GPTQ_MARLIN_GEMM.kernel("cuda")
def gptq_marlin_gemm(a, c, b_q_weight, b_scales, global_scale, b_zeros, g_idx, perm, workspace,
                     b_q_type_id, size_m, size_n, size_k, is_k_full, use_atomic_add,
                     use_fp32_reduce, is_zp_float):  # fmt: skip
    """needs compute capability 8.0 or newer (NotImplementedError otherwise); on Hopper
    with sm_90a code, :data:`FUSED_MIN_M` <= M < :data:`FUSED_MAX_M` (from
    :data:`FUSED_SPLIT_MIN_M` on the layers whose K it splits in 4 or more) runs the
    fused wgmma kernel for 4-bit integer weights (no act-order, no float zero points), and
    larger M (from :data:`DEQUANT_GEMM_MIN_M` for the other weights, fp8 and NVFP4 among
    them) dequantize + wgmma GEMM.

    >>> from mllm_kernel.cuda.jit.scalar_type import scalar_types
    >>> out = gptq_marlin_gemm(x, None, q, s, None, None, None, None, workspace,
    ...                        scalar_types.uint4b8.id, m, n, k)  # doctest: +SKIP
    """
    # An empty tensor is the original's way of passing none.
    if b_zeros is not None and not b_zeros.numel():
        b_zeros = None
    if g_idx is not None and not g_idx.numel():
        g_idx = None
    if perm is not None and not perm.numel():
        perm = None
    act_order = g_idx is not None or perm is not None
    dtype = a.dtype
    key = (size_m, size_n, size_k, a.get_device(), dtype, b_q_type_id, b_zeros is not None,
           act_order, is_zp_float)  # fmt: skip
    how, module, zero_mode, bias, (rows, cols, depth) = _calls.get(key) or _planned(key, a)
    if c is None:
        c = a.new_empty(size=(rows, cols))
    # Act-order: the kernel first permutes a's columns into Marlin row order, here.
    scratch = torch.empty((rows, depth), dtype=dtype, device=a.device) if act_order else None
    if how.fused_tokens:
        tiles = -(-rows // how.fused_tokens) * -(-cols // _FUSED_COLS)
        body = tiles - how.fused_tail
        # The kernel stores whole rows of tiles with TMA, which needs a 16-byte-aligned c.
        out = c if c.data_ptr() % 16 == 0 else torch.empty_like(c)
        args = (a, b_q_weight, b_scales, b_zeros, workspace, out, size_m, size_n, size_k, bias)
        split = how.fused_split
        partials = None  # where the slices' sums meet, if not in a cluster
        if how.fused_sums_in_memory:
            floats = body * split * _FUSED_PARTIAL_FLOATS[how.fused_tokens]
            partials = a.new_empty(size=(floats,), dtype=torch.float32)
        module.fused(*args, split, 0, body, False, partials)
        if how.fused_tail:
            # The tail's CTAs, split in a cluster of two, start on the SMs the body's
            # last CTAs leave.
            module.fused(*args, 2, body, how.fused_tail, True, None)
        if out is not c:
            c.copy_(out)
        return c
    if how.dequant_gemm:
        weight = torch.empty((cols, depth), dtype=dtype, device=a.device)
        module.dequantize(
            a, b_q_weight, b_scales, b_zeros, global_scale, g_idx, perm, workspace, c, size_m,
            size_n, size_k, is_k_full, zero_mode, bias, scratch, weight,
        )  # fmt: skip
        return run_gemm(a if scratch is None else scratch, weight, c)
    partials = None
    if how.split > 1 and not how.cluster:
        partials = a.new_empty(size=(how.split, rows, cols), dtype=torch.float32)
    # The arguments spelled out: a call with *args builds a list and a tuple first (0.1 us).
    module.stream(
        a, b_q_weight, b_scales, b_zeros, global_scale, g_idx, perm, workspace, c, size_m,
        size_n, size_k, is_k_full, bias, scratch, partials, how.split, how.k_tiles_per_split,
        how.cluster,
    )  # fmt: skip
    return c


__all__ = [
    "DEQUANT_GEMM_MIN_M",
    "FUSED_MAX_M",
    "FUSED_MIN_M",
    "FUSED_SPLIT_MIN_M",
    "Plan",
    "fused_tiling",
    "gptq_marlin_gemm",
    "plan",
]
