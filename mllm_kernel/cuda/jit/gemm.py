"""Dense GEMM (declared in :mod:`mllm_kernel.ops.gemm`): ``a @ b.T`` (+ bias), fp32
accumulation; TMA + wgmma on Hopper, mma.sync elsewhere from sm_80 on.

Which kernels a GPU runs is :func:`mllm_kernel.cuda.device_facts.matmul_path`'s rule
(wgmma on sm_90 with sm_90a code; else the sm_80 kernels of
:mod:`mllm_kernel.cuda.jit.gemm_sm80`, with their own tiles); the choice is remembered
per shape, dtype and GPU with its kernel function, so a call that has run before costs
one dictionary lookup.

One kernel source (``csrc/gemm.cu``, its configurations in
``include/mllm_kernel/cuda/gemm_config.cuh``) compiled per tile configuration; which one
runs is decided per problem shape by :func:`choose_tile`, the one place that knows the
heuristic. Every configuration is registered under the kernel name ``gemm``, so
``python -m mllm_kernel precompile --device cuda --arch 9.0a --kernel gemm`` builds
them all ahead of time. ``tests/test_gemm_constants.py`` checks what :data:`TILES`
assumes of the kernel (tile shapes, k-block bytes, shared memory per split) against
the C++ header.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple, NoReturn

import torch

from mllm_kernel.cuda.device_facts import matmul_path
from mllm_kernel.cuda.jit.gemm_sm80 import Sm80Choice, bind_gemm, choose_sm80_tile
from mllm_kernel.jit_utils import op_inputs
from mllm_kernel.jit_utils.cuda_arch import AMPERE_OR_NEWER, HOPPER_ONLY, CudaArch, parse_arch_list
from mllm_kernel.jit_utils.cuda_driver import require_torch_cuda
from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.ops.gemm import GEMM, named_dtype

_DTYPES = (torch.bfloat16, torch.float16)
_H100_SMS = 132
# A k-block is one 128-byte swizzled row of K (gemm_config.cuh: TileConfig::kTileK).
_K_BLOCK_BYTES = 128
# N and K of 16-bit operands: multiples of 16 bytes (gemm_config.cuh: kTmaAlignBytes).
_ROW_MULTIPLE = 8


@dataclass(frozen=True)
class TileConfig:
    """A compiled kernel shape (the template arguments of ``csrc/gemm.cu``).

    ``consumers`` warpgroups each multiply 64 rows of the P operand by ``tile_q`` rows
    of the Q operand (wgmma m64 x n``tile_q``) through ``stages`` shared-memory
    stages. Without ``swap_ab`` P is ``a`` and Q is ``b``: an output tile is
    ``64 * consumers`` x ``tile_q``. With it P is ``b`` (weights) and Q is ``a``
    (tokens): an output tile is ``tile_q`` tokens x ``64 * consumers`` columns, and up
    to ``max_split`` CTAs of a cluster share its K (its partial sums must fit in shared
    memory beside the stages: tests/test_gemm_constants.py checks that against
    ``gemm_config.cuh``).
    ``multicast`` CTAs of a cluster on neighbouring tile-rows share each Q tile, each
    loading a slice of it for all (TMA multicast): less L2 traffic per flop.
    """

    name: str
    swap_ab: bool
    consumers: int
    tile_q: int
    stages: int
    max_split: int = 1
    multicast: int = 1

    @property
    def tile_m(self) -> int:
        """Output rows per tile."""
        return self.tile_q if self.swap_ab else 64 * self.consumers

    @property
    def tile_n(self) -> int:
        """Output columns per tile."""
        return 64 * self.consumers if self.swap_ab else self.tile_q

    @cached_property
    def shape_args(self) -> tuple[int, int, int, bool, int]:
        """The template arguments after the element type (``int8_scaled_mm`` has none);
        computed once (the hot path reads it on every call)."""
        return (self.consumers, self.tile_q, self.stages, self.swap_ab, self.multicast)

    def template_args(self, dtype: torch.dtype) -> tuple[Any, ...]:
        """The template arguments of ``csrc/gemm.cu``'s ``gemm`` for ``dtype`` operands."""
        return (dtype, *self.shape_args)


TILES = (
    # Multicast over clusters of 2 measured +5% (128 x 256) and +12% (128 x 128) at
    # 8192^3 on an H100 against the same tiles without it (benchmarks/RESULTS.md).
    TileConfig("128x256-mc2", swap_ab=False, consumers=2, tile_q=256, stages=4, multicast=2),
    TileConfig("128x128-mc2", swap_ab=False, consumers=2, tile_q=128, stages=6, multicast=2),
    # Without a multicast cluster for 65-256 tokens, where a cluster's second tile-row
    # is empty or the tiles are too few to fill the SMs: K is split over a cluster then
    # (choose_tile's mid-M rules; a split of 4 ran slower than 2 at every mid-M shape).
    TileConfig("128x128", swap_ab=False, consumers=2, tile_q=128, stages=6, max_split=2),
    # Each swapped tile is followed by its deep-ring twin, taken unsplit where the grid
    # is at most one wave (choose_tile's _deep_ring rule): 16 stages for 16 and 32
    # tokens (160 and 192 KB in flight: one CTA an SM), 12 for 64 (192 KB), 8 for 128
    # (192 KB).
    TileConfig("swap-16x64", swap_ab=True, consumers=1, tile_q=16, stages=8, max_split=8),
    TileConfig("swap-16x64-deep", swap_ab=True, consumers=1, tile_q=16, stages=16),
    TileConfig("swap-32x64", swap_ab=True, consumers=1, tile_q=32, stages=8, max_split=8),
    TileConfig("swap-32x64-deep", swap_ab=True, consumers=1, tile_q=32, stages=16),
    TileConfig("swap-64x64", swap_ab=True, consumers=1, tile_q=64, stages=6, max_split=4),
    TileConfig("swap-64x64-deep", swap_ab=True, consumers=1, tile_q=64, stages=12),
    TileConfig("swap-128x64", swap_ab=True, consumers=1, tile_q=128, stages=6, max_split=2),
    TileConfig("swap-128x64-deep", swap_ab=True, consumers=1, tile_q=128, stages=8),
)
_BY_NAME = {tile.name: tile for tile in TILES}


@dataclass(frozen=True)
class TileChoice:
    """The configuration a problem shape runs with, its split of K, and how many
    tile-rows the persistent walk takes at a time (tiles running together then
    share those rows of A and the columns of B in L2)."""

    tile: TileConfig
    split: int = 1
    group_rows: int = 8

    def __str__(self) -> str:
        return self.tile.name + (f", split-K {self.split}" if self.split > 1 else "")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def choose_tile(
    m: int, n: int, k: int, num_sms: int = _H100_SMS, element_bytes: int = 2
) -> TileChoice:
    """The tile configuration for an ``m x n x k`` problem on ``num_sms`` SMs, with
    operands of ``element_bytes`` (2: bf16/fp16; 1: int8, whose k-blocks of 128 bytes
    hold 128 elements).

    - ``m <= 128`` (decode and small batches) reads far more weight bytes than it
      does arithmetic: the swapped kernels put 64 weight rows on wgmma's fixed
      64-row side and the ``m`` tokens, rounded up to 16/32/64/128, on its narrow
      side. K is split over a cluster while there is at most one CTA per SM, keeping
      at least 8 k-blocks (1 KB of each row) per CTA: on an H100 more and shorter CTAs lost
      bandwidth to pipeline fill and the reduction (M = 1, N = K = 4096: 74% of a
      copy with splits 1 and 2, 57% with 4, 49% with 8; N = 4096, K = 14336: 86, 92,
      80 and 78%). int8 k-blocks go by twice as fast (k32 wgmma at twice the rate),
      and a split needs 32 of them (4 KB of each row) per CTA to pay: H100, N = 4096,
      M = 1 / 16 / 64, K = 4096: 9.8 / 9.9 / 12.5 us unsplit, 10.8 / 10.7 / 13.1 us
      with split 2; K = 14336: 25.4 / 26.1 / 31.4 us unsplit, 24.6 / 25.2 / 28.6 us
      with split 2, 30.1 / 30.4 / 44.5 us with 4 (bench_int8_gemm.py --sweep).
    - Swapped tiles whose unsplit grid is at most one wave (:func:`_deep_ring`): the
      same tile with a deeper ring, unsplit.
    - Larger ``m``: 128 x 256 tiles, the widest wgmma and the fewest bytes per flop,
      unless 128 x 128 tiles fill the SMs' last wave clearly better (small grids);
      both in clusters of 2 CTAs on neighbouring tile-rows that multicast B.
    - Between the two (:func:`_mid_m_tile`), where one family leaves SMs idle, the other
      takes over: measured with ``bench_gemm.py --sweep-mid`` and ``bench_int8_gemm.py
      --sweep-mid`` (every tile choice against cuBLAS, H200).
    """
    if m <= 128:
        tile = next(t for t in TILES if t.swap_ab and t.tile_q >= m)
        choice = _swapped(tile, m, n, k, num_sms, element_bytes)
        if m > 64:
            choice = _mid_m_tile(choice, m, n, k, num_sms, element_bytes)
        return _deep_ring(choice, m, n, num_sms)

    def wave_efficiency(tile: TileConfig) -> float:
        # Clusters of `multicast` CTAs walk the tiles; the last round may run part-full.
        units = _ceil_div(_ceil_div(m, tile.tile_m), tile.multicast) * _ceil_div(n, tile.tile_n)
        slots = num_sms // tile.multicast
        if units == 0:  # N = 0: an empty output, nothing runs
            return 1.0
        return units / (_ceil_div(units, slots) * slots)

    # 128 x 128 tiles ran 1-22% slower than 128 x 256 where both filled their rounds
    # (H100; 4096^3 and 8192^3), and 14% faster at M = 1024, N = 14336, K = 4096, where
    # 128 x 256 leaves a 40%-empty last round (wave efficiency 0.85 against 0.97).
    wide, narrow = _BY_NAME["128x256-mc2"], _BY_NAME["128x128-mc2"]
    plain = TileChoice(narrow if wave_efficiency(narrow) > 1.1 * wave_efficiency(wide) else wide)
    if m > 256:
        return plain
    return _deep_ring(_mid_m_tile(plain, m, n, k, num_sms, element_bytes), m, n, num_sms)


def _swapped(
    tile: TileConfig, m: int, n: int, k: int, num_sms: int, element_bytes: int
) -> TileChoice:
    """``tile`` (a swapped one) with K split over a cluster while there is at most one
    CTA per SM and each CTA keeps enough k-blocks (see :func:`choose_tile`)."""
    tiles = _ceil_div(n, tile.tile_n) * _ceil_div(m, tile.tile_m)
    k_blocks = _ceil_div(k * element_bytes, _K_BLOCK_BYTES)
    min_blocks = 8 if element_bytes == 2 else 32
    split = 1
    while (
        split * 2 <= tile.max_split
        and tiles * split * 2 <= num_sms
        and k_blocks // (split * 2) >= min_blocks
    ):
        split *= 2
    return TileChoice(tile, split)


# Swapped tiles -> (the same tile with a deeper ring, the largest split of the shallow
# tile that the deep one unsplit replaces).
_DEEPER = {
    "swap-16x64": ("swap-16x64-deep", 2),
    "swap-32x64": ("swap-32x64-deep", 2),
    "swap-64x64": ("swap-64x64-deep", 2),
    "swap-128x64": ("swap-128x64-deep", 1),
}


def _deep_ring(choice: TileChoice, m: int, n: int, num_sms: int) -> TileChoice:
    """``choice``, or its tile with the deeper ring unsplit, where that grid is at most
    one CTA an SM and ``choice`` splits K no more than the table allows: as many bytes in
    flight or more on as many SMs or half, and no split to sum. H100, bf16 / int8, us
    (benchmarks/RESULTS.md, session 27, ``bench_gemm_stages.py``):

    - 16 and 32 tokens, 16 stages against 8 (session 28): N = K = 4096, 16 tokens: 14.0
      against 15.3 (split 2) / 8.8 against 9.0 (unsplit); 32 tokens: 14.5 against 16.1
      (split 2) / 9.6 against 9.8; N = 4096, K = 14336 (all split 2), 16 tokens: 41.2
      against 42.3 / 23.0 against 24.1; 32 tokens: 41.8 against 43.1 / 23.4 against
      24.9.
    - 64 tokens, 12 stages against 6: N = K = 4096: 14.8 against 16.6 (split 2) / 9.5
      against 10.4 (unsplit); N = 4096, K = 14336: 43.1 against 44.2 / 24.0 against 25.5
      (both split 2). Two tile-rows of it (int8, 128 tokens, N = K = 4096): 10.5 against
      10.6.
    - 128 tokens, 8 stages against 6, two tile-rows (256 tokens, N = K = 4096): 17.9
      against 19.3 / 12.3 against 12.8. Not where the 6-stage tile splits K in two: 128
      tokens, N = 4096, K = 14336, bf16: 49.4 unsplit against 46.1.

    Where the grid is more than a wave (N = 14336: 224 tiles of 64 tokens) the 6-stage
    tile runs two CTAs an SM and stays."""
    deeper = _DEEPER.get(choice.tile.name)
    if deeper is None:
        return choice
    deep, replaces_split = deeper
    if choice.split > replaces_split or _ctas(TileChoice(choice.tile), m, n) > num_sms:
        return choice
    return TileChoice(_BY_NAME[deep])


def _ctas(choice: TileChoice, m: int, n: int) -> int:
    """CTAs of ``choice``'s grid for an ``m x n`` output (clusters count each CTA)."""
    tile = choice.tile
    return _ceil_div(m, tile.tile_m) * _ceil_div(n, tile.tile_n) * choice.split


def _mid_m_tile(
    choice: TileChoice, m: int, n: int, k: int, num_sms: int, element_bytes: int
) -> TileChoice:
    """``choice`` (what the rules for small or large ``m`` give), or another tile for
    64 < ``m`` <= 256 where ``choice`` leaves at least half the SMs idle or the other
    one was measured faster (H200, ``--sweep-mid``, us):

    - ``m`` in (128, 256]: the plain tiles' grid is small when N is (N = 4096: 32 tiles
      of 128 x 128 per 128 rows). With a long k-loop (96 k-blocks or more), 128 x 128
      tiles with K split in two fill the SMs; otherwise the swapped 128-token tile over
      two tile-rows does, where it fills more than half of them. M = 256, N = 4096,
      K = 14336: bf16 50.0 (split) against 53.7 (swapped), int8 30.0 against 31.1 and
      38.0 for 128 x 128 in clusters of 2; K = 4096: bf16 18.4 (swapped) against 19.6,
      int8 12.5 against 13.8 and 15.0.
    - ``m`` in (64, 128]: where N gives at least half a wave of 128 x 128 tiles, those
      tiles without a cluster (a cluster of two would pair the tile-row with an empty
      one): A is read once per 128 columns instead of once per 64, and both operands
      fill wgmma's 128 rows. bf16 N = 14336 / 28672 (K = 4096 / 8192): 34.6 / 129.4
      against 44.2 / 155.1 for the swapped 128-token tile (cuBLAS 33.7 / 130.7); int8:
      20.4 / 69.5 against 26.8 / 90.8 for 128 x 256 and 31.6 / 96.0 swapped.
    - ``m`` in (64, 128], int8, smaller N: the 128-token swapped tile without a split
      (K = 4096: 32 k-blocks, too few to split) is 64 CTAs at N = 4096; two tile-rows
      of the 64-token tile are 128: 12.2-12.4 against 15.7-15.9.
    """
    half = num_sms // 2
    if m > 128:
        if _ctas(choice, m, n) > half:
            return choice
        split = TileChoice(_BY_NAME["128x128"], 2)
        if _ctas(split, m, n) <= num_sms and _ceil_div(k * element_bytes, _K_BLOCK_BYTES) >= 96:
            return split
        swapped = TileChoice(_BY_NAME["swap-128x64"])
        return swapped if half < _ctas(swapped, m, n) else choice
    plain = TileChoice(_BY_NAME["128x128"])
    if _ctas(plain, m, n) >= half:
        return plain
    if element_bytes != 1:
        return choice
    if _ctas(choice, m, n) <= half:
        narrow = _swapped(_BY_NAME["swap-64x64"], m, n, k, num_sms, element_bytes)
        if _ctas(narrow, m, n) > _ctas(choice, m, n):
            return narrow
    return choice


def _refuse_dtype(dtype: torch.dtype, *shape_args: Any) -> None:
    """The variant check of ``_GEMM``: one module per operand dtype, so a dtype without
    one is refused before a module is looked for (on a memo miss only)."""
    if dtype not in _DTYPES:
        raise TypeError(f"argument 'a': expected dtype bfloat16 or float16 but got {dtype}")


_GEMM = KernelModule(
    "gemm",
    device="cuda",
    sources=["gemm.cu"],
    exports=["gemm"],
    variants=[tile.template_args(dtype) for dtype in _DTYPES for tile in TILES],
    check_variant=_refuse_dtype,
    archs=HOPPER_ONLY,
)


class Plan(NamedTuple):
    """How the calls of one shape on one GPU run: ``bind(choice, index, *variant)`` looks
    their kernel up for GPU ``index`` and returns their launch, with ``choice``, the
    Hopper kernel's tile (``_bind``) or the sm_80 kernel's (``gemm_sm80.bind_gemm``).
    :func:`gemm`'s variant is the operand dtype (its launch: ``launch(out, a, b, bias,
    out_dtype)``); ``int8_scaled_mm`` has none."""

    bind: Any
    choice: TileChoice | Sm80Choice


# A plan's kernel bound to its tile, called with the op's tensors (gemm's: out, a, b, bias,
# out_dtype).
Launch = Callable[..., None]

# (M, N, K, GPU index, operand dtype) -> the launch of its plan, its kernel looked up
# once: a call that has run before costs one dictionary lookup.
_plans: dict[tuple[int, int, int, int, torch.dtype], Launch] = {}
_lock = threading.Lock()


def plan_for(m: int, n: int, k: int, wgmma: bool, num_sms: int) -> Plan:
    """The kernel and tile of an ``m x n x k`` product on a GPU of ``num_sms`` SMs that
    runs the wgmma kernels (``wgmma``) or the sm_80 ones."""
    if wgmma:
        return Plan(_bind, choose_tile(m, n, k, num_sms))
    return Plan(bind_gemm, choose_sm80_tile(m, n, k, num_sms))


def _plan(m: int, n: int, k: int, index: int) -> Plan:
    """:func:`plan_for` GPU ``index`` (NotImplementedError below sm_80)."""
    path = matmul_path(index, "gemm")
    return plan_for(m, n, k, path.wgmma, path.facts.sm_count)


def _planned(key: tuple[int, int, int, int, torch.dtype]) -> Launch:
    """The launch of ``key``'s plan, made once (on the first call of a shape)."""
    m, n, k, index, dtype = key
    bind, choice = _plan(m, n, k, index)
    launch = bind(choice, index, dtype)
    with _lock:
        _plans[key] = launch
    return launch


def not_matrices(**operands: tuple[torch.Tensor, str]) -> NoReturn:
    """ValueError naming the first of ``operands`` (name=(tensor, expected shape)) that
    is not 2-D. The tile is chosen from M, N and K, read off the shapes before the
    kernel checks them, so their ranks are checked first, here: the ops call this where
    unpacking ``a.shape`` and ``b.shape`` into those sizes failed, and this error
    replaces that one (``from None``), which tells nothing more.

    >>> not_matrices(a=(torch.ones(3), "[M, K]"))
    Traceback (most recent call last):
    ValueError: argument 'a': expected a 2-D tensor [M, K] but got shape [3]
    """
    arg, (value, shape) = next((arg, o) for arg, o in operands.items() if o[0].dim() != 2)
    raise ValueError(
        f"argument '{arg}': expected a 2-D tensor {shape} but got shape {list(value.shape)}"
    ) from None


def _bind(choice: TileChoice, index: int, dtype: torch.dtype) -> Launch:
    """``launch(out, a, b, bias, out_dtype)``: ``choice``'s kernel for ``dtype`` operands on
    GPU ``index``, looked up here, once: ``out = a @ b.T (+ bias)`` in ``out_dtype``; the
    C++ entry point checks every tensor."""
    kernel = _GEMM[(index, dtype, *choice.tile.shape_args)].gemm
    split, group_rows = choice.split, choice.group_rows

    def launch(out, a, b, bias, out_dtype):
        kernel(out, a, b, bias, out_dtype, split, group_rows)

    return launch


def _launch(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    bias: torch.Tensor | None,
    choice: TileChoice,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``choice``'s kernel on ``a``'s GPU (:func:`_bind`): ``out = a @ b.T (+ bias)``,
    ``out`` in ``out_dtype`` (default: ``out``'s dtype), returned: a tile of the caller's
    choosing, for tests and benchmarks."""
    _bind(choice, a.get_device(), a.dtype)(
        out, a, b, bias, out.dtype if out_dtype is None else out_dtype
    )
    return out


def run_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The GEMM kernel and tile :func:`plan_for` picks for this shape, dtype and GPU
    (remembered): ``out = a @ b.T (+ bias)`` in ``out_dtype`` (default:
    ``out``'s dtype), returned.

    For ops built on the GEMM (``gptq_marlin_gemm``'s dequantize path): ``a`` and ``b``
    must already be 2-D torch tensors (no conversion, no grad refusal, no
    explanation of a CPU tensor: :func:`gemm` does those); the C++ entry point checks
    dtypes, shapes, devices, strides and overlaps as for :func:`gemm`.

    >>> run_gemm(a, dequantized_weight, c)  # doctest: +SKIP
    """
    m, k = a.shape
    key = (m, b.shape[0], k, a.get_device(), a.dtype)
    launch = _plans.get(key) or _planned(key)
    launch(out, a, b, bias, out.dtype if out_dtype is None else out_dtype)
    return out


@GEMM.kernel("cuda")
def gemm(a, b, out, bias, out_dtype):
    """GPUs of compute capability 8.0 and newer (NotImplementedError on an older one):
    wgmma on Hopper with sm_90a code, mma.sync elsewhere; on torch's current stream of
    ``a``'s GPU.

    >>> a = torch.randn(16, 4096, dtype=torch.bfloat16, device="cuda")
    >>> w = torch.randn(14336, 4096, dtype=torch.bfloat16, device="cuda")
    >>> gemm(a, w).shape
    torch.Size([16, 14336])
    """
    try:  # unpacking the sizes the plan is chosen from checks their ranks
        (m, k), (n, _) = a.shape, b.shape
    except ValueError:
        not_matrices(a=(a, "[M, K]"), b=(b, "[N, K]"))
    # run_gemm's lookup, inline: the decode call's path, a Python call shorter.
    dtype = a.dtype
    key = (m, n, k, a.get_device(), dtype)
    launch = _plans.get(key) or _planned(key)
    if out_dtype is None:
        out_dtype = dtype
    if out is None:
        out = a.new_empty(size=(m, n), dtype=out_dtype)
    launch(out, a, b, bias, out_dtype)
    return out


_A100_SMS = 108


def _target_arch(arch: str) -> CudaArch:
    """``arch`` (``"sm90"``, ``"sm_80"``, ``"8.9"``, ``"90a"``) as a CudaArch;
    NotImplementedError for one the GEMM does not run on."""
    text = str(arch).strip().lower()
    text = text.removeprefix("sm_").removeprefix("sm")
    parsed = parse_arch_list(text)
    target = parsed[0]
    if len(parsed) != 1 or not AMPERE_OR_NEWER.supports(target):
        raise NotImplementedError(
            f"Gemm runs on {AMPERE_OR_NEWER.describe()} (the wgmma kernels on "
            f"{HOPPER_ONLY.describe()}), got arch={arch!r}"
        )
    return target


class Gemm:
    """A GEMM of one problem shape, ``[M, K] @ [N, K]^T``, with its tile chosen once.

    For users of the CuTe runtime's object API: build it once per shape, call it
    many times. It runs the same kernel as :func:`gemm`; ``tile_config`` reports the
    configuration picked for this shape and the current GPU (where none is visible, for
    ``arch``: the wgmma kernels for sm_90, the sm_80 kernels for the others). Called on
    a GPU that runs the other kernels, it raises ValueError.

    NumPy arrays are accepted for ``a`` and ``b``: they are copied to the current
    GPU in ``dtype``, and the result comes back as a NumPy array (float32 for a
    bf16 result, which NumPy cannot hold).

    >>> op = Gemm(16, 14336, 4096)
    >>> op.tile_config  # doctest: +SKIP
    TileChoice(tile=TileConfig(name='swap-16x64', ...), split=1)
    >>> op(a, w).shape  # doctest: +SKIP
    torch.Size([16, 14336])
    """

    def __init__(
        self,
        M: int,
        N: int,
        K: int,
        dtype: str | torch.dtype = "bfloat16",
        out_dtype: str | torch.dtype | None = None,
        arch: str = "sm90",
    ) -> None:
        for arg, value in (("M", M), ("N", N), ("K", K)):
            if type(value) is not int or value < 0:
                raise ValueError(f"argument '{arg}': expected a non-negative int, got {value!r}")
        if N % _ROW_MULTIPLE or K % _ROW_MULTIPLE:
            raise ValueError(
                f"N ({N}) and K ({K}) must be multiples of {_ROW_MULTIPLE} (16-byte rows for TMA)"
            )
        target = _target_arch(arch)
        self.M, self.N, self.K = M, N, K
        self.dtype = named_dtype(dtype, "dtype")
        if self.dtype not in _DTYPES:
            raise TypeError(f"argument 'dtype': expected bfloat16 or float16, got {self.dtype}")
        self.out_dtype = self.dtype if out_dtype is None else named_dtype(out_dtype, "out_dtype")
        if self.out_dtype not in (self.dtype, torch.float32):
            raise TypeError(
                f"argument 'out_dtype': expected {self.dtype} or float32, got {self.out_dtype}"
            )
        if torch.cuda.is_available():
            path = matmul_path(torch.cuda.current_device(), "gemm")
            self.wgmma, self.num_sms = path.wgmma, path.facts.sm_count
        else:
            self.wgmma = (target.major, target.minor) == (9, 0)
            self.num_sms = _H100_SMS if self.wgmma else _A100_SMS
        self._plan = plan_for(M, N, K, self.wgmma, self.num_sms)
        self.tile_config = self._plan.choice

    @staticmethod
    def choose_tile(M: int, N: int, K: int, num_sms: int = _H100_SMS) -> TileChoice:
        """The configuration an ``M x N x K`` problem runs with (see :func:`choose_tile`)."""
        return choose_tile(M, N, K, num_sms)

    def __call__(
        self,
        a: Any,
        b: Any,
        out: torch.Tensor | None = None,
        *,
        bias: torch.Tensor | None = None,
    ) -> Any:
        """``a @ b.T (+ bias)`` with this object's tile, into ``out`` if given (in
        ``out_dtype``); NumPy in, NumPy out."""
        from_numpy = not isinstance(a, torch.Tensor)
        a, b = self._on_gpu(a, "a"), self._on_gpu(b, "b")
        # The tile was chosen for this object's M, N and K: another shape is refused here,
        # where that choice was made (the kernel checks the rest).
        for arg, value, shape in (("a", a, (self.M, self.K)), ("b", b, (self.N, self.K))):
            if tuple(value.shape) != shape:
                raise ValueError(
                    f"expected {arg} of shape {list(shape)} (this Gemm's M, N, K) but got "
                    f"{list(value.shape)}"
                )
        bias = op_inputs.optional_tensor(bias, "bias")
        out = None if out is None else op_inputs.output(out, "out")
        try:
            self._check_path(a.get_device())
            if out is None:
                out = a.new_empty(size=(self.M, self.N), dtype=self.out_dtype)
            launch = self._plan.bind(self.tile_config, a.get_device(), a.dtype)
            launch(out, a, b, bias, self.out_dtype)
        except Exception as error:
            op_inputs.explain(error, "cuda", a=a, b=b, out=out, bias=bias)
            raise
        if not from_numpy:
            return out
        if out.dtype == torch.bfloat16:
            out = out.float()
        return out.cpu().numpy()

    def _check_path(self, index: int) -> None:
        """ValueError unless GPU ``index`` runs the kernels this object's tile is for."""
        if index >= 0 and matmul_path(index, "gemm").wgmma != self.wgmma:
            kernels = {True: "wgmma", False: "sm_80 (mma.sync)"}
            raise ValueError(
                f"this Gemm's tile ({self.tile_config}) is for the {kernels[self.wgmma]} "
                f"kernels, but cuda:{index} runs the {kernels[not self.wgmma]} ones: build "
                "the Gemm with that GPU current"
            )

    def _on_gpu(self, value: Any, arg: str) -> torch.Tensor:
        if isinstance(value, torch.Tensor):
            return op_inputs.tensor(value, arg)
        import numpy as np

        if not isinstance(value, np.ndarray):
            raise TypeError(
                f"argument '{arg}': expected a torch.Tensor or numpy.ndarray, got "
                f"{type(value).__name__}"
            )
        require_torch_cuda("Gemm with NumPy arrays (copied to the GPU)")
        return torch.from_numpy(np.ascontiguousarray(value)).to("cuda", self.dtype)

    def __repr__(self) -> str:
        return (
            f"Gemm(M={self.M}, N={self.N}, K={self.K}, dtype={self.dtype}, "
            f"out_dtype={self.out_dtype}, tile={self.tile_config})"
        )
